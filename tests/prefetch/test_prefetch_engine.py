"""The prefetch engine on the in-memory store: priority, cancel, errors, read-ahead, the window."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiercache import ConfigError, MemoryStore, TierCacheFileSystem
from tiercache.store.memory import MemoryStream

KiB = 1024


class GatedStore(MemoryStore):
    """A memory store whose GETs wait for ``gate`` and are logged in arrival order."""

    def __init__(self) -> None:
        super().__init__(["b"])
        self.gate = threading.Event()
        self.gate.set()
        self.gets: list[str] = []
        self._log_lock = threading.Lock()

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> MemoryStream:
        with self._log_lock:
            self.gets.append(key)
        assert self.gate.wait(30), "the test never opened the gate"
        return super().open_range(bucket, key, start, end, if_match)


def _fs(tmp_path: Path, store: MemoryStore, **options: Any) -> TierCacheFileSystem:
    options.setdefault("local_max_bytes", 1000 * KiB)
    return TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / "tier"),
        consistency="immutable",
        skip_instance_cache=True,
        **options,
    )


def _put(store: MemoryStore, prefix: str, count: int, size: int) -> dict[str, bytes]:
    blobs = {f"b/{prefix}/s{i:02d}": os.urandom(size) for i in range(count)}
    for path, blob in blobs.items():
        store.put_bytes("b", path[2:], blob)
    return blobs


def _until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_prefetch_a_prefix_then_read_it_from_the_tier(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 6, 50 * KiB)
    fs = _fs(tmp_path, store)
    handle = fs.prefetch("b/d")
    assert handle.wait(20)
    p = handle.progress()
    assert (p.objects_total, p.objects_done, p.fetched, p.failed) == (6, 6, 6, 0)
    assert p.bytes_done == p.bytes_total == 6 * 50 * KiB
    assert all(fs.is_cached(path) for path in blobs)
    for path, blob in blobs.items():
        assert fs.cat_file(path) == blob
    stats = fs.stats()
    assert stats["store_requests"]["GetObject"] == 6  # reads were hits
    assert (stats["prefetched"], stats["prefetched_bytes"]) == (6, 6 * 50 * KiB)
    assert (stats["prefetch_used"], stats["prefetch_wasted"]) == (6, 0)
    again = fs.prefetch("b/d/*")  # a glob; everything is there already
    assert again.wait(20) and again.progress().cached == 6
    assert fs.stats()["store_requests"]["GetObject"] == 6


def test_higher_priority_goes_first(tmp_path: Path) -> None:
    store = GatedStore()
    _put(store, "low", 4, 10 * KiB)
    _put(store, "high", 2, 10 * KiB)
    fs = _fs(tmp_path, store, prefetch_workers=1)
    store.gate.clear()
    low = fs.prefetch("b/low")
    _until(lambda: len(store.gets) == 1)  # the single worker is busy with low/s00
    high = fs.prefetch("b/high", priority=10)
    store.gate.set()
    assert low.wait(20) and high.wait(20)
    assert store.gets == ["low/s00", "high/s00", "high/s01", "low/s01", "low/s02", "low/s03"]


def test_cancel_drops_what_has_not_started(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 8, 10 * KiB)
    fs = _fs(tmp_path, store, prefetch_workers=1)
    store.gate.clear()
    handle = fs.prefetch("b/d")
    _until(lambda: len(store.gets) == 1)
    handle.cancel()
    assert handle.done and handle.wait(0) and handle.progress().cancelled
    store.gate.set()
    fs.wait_fetches()
    time.sleep(0.2)  # room for a wrongly queued object to start
    assert store.gets == ["d/s00"]
    assert [fs.is_cached(p) for p in blobs] == [True] + [False] * 7
    assert fs._runtime.prefetch.pinned_bytes() == 0  # nothing held for a cancelled request


def test_errors_are_reported_per_object(tmp_path: Path) -> None:
    store = GatedStore()
    _put(store, "d", 2, 10 * KiB)
    fs = _fs(tmp_path, store)
    handle = fs.prefetch(["b/d/s00", "b/d/missing", "b/d/s01"])
    assert handle.wait(20)
    p = handle.progress()
    assert (p.fetched, p.failed) == (2, 1)
    assert list(handle.errors) == ["b/d/missing"]
    assert isinstance(handle.errors["b/d/missing"], FileNotFoundError)


def test_tier_names_are_checked(tmp_path: Path) -> None:
    store = GatedStore()
    _put(store, "d", 1, KiB)
    fs = _fs(tmp_path, store)
    with pytest.raises(ValueError, match="shared tier"):
        fs.prefetch("b/d", tier="shared")
    with pytest.raises(ValueError, match="tier must be one of"):
        fs.prefetch("b/d", tier="nvme")
    with pytest.raises(ConfigError, match="prefetch_window_bytes"):
        _fs(tmp_path, store, prefetch_window_bytes="2MiB")  # above local_max_bytes
    with pytest.raises(ConfigError, match="prefetch_workers"):
        _fs(tmp_path, store, prefetch_workers=0)


def test_read_ahead_fetches_the_next_k(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 10, 10 * KiB)
    paths = list(blobs)
    fs = _fs(tmp_path, store)
    with fs.read_ahead("b/d", k=3) as order:
        assert order.paths == paths
        _until(lambda: all(fs.is_cached(p) for p in paths[:3]))
        assert fs.cat_file(paths[4]) == blobs[paths[4]]  # opening object 4 queues 5..7
        _until(lambda: all(fs.is_cached(p) for p in paths[5:8]))
        fs.wait_fetches()
        assert not any(fs.is_cached(p) for p in (paths[3], paths[8], paths[9]))
    assert store.gets.count("d/s05") == 1


def test_a_window_smaller_than_the_data_never_evicts_what_is_read_sooner(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 30, 100 * KiB)  # 3x the tier's budget
    paths = list(blobs)
    fs = _fs(tmp_path, store, prefetch_window_bytes=400 * KiB)
    handle = fs.prefetch("b/d")
    _until(lambda: handle.progress().objects_done == 4)
    time.sleep(0.2)  # room for a fifth object to start, which it must not
    assert handle.progress().objects_done == 4 and not handle.done
    assert [fs.is_cached(p) for p in paths[:5]] == [True] * 4 + [False]
    fs.evict(0)  # even an explicit eviction leaves the prefetched, unread objects
    assert all(fs.is_cached(p) for p in paths[:4])
    for i, path in enumerate(paths):  # a reader frees room: the window slides with it
        assert fs.cat_file(path) == blobs[path]
        _until(lambda i=i: handle.progress().objects_done >= min(30, i + 5))
    assert handle.wait(20)
    stats = fs.stats()
    assert stats["store_requests"]["GetObject"] == 30
    assert (stats["prefetched"], stats["prefetch_used"], stats["prefetch_wasted"]) == (30, 30, 0)


def test_two_epochs_over_three_times_the_budget_do_not_thrash(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 30, 100 * KiB)
    budget = 1000 * KiB
    fs = _fs(tmp_path, store, local_max_bytes=budget, prefetch_window_bytes=400 * KiB)
    engine = fs._runtime.prefetch
    gets_per_epoch = []
    peak_held, peak_usage = 0, 0
    for _epoch in range(2):
        before = len(store.gets)
        with fs.read_ahead("b/d", k=8) as order:
            for path in order.paths:
                assert fs.cat_file(path) == blobs[path]
                time.sleep(0.005)  # the "model" computes: prefetch gets ahead
                peak_held = max(peak_held, engine.pinned_bytes())
                peak_usage = max(peak_usage, fs.tier.usage(fresh=True))
        gets_per_epoch.append(len(store.gets) - before)
    # Each object at most once per epoch, nothing evicted unread; the second epoch may find
    # the first one's last objects still there (kept by next use, where LRU let them go).
    assert gets_per_epoch[0] == 30 and gets_per_epoch[1] <= 30
    assert peak_held <= 400 * KiB
    # The tier makes room when a fetch begins; two fetches beginning at once may each see the
    # other's bytes missing, so it can be over by one object for a moment, never by the data.
    assert peak_usage <= budget + 100 * KiB
    stats = fs.stats()
    assert stats["prefetch_wasted"] == 0
    assert stats["prefetch_used"] >= 40  # most objects were there before the reader came


def test_unpinned_prefetch_fills_the_budget_and_skips_the_rest(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 30, 100 * KiB)
    fs = _fs(tmp_path, store, local_max_bytes=1000 * KiB)
    handle = fs.prefetch("b/d", pin=False)
    assert handle.wait(20)
    p = handle.progress()
    assert (p.fetched, p.skipped, p.failed) == (10, 20, 0)
    assert len(store.gets) == 10  # nothing fetched only to be evicted by the same request
    assert all(fs.is_cached(path) for path in list(blobs)[:10])
    assert fs.tier.usage(fresh=True) <= 1000 * KiB


def test_a_read_racing_a_prefetch_joins_its_fetch(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 1, 200 * KiB)
    fs = _fs(tmp_path, store)
    store.gate.clear()
    handle = fs.prefetch("b/d")
    _until(lambda: len(store.gets) == 1)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(bytes(fs.cat_file("b/d/s00"))))
    reader.start()
    time.sleep(0.1)
    store.gate.set()
    reader.join(20)
    assert handle.wait(20)
    assert got == [blobs["b/d/s00"]]
    assert store.gets == ["d/s00"]
    stats = fs.stats()
    assert stats["fetches_joined"] == 1 and stats["prefetch_used"] == 1
    assert stats["reader_wait_seconds"] > 0


def test_one_order_over_two_epochs_keeps_reading_ahead(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 12, 100 * KiB)
    paths = list(blobs)
    second = paths[::-1]
    fs = _fs(tmp_path, store, local_max_bytes=600 * KiB, prefetch_window_bytes=300 * KiB)
    with fs.read_ahead(paths + second, k=2) as order:
        for path in order.paths:
            assert fs.cat_file(path) == blobs[path]
            time.sleep(0.01)
        queued = order.handle.progress().objects_total
    stats = fs.stats()
    assert queued == 24  # read-ahead went on through the second epoch
    assert max(store.gets.count(p[2:]) for p in paths) <= 2  # at most once per epoch
    assert stats["prefetch_wasted"] == 0
    assert stats["hits"] >= 20  # nearly every open found its object in the tier


def test_a_forked_child_drops_the_parents_pins(tmp_path: Path) -> None:
    store = GatedStore()
    blobs = _put(store, "d", 2, 100 * KiB)
    fs = _fs(tmp_path, store)
    handle = fs.prefetch("b/d")
    assert handle.wait(20)
    engine = fs._runtime.prefetch
    assert engine.pinned_bytes() == 200 * KiB
    pid = os.fork()
    if pid == 0:  # the child: no pins, and prefetch works
        code = 1
        try:
            held = engine.pinned_bytes()  # before its own prefetch pins any (a race, read after)
            again = fs.prefetch("b/d")
            if held == 0 and again.wait(20):
                code = 0 if again.progress().cached == 2 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fs.evict(0)  # the parent's pins still hold
    assert all(fs.is_cached(p) for p in blobs)


def test_prefetch_options_from_keywords_and_environment() -> None:
    from tiercache import TierCacheConfig

    env = {
        "TIERCACHE_PREFETCH_WORKERS": "2",
        "TIERCACHE_READAHEAD": "8",
        "TIERCACHE_PREFETCH_WINDOW_BYTES": "64MiB",
    }
    config = TierCacheConfig.from_options({}, environ=env)
    assert (config.prefetch_workers, config.readahead) == (2, 8)
    assert config.prefetch_window == 64 * 1024 * KiB
    defaults = TierCacheConfig.from_options({"local_max_bytes": "1GiB"}, environ={})
    assert defaults.prefetch_window == 512 * 1024 * KiB  # half the local budget
    with pytest.raises(ConfigError, match=r"TIERCACHE_READAHEAD\) must be an integer"):
        TierCacheConfig.from_options({}, environ={"TIERCACHE_READAHEAD": "many"})


class SlowStore(MemoryStore):
    """Every GET takes ``delay`` seconds: a store far away."""

    def __init__(self, delay: float) -> None:
        super().__init__(["b"])
        self.delay = delay

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> MemoryStream:
        time.sleep(self.delay)
        return super().open_range(bucket, key, start, end, if_match)


def test_read_ahead_deepens_while_the_reader_waits(tmp_path: Path) -> None:
    store = SlowStore(delay=0.05)
    blobs = _put(store, "d", 24, 4 * KiB)
    fs = _fs(tmp_path, store, prefetch_workers=1)
    with fs.read_ahead(list(blobs), k=1) as order:
        for path in order.paths:  # a reader faster than one object in flight at depth 1
            assert fs.cat_file(path) == blobs[path]
        deepened = order.k
    stats = fs.stats()
    assert deepened > 1 and 1 <= stats["readahead_deepened"] <= deepened - 1
    assert stats["prefetch_workers_added"] >= 1
    # At least as deep as the objects in flight (1 to start with, plus those added).
    assert deepened >= 1 + stats["prefetch_workers_added"]
    assert stats["prefetch_wasted"] == 0


def test_read_ahead_keeps_its_depth_when_the_reader_never_waits(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    blobs = _put(store, "d", 8, 4 * KiB)
    fs = _fs(tmp_path, store, prefetch_workers=1)  # objects arrive in order
    with fs.read_ahead(list(blobs), k=2) as order:
        for i, path in enumerate(order.paths):  # each open finds its object pinned, ready
            _until(lambda n=i + 1: fs.stats()["prefetched"] >= n)  # type: ignore[misc]
            assert fs.cat_file(path) == blobs[path]
        assert order.k == 2
    assert fs.stats()["readahead_deepened"] == 0


class CountingSlowStore(SlowStore):
    """A far store that records how many GETs it answers at once, and every HEAD."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self._lock = threading.Lock()
        self._now = 0
        self.most_at_once = 0
        self.heads = 0

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> MemoryStream:
        with self._lock:
            self._now += 1
            self.most_at_once = max(self.most_at_once, self._now)
        try:
            return super().open_range(bucket, key, start, end, if_match)
        finally:
            with self._lock:
                self._now -= 1

    def head(self, bucket: str, key: str) -> Any:
        self.heads += 1
        return super().head(bucket, key)


