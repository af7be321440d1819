"""Writes of 1 MiB or more are hashed on a helper thread while their bytes are written: the
digest a staged file journals is still exactly xxh3 of the bytes written, in order, whatever
the write sizes, a buffer reused after ``write`` returns, or a fork."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import xxhash

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.digest import HASH_BESIDE_AT

MiB = 1024 * 1024


def _digest_of_writes(tmp_path: Path, chunks: list[bytes | bytearray]) -> str:
    """Write ``chunks`` to a staged file and return the digest its close() hands on."""
    fs = TierCacheFileSystem(
        store=MemoryStore(buckets=("b",)),
        local_dir=str(tmp_path / "tier"),
        skip_instance_cache=True,
        upload_while_writing="off",
    )
    seen: list[str] = []
    f: Any = fs.open("b/k", "wb")
    commit = f._commit

    def capture(staged: Any) -> Any:
        seen.append(staged.digest)
        return commit(staged)

    f._commit = capture
    with f:
        for chunk in chunks:
            assert f.write(chunk) == len(chunk)
            if isinstance(chunk, bytearray):
                chunk[:] = b"\0" * len(chunk)  # the caller reuses its buffer at once
    fs.flush(timeout=60)
    (digest,) = seen
    return digest


def test_mixed_write_sizes_give_the_digest_of_the_bytes(tmp_path: Path) -> None:
    sizes = [10, HASH_BESIDE_AT, 3, 8 * MiB + 1, HASH_BESIDE_AT - 1, 2 * MiB, 0, 5]
    chunks = [os.urandom(n) for n in sizes]
    expected = xxhash.xxh3_64(b"".join(chunks)).hexdigest()
    assert _digest_of_writes(tmp_path, list(chunks)) == expected


def test_a_buffer_reused_after_write_returns_does_not_change_the_digest(tmp_path: Path) -> None:
    chunks = [bytearray(os.urandom(4 * MiB)) for _ in range(3)]
    expected = xxhash.xxh3_64(b"".join(bytes(c) for c in chunks)).hexdigest()
    assert _digest_of_writes(tmp_path, list(chunks)) == expected


def test_a_forked_child_hashes_large_writes_too(tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    assert _digest_of_writes(tmp_path / "parent", [data]) == xxhash.xxh3_64(data).hexdigest()
    pid = os.fork()  # the parent's helper threads do not exist in the child
    if pid == 0:  # pragma: no cover - the child never returns
        code = 1
        try:
            got = _digest_of_writes(tmp_path / "child", [data, data])
            code = 0 if got == xxhash.xxh3_64(data + data).hexdigest() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
