"""Eviction by next use: a known read order keeps what is read soonest, within every guarantee."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.store.memory import MemoryStream

KiB = 1024
SIZE = 32 * KiB


class HeldUploads(MemoryStore):
    """Uploads wait until released: what is written behind stays dirty meanwhile."""

    def __init__(self) -> None:
        super().__init__(["b"])
        self.released = threading.Event()

    def upload_file(self, *args: Any, **kwargs: Any) -> Any:
        self.released.wait(60)
        return super().upload_file(*args, **kwargs)


class LoggingStore(MemoryStore):
    """A memory store that logs the key of every GET."""

    def __init__(self) -> None:
        super().__init__(["b"])
        self.gets: list[str] = []
        self._log_lock = threading.Lock()

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> MemoryStream:
        with self._log_lock:
            self.gets.append(key)
        return super().open_range(bucket, key, start, end, if_match)


def _fs(tmp_path: Path, store: MemoryStore, budget: int, **options: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / "tier"),
        local_max_bytes=budget,
        consistency="immutable",
        skip_instance_cache=True,
        **options,
    )


def _put(store: MemoryStore, names: list[str], size: int = SIZE) -> dict[str, bytes]:
    blobs = {f"b/{name}": os.urandom(size) for name in names}
    for path, blob in blobs.items():
        store.put_bytes("b", path[2:], blob)
    return blobs


def _warm(fs: TierCacheFileSystem, paths: list[str]) -> None:
    for path in paths:
        fs.cat_file(path)
        fs.wait_fetches()
        time.sleep(0.01)  # distinct access times: the LRU order is the order read


def _until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _three_shuffled_epochs(tmp_path: Path, seed: int) -> float:
    """Three seeded shuffles of 24 objects through a tier that holds half of them; the
    bytes fetched, in datasets."""
    store = MemoryStore(["b"])
    blobs = _put(store, [f"s{i:02d}" for i in range(24)])
    dataset = len(blobs) * SIZE
    fs = _fs(tmp_path, store, dataset // 2)
    rng = random.Random(seed)
    order = [path for _ in range(3) for path in rng.sample(list(blobs), len(blobs))]
    with fs.read_ahead(order):
        for path in order:
            with fs.open(path, "rb") as f:
                assert f.read() == blobs[path]
    fs.wait_fetches()
    stats = fs.stats()
    assert stats["bytes_read"] == 3 * dataset
    assert stats["evictions_by_next_use"] > 0
    assert stats["bytes_evicted_by_next_use"] == stats["evictions_by_next_use"] * SIZE
    assert stats["evictions"] >= stats["evictions_by_next_use"]  # every eviction counts
    assert stats["bytes_evicted"] == stats["evictions"] * SIZE
    assert stats["bytes_kept_by_next_use"] == stats["kept_by_next_use"] * SIZE
    assert fs.tier.next_use is not None
    assert os.listdir(fs.tier.next_use.dir) == []  # the order's hint file went with it
    return float(stats["bytes_fetched"]) / dataset


def test_three_shuffled_epochs_over_twice_the_budget_fetch_near_min(tmp_path: Path) -> None:
    # LRU fetched 2.45-2.75x the dataset here; MIN with this budget about 2.1x. Which
    # prefetch thread makes room first varies from run to run (a run over one seed ranged
    # 2.0-2.5x), so the bound is on the mean over six seeds; no run may be as bad as LRU.
    ratios = [_three_shuffled_epochs(tmp_path / str(seed), seed) for seed in range(6)]
    assert sum(ratios) / len(ratios) <= 2.2, ratios
    assert max(ratios) <= 2.5, ratios


def test_the_entry_read_furthest_ahead_goes_not_the_least_recent(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    _put(store, ["a", "b", "c", "d", "e", "f"])
    fs = _fs(tmp_path, store, 10 * SIZE)
    _warm(fs, ["b/a", "b/b", "b/c", "b/d", "b/e", "b/f"])
    # a is read next, c last, d after the order's end; e and f in no order (f the newest).
    with fs.read_ahead(["b/a", "b/b", "b/c"], k=0) as ahead:
        ahead.expect_after(["b/d"])
        assert fs.evict(4 * SIZE).removed_bytes == 2 * SIZE  # no order: e, f (LRU first)
        assert not fs.is_cached("b/e") and not fs.is_cached("b/f")
        fs.evict(3 * SIZE)
        assert not fs.is_cached("b/d")  # read furthest ahead
        fs.cat_file("b/a")
        fs.cat_file("b/b")  # the reader moves on: a is not read again
        fs.evict(2 * SIZE)
        assert [fs.is_cached(f"b/{n}") for n in "abc"] == [False, True, True]
        assert fs.stats()["evictions_by_next_use"] == 4
    fs.evict(SIZE)  # no order any more: least recently used first
    assert [fs.is_cached(f"b/{n}") for n in "bc"] == [True, False]


def test_pinned_kept_open_protected_fetching_and_dirty_entries_stay(tmp_path: Path) -> None:
    store = HeldUploads()
    names = ["a", "b", "c", "d", "e", "f", "g", "h"]
    blobs = _put(store, names)
    fs = _fs(tmp_path, store, 20 * SIZE)
    _warm(fs, [f"b/{n}" for n in names if n != "c"])
    with fs.open("b/c", "wb") as f:  # written behind, its upload held: dirty
        f.write(blobs["b/c"])
    engine = fs._runtime.prefetch
    fs.pin("b/h")
    fs.tier.keep = lambda meta: meta.source.endswith("/g")  # as the newest checkpoint's files
    protected = fs.read_path.entry_id("b", "e")
    fetching = fs.read_path.entry_id("b", "d")
    # Read in this order: h is read furthest ahead, then g, f, e, d, c, eviction's first
    # choices, and all of them must stay.
    with (
        fs.read_ahead([f"b/{n}" for n in names], k=0),
        fs.open("b/f", "rb") as held,
        fs.tier.entry_lock(fetching, timeout=5),
    ):
        engine.next_use.protect(protected)
        try:
            report = fs.evict(0)
        finally:
            engine.next_use.unprotect(protected)
        assert (report.kept_pinned, report.kept_busy) == (1, 5)
        assert [fs.is_cached(f"b/{n}") for n in names] == [False] * 2 + [True] * 6
        assert held.read() == blobs["b/f"]
    store.released.set()
    fs.unpin("b/h")


def test_prefetch_waits_rather_than_evict_what_min_would_keep(tmp_path: Path) -> None:
    # p is read now and never again; a and b later. Bringing y while p is open would take a
    # or b (the next uses LRU or plain furthest-first allow), fetched again later: y waits
    # for p to close, then p goes.
    store = LoggingStore()
    blobs = _put(store, ["p", "y", "a", "b"])
    fs = _fs(tmp_path, store, 3 * SIZE, low_watermark=1.0)
    _warm(fs, ["b/p", "b/a", "b/b"])
    engine = fs._runtime.prefetch
    with fs.read_ahead(["b/p", "b/y", "b/a", "b/b"], k=1):
        with fs.open("b/p", "rb") as f:
            assert f.read() == blobs["b/p"]
            # Until the prefetcher has held y back, or brought it (evicting a or b).
            _until(lambda: engine._held is not None or "y" in store.gets)
            assert "y" not in store.gets
            assert fs.is_cached("b/a") and fs.is_cached("b/b")
        for path in ["b/y", "b/a", "b/b"]:
            assert fs.cat_file(path) == blobs[path]
    fs.wait_fetches()
    assert sorted(store.gets) == ["a", "b", "p", "y"]  # each fetched once
    assert not fs.is_cached("b/p")


def test_settled_prefetch_leaves_nothing_protected(tmp_path: Path, monkeypatch: Any) -> None:
    """Once ``wait_fetches`` returns, no prefetched entry is kept from eviction: a worker lets
    go of its protection before its object counts as settled, not after (an unprotect slowed
    here stands for a worker thread descheduled at that moment)."""
    store = MemoryStore(["b"])
    paths = [f"b/s{i:02d}" for i in range(4)]
    for path in paths:
        store.put_bytes("b", path[2:], os.urandom(SIZE))
    fs = TierCacheFileSystem(
        store=store, local_dir=str(tmp_path / "tier"), skip_instance_cache=True
    )
    next_use = fs._runtime.prefetch.next_use
    unprotect = next_use.unprotect

    def slow_unprotect(entry_id: str) -> None:
        time.sleep(0.3)
        unprotect(entry_id)

    monkeypatch.setattr(next_use, "unprotect", slow_unprotect)
    fs.cat(paths)
    fs.wait_fetches()
    assert fs.stats()["prefetched"] >= 1
    report = fs.evict(0)
    assert report.kept_busy == 0
    assert not any(fs.is_cached(p) for p in paths)
