"""Keys every S3 store refuses, caught at ``open(..., "wb")`` before any byte is acknowledged."""

from __future__ import annotations

MAX_KEY_BYTES = 1024  # S3's limit on a key's UTF-8 encoding (RGW, MinIO and COS agree)


def check_writable_key(path: str, key: str) -> None:
    """Raise ``ValueError`` naming the problem when no S3 store would accept ``key``."""
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"cannot write {path!r}: the key is not valid UTF-8 (it holds a lone surrogate)"
        ) from None
    if len(encoded) > MAX_KEY_BYTES:
        raise ValueError(
            f"cannot write {path[:80]!r}...: the key is {len(encoded)} bytes of UTF-8, "
            f"over the store's limit of {MAX_KEY_BYTES}"
        )
