"""LRU eviction keeps the local tier within its budget and never removes an open entry."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tiercache import MemoryStore, TierCacheFileSystem

KiB = 1024


def _fs(tmp_path: Path, store: MemoryStore, budget: int) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / "tier"),
        local_max_bytes=budget,
        consistency="immutable",
        skip_instance_cache=True,
    )


def _read(fs: TierCacheFileSystem, path: str) -> bytes:
    data = fs.cat_file(path)
    fs.wait_fetches()
    return bytes(data)


def test_reading_three_times_the_budget_stays_within_it(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    blobs = {f"b/s{i:02d}": os.urandom(100 * KiB) for i in range(30)}
    for path, blob in blobs.items():
        store.put_bytes("b", path[2:], blob)
    budget = 1000 * KiB
    fs = _fs(tmp_path, store, budget)
    peak = 0
    for path, blob in blobs.items():
        assert _read(fs, path) == blob
        peak = max(peak, fs.tier.usage(fresh=True))
    assert peak <= budget
    cached = [p for p in blobs if fs.is_cached(p)]
    assert 5 <= len(cached) <= 10
    assert cached == list(blobs)[-len(cached) :]  # the most recently read survive


def test_least_recently_used_goes_first(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    for name in "abcd":
        store.put_bytes("b", name, os.urandom(100 * KiB))
    fs = _fs(tmp_path, store, 350 * KiB)
    for name in "abc":
        _read(fs, f"b/{name}")
        time.sleep(0.01)
    _read(fs, "b/a")  # a is now more recent than b and c
    time.sleep(0.01)
    _read(fs, "b/d")  # needs room: b (least recently used) goes
    assert [fs.is_cached(f"b/{n}") for n in "abcd"] == [True, False, True, True]


def test_open_entry_is_never_evicted(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    for name in "abc":
        store.put_bytes("b", name, name.encode() * 100 * KiB)
    fs = _fs(tmp_path, store, 10 * KiB * 1000)
    for name in "abc":
        _read(fs, f"b/{name}")
    with fs.open("b/a") as held:
        report = fs.evict(0)
        assert report.kept_busy == 1
        assert fs.is_cached("b/a") and not fs.is_cached("b/b") and not fs.is_cached("b/c")
        assert held.read() == b"a" * 100 * KiB
    assert fs.evict(0).removed_bytes == 100 * KiB
    assert fs.tier.usage(fresh=True) == 0


def test_dry_run_removes_nothing(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    store.put_bytes("b", "x", b"1" * KiB)
    fs = _fs(tmp_path, store, 10 * KiB)
    _read(fs, "b/x")
    report = fs.evict(0, dry_run=True)
    assert report.removed_bytes == KiB and fs.is_cached("b/x")


def test_leftovers_of_a_dead_fetcher_are_reclaimed(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store, 10 * KiB)
    entry_id = fs.read_path.entry_id("b", "ghost")
    paths = fs.tier.paths(entry_id)
    Path(paths.part).write_bytes(b"z" * 4 * KiB)  # no lock holder: its fetcher died
    assert fs.tier.usage(fresh=True) == 4 * KiB
    assert fs.evict(0).removed_bytes == 4 * KiB
    assert not os.path.exists(paths.part)


def test_a_fetch_in_progress_counts_once_not_as_file_and_reservation(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    store.put_bytes("b", "done", os.urandom(300 * KiB))
    fs = _fs(tmp_path, store, 1000 * KiB)
    _read(fs, "b/done")
    tier = fs.tier
    # A fetch of 600 KiB has written 500 KiB of its part file: 900 KiB, not 1.4 MiB.
    paths = tier.paths(tier.entry_id("memory:", "b", "big"))
    tier.reserve(600 * KiB)
    fd = tier.create_part(paths)
    try:
        os.write(fd, os.urandom(500 * KiB))
        assert tier.usage() == 900 * KiB
        assert tier.usage(fresh=True) == 800 * KiB  # what the disk holds now
        assert fs.is_cached("b/done")  # nothing was evicted to make room twice
    finally:
        os.close(fd)
        os.unlink(paths.part)
        tier.release(600 * KiB)


def test_stats_do_not_walk_the_tier_on_every_call(tmp_path: Path, monkeypatch: Any) -> None:
    store = MemoryStore(["b"])
    for i in range(3):
        store.put_bytes("b", f"s{i}", os.urandom(10 * KiB))
    fs = _fs(tmp_path, store, 1000 * KiB)
    scans = []
    real_scan = fs.tier._scan
    monkeypatch.setattr(fs.tier, "_scan", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    _read(fs, "b/s0")
    for _ in range(20):
        fs.stats()
    _read(fs, "b/s1")  # this process's own fetch shows without another walk
    assert fs.stats()["local_usage_bytes"] == 20 * KiB
    assert len(scans) <= 2
