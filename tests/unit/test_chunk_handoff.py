"""Chunks handed from a fetch to its sequential reader: the very objects fetched, always right."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.store.memory import MemoryStream

MiB = 1024 * 1024


class PacedStream:
    """A stream slower than its reader, recording every bytes object it returns."""

    def __init__(self, inner: MemoryStream, produced: list[bytes], delay: float) -> None:
        self.info, self.start, self.end = inner.info, inner.start, inner.end
        self._inner, self._produced, self._delay = inner, produced, delay

    def read(self, amount: int) -> bytes:
        time.sleep(self._delay)
        data = self._inner.read(amount)
        self._produced.append(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        time.sleep(self._delay)
        return self._inner.readinto(buffer)

    def close(self) -> None:
        self._inner.close()


class PacedStore(MemoryStore):
    def __init__(self, delay: float = 0.01) -> None:
        super().__init__(["b"])
        self.produced: list[bytes] = []
        self.delay = delay

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> Any:
        inner = super().open_range(bucket, key, start, end, if_match)
        return PacedStream(inner, self.produced, self.delay)


def _seeded(
    tmp_path: Path, size: int, delay: float = 0.01
) -> tuple[PacedStore, bytes, TierCacheFileSystem]:
    """A paced store holding ``b/k`` (``size`` random bytes) and a filesystem over it."""
    store = PacedStore(delay)
    data = random.randbytes(size)
    store.put_bytes("b", "k", data)
    fs = TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / "t"),
        consistency="immutable",
        fetch_concurrency=1,
        skip_instance_cache=True,
    )
    return store, data, fs


def test_a_sequential_reader_gets_the_fetched_objects_themselves(tmp_path: Path) -> None:
    store, data, fs = _seeded(tmp_path, 8 * MiB)
    with fs.open("b/k", "rb") as f:
        chunks = []
        while chunk := f.read(MiB):
            chunks.append(chunk)
    assert b"".join(chunks) == data
    handed = [c for c in chunks if any(c is p for p in store.produced)]
    # The first read may come from the file (the fetch started before the reader asked).
    assert len(handed) >= len(chunks) - 2, f"{len(handed)} of {len(chunks)} handed over"
    fs.wait_fetches()
    assert fs.is_cached("b/k")
    assert fs.cat_file("b/k") == data  # the tier file holds every byte handed over


def test_reads_of_any_size_and_seeks_return_the_right_bytes(tmp_path: Path) -> None:
    _, data, fs = _seeded(tmp_path, 12 * MiB + 12345, 0.002)
    rng = random.Random(7)
    with fs.open("b/k", "rb") as f:
        for _ in range(60):
            if rng.random() < 0.2:
                f.seek(rng.randrange(len(data)))
            pos = f.tell()
            size = rng.choice([1, 4096, 512 * 1024, MiB, MiB + 1, 3 * MiB, 40 * MiB])
            assert f.read(size) == data[pos : pos + size]
        f.seek(0)
        assert f.read() == data


def test_readers_sharing_one_fetch_each_get_their_own_bytes(tmp_path: Path) -> None:
    _, data, fs = _seeded(tmp_path, 10 * MiB, 0.005)
    results: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def read_all(size: int) -> None:
        try:
            with fs.open("b/k", "rb") as f:
                parts = []
                while part := f.read(size):
                    parts.append(part)
            results[size] = b"".join(parts)
        except BaseException as exc:  # reported below, with the size that failed
            errors.append(exc)

    threads = [threading.Thread(target=read_all, args=(s,)) for s in (MiB, 2 * MiB, 700_001)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert results == {MiB: data, 2 * MiB: data, 700_001: data}


def test_a_reader_that_leaves_early_lets_the_fetch_finish_alone(tmp_path: Path) -> None:
    _, data, fs = _seeded(tmp_path, 6 * MiB)
    with fs.open("b/k", "rb") as f:
        assert f.read(MiB) == data[:MiB]
        assert f.read(MiB) == data[MiB : 2 * MiB]
        fetch = f._fetch
    assert fetch is not None
    # Detached: the download reads any size again and keeps nothing for a reader.
    assert fetch.next_read(3 * MiB) == 0
    fs.wait_fetches()
    assert fs.is_cached("b/k")
    assert fs.cat_file("b/k") == data
