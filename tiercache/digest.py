"""xxh3 digests of whole files: the integrity check of cache entries and uploads."""

from __future__ import annotations

import os

import xxhash

_CHUNK = 8 << 20


def xxh3_file(path: str) -> tuple[int, str]:
    """Size and xxh3-64 hex digest of a file (never following a symlink)."""
    hasher = xxhash.xxh3_64()
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while chunk := os.read(fd, _CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return size, hasher.hexdigest()