def test_cat_of_a_list_fetches_many_objects_at_once_without_a_head(tmp_path: Path) -> None:
    """fsspec's cat reads a list one object after the other: a store 50 ms away then gives
    20 small objects a second. tiercache's fetches them ahead of the loop, several at once,
    and asks no HEAD before a GET (the GET's reply says the size)."""
    store = CountingSlowStore(delay=0.05)
    blobs = _put(store, "many", 60, 4 * KiB)
    fs = _fs(tmp_path, store, prefetch_workers=2)
    assert fs.cat(list(blobs)) == blobs
    assert store.most_at_once > 2  # more than the workers it started with: it grew
    assert store.heads == 0
    assert fs.stats()["prefetch_workers_added"] >= 1


def test_cat_keeps_fsspec_semantics_for_errors_and_single_paths(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    blobs = _put(store, "some", 3, 100)
    fs = _fs(tmp_path, store)
    first = next(iter(blobs))
    assert fs.cat(first) == blobs[first]  # one path: its bytes, not a dict
    assert fs.cat([first]) == {first: blobs[first]}
    missing = "b/some/none"
    out = fs.cat([*blobs, missing], on_error="return")
    assert isinstance(out[missing], FileNotFoundError)
    assert {p: out[p] for p in blobs} == blobs
    assert fs.cat([*blobs, missing], on_error="omit") == blobs
    with pytest.raises(FileNotFoundError):
        fs.cat([*blobs, missing])
    assert fs.cat("b/some/s0*") == blobs  # a glob: a dict, as for a list


def test_prefetch_of_a_list_learns_sizes_from_the_gets_and_skips_what_cannot_fit(
    tmp_path: Path,
) -> None:
    """A list names no sizes: no HEAD is sent, the window is charged by the GET's reply, and
    an object larger than the window stops at that reply (it is not fetched whole)."""
    store = CountingSlowStore(delay=0.0)
    blobs = _put(store, "sized", 4, 8 * KiB)
    store.put_bytes("b", "sized/huge", os.urandom(256 * KiB))
    fs = _fs(tmp_path, store, prefetch_window_bytes=64 * KiB)
    handle = fs.prefetch([*blobs, "b/sized/huge"], pin=False)
    assert handle.wait(30)
    progress = handle.progress()
    assert store.heads == 0
    assert all(fs.is_cached(p) for p in blobs)
    assert not fs.is_cached("b/sized/huge")
    assert progress.skipped == 1
    assert fs.stats()["bytes_fetched"] == 4 * 8 * KiB  # none of the huge one's bytes kept


def test_a_warm_read_ahead_epoch_reports_every_object_cached_and_fetches_none(
    tmp_path: Path,
) -> None:
    """Objects a reader may open as they are (fresh in the local tier, which has room for the
    window besides) are done at once, reported cached, and nothing is left pinned."""
    store = MemoryStore(["b"])
    blobs = _put(store, "warm", 20, 4 * KiB)
    fs = _fs(tmp_path, store)
    assert fs.cat(list(blobs)) == blobs  # cold: fetched by the engine's workers
    fs.wait_fetches()
    fetches = fs.stats()["fetches"]
    with fs.read_ahead(list(blobs)) as order:
        for path in order.paths:
            assert fs.cat_file(path) == blobs[path]
        progress = order.handle.progress()
    assert progress.cached == len(blobs) and progress.fetched == 0
    assert fs.stats()["fetches"] == fetches
    assert fs._runtime.prefetch.pinned_bytes() == 0
