"""Progressive reads, retries of broken streams, and fork safety, with an in-memory store."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tiercache import MemoryStore, StoreUnavailableError, TierCacheFileSystem
from tiercache.store.memory import MemoryStream
from tiercache.store.retry import RetryableError

MiB = 1024 * 1024


class GatedStore(MemoryStore):
    """Serves the first part at once and holds later parts until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(["b"])
        self.gate = threading.Event()

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> MemoryStream:
        if start > 0:
            assert self.gate.wait(10)
        return super().open_range(bucket, key, start, end, if_match)


class FlakyStream:
    """Breaks after ``limit`` bytes, like a connection reset mid-body."""

    def __init__(self, inner: MemoryStream, limit: int) -> None:
        self.info, self.start, self.end = inner.info, inner.start, inner.end
        self._inner, self._left = inner, limit

    def read(self, amount: int) -> bytes:
        if self._left <= 0:
            raise RetryableError("connection reset by peer")
        data = self._inner.read(min(amount, self._left))
        self._left -= len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()


class FlakyStore(MemoryStore):
    """Every stream breaks after ``limit`` bytes, ``failures`` times in all."""

    def __init__(self, limit: int, failures: int) -> None:
        super().__init__(["b"])
        self.limit, self.failures = limit, failures

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> Any:
        stream = super().open_range(bucket, key, start, end, if_match)
        if self.failures > 0:
            self.failures -= 1
            return FlakyStream(stream, self.limit)
        return stream


def _fs(tmp_path: Path, store: MemoryStore, **options: Any) -> TierCacheFileSystem:
    options.setdefault("part_size", 5 * MiB)
    options.setdefault("range_size", 5 * MiB)
    return TierCacheFileSystem(
        store=store, local_dir=str(tmp_path / "t"), skip_instance_cache=True, **options
    )


def test_reader_gets_first_bytes_before_the_fetch_completes(tmp_path: Path) -> None:
    store = GatedStore()
    data = os.urandom(12 * MiB)
    store.put_bytes("b", "big", data)
    fs = _fs(tmp_path, store, fetch_concurrency=2)
    with fs.open("b/big") as f:
        assert f.read(MiB) == data[:MiB]  # served while later parts are held back
        assert not fs.is_cached("b/big")
        store.gate.set()
        assert f.read() == data[MiB:]


class StallingStream(FlakyStream):
    """Sends ``first`` bytes, then nothing until ``gate`` is set (a link that stalls)."""

    def __init__(self, inner: MemoryStream, first: int, gate: threading.Event) -> None:
        super().__init__(inner, first)
        self._first, self._gate = first, gate

    def read(self, amount: int) -> bytes:
        if self._first <= 0:
            assert self._gate.wait(10)
        data = self._inner.read(min(amount, self._first) if self._first > 0 else amount)
        self._first -= len(data)
        return data


class StallingStore(MemoryStore):
    def __init__(self, first: int) -> None:
        super().__init__(["b"])
        self.first = first
        self.gate = threading.Event()

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> Any:
        return StallingStream(
            super().open_range(bucket, key, start, end, if_match), self.first, self.gate
        )


def test_a_reader_gets_bytes_that_arrived_while_the_rest_of_their_chunk_stalls(
    tmp_path: Path,
) -> None:
    """The fetch writes the tier in whole chunks, but never keeps a waiting reader's bytes."""
    store = StallingStore(first=48 * 1024)
    data = os.urandom(3 * MiB)
    store.put_bytes("b", "obj", data)
    fs = _fs(tmp_path, store, fetch_concurrency=1)
    got: list[bytes] = []
    with fs.open("b/obj", block_size=0) as f:
        reader = threading.Thread(target=lambda: got.append(f.read(4096)))
        reader.start()
        reader.join(5)
        stalled = reader.is_alive()
        store.gate.set()
        reader.join(10)
        assert not stalled, "the reader waited for bytes the fetch had received"
        assert got == [data[:4096]]
        assert f.read() == data[4096:]


def test_broken_streams_resume_where_they_stopped(tmp_path: Path) -> None:
    store = FlakyStore(limit=MiB + 123, failures=3)
    data = os.urandom(11 * MiB)
    store.put_bytes("b", "k", data)
    fs = _fs(tmp_path, store, fetch_concurrency=2, retries=5)
    assert fs.cat_file("b/k") == data
    gets = store.request_counts()["GetObject"]
    assert gets == 3 + 3  # three parts, three resumed streams
    fs.wait_fetches()
    entry = fs.read_path.cached("b", "k")
    assert entry is not None and entry.meta.size == len(data)


def test_retries_are_bounded(tmp_path: Path) -> None:
    store = FlakyStore(limit=1000, failures=100)
    store.put_bytes("b", "k", os.urandom(MiB))
    fs = _fs(tmp_path, store, retries=3)
    with pytest.raises(StoreUnavailableError, match="after 3 attempts"):
        fs.cat_file("b/k")
    assert not fs.is_cached("b/k")
    paths = fs.tier.paths(fs.read_path.entry_id("b", "k"))
    assert not os.path.exists(paths.part)  # the failed fetch left no partial file behind
    assert fs.tier.usage(fresh=True) == 0


def test_object_changed_mid_fetch_fails_instead_of_mixing_versions(tmp_path: Path) -> None:
    store = GatedStore()
    store.put_bytes("b", "k", os.urandom(12 * MiB))
    fs = _fs(tmp_path, store, fetch_concurrency=2)
    with fs.open("b/k") as f:
        f.read(10)
        store.put_bytes("b", "k", os.urandom(12 * MiB))  # a new version, a new ETag
        store.gate.set()
        with pytest.raises(OSError, match="changed"):
            f.read()
    assert not fs.is_cached("b/k")


def test_forked_child_reads_through_the_same_tier(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    store.put_bytes("b", "k", b"from parent")
    store.put_bytes("b", "j", b"from child")
    fs = _fs(tmp_path, store)
    assert fs.cat("b/k") == b"from parent"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            ok = fs.cat("b/j") == b"from child" and fs.cat("b/k") == b"from parent"
            os.write(write_end, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    assert os.read(read_end, 1) == b"1"
    os.waitpid(pid, 0)
