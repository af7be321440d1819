"""The shared tier: hosts share fetched objects, leases, promotion, pins, watermarks, budgets."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.errors import CacheTimeoutError, ConfigError
from tiercache.tiers.lease import LeaseLock, LeaseOwner
from tiercache.tiers.shared import SharedTier

KiB = 1024


def _host(tmp_path: Path, store: MemoryStore, host: str, **options: Any) -> TierCacheFileSystem:
    """A filesystem standing in for one host: its own local tier, the common shared tier."""
    defaults: dict[str, Any] = {
        "local_dir": str(tmp_path / f"local-{host}"),
        "shared_dir": str(tmp_path / "shared"),
        "host_id": host,
        "consistency": "immutable",
    }
    return TierCacheFileSystem(store=store, skip_instance_cache=True, **{**defaults, **options})


def _store(count: int = 4, size: int = 100 * KiB) -> tuple[MemoryStore, dict[str, bytes]]:
    store = MemoryStore(["b"])
    blobs = {f"b/s{i:02d}": os.urandom(size) for i in range(count)}
    for path, blob in blobs.items():
        store.put_bytes("b", path[2:], blob)
    return store, blobs


def _gets(store: MemoryStore) -> int:
    return store.request_counts().get("GetObject", 0)


def test_second_host_reads_from_the_shared_tier(tmp_path: Path) -> None:
    store, blobs = _store()
    first = _host(tmp_path, store, "h1")
    for path, blob in blobs.items():
        assert first.cat_file(path) == blob
    first.wait_fetches()
    fetched = _gets(store)
    assert fetched == len(blobs)
    second = _host(tmp_path, store, "h2")
    for path, blob in blobs.items():
        assert second.cat_file(path) == blob
    assert _gets(store) == fetched  # nothing more from the store
    assert second.stats()["promotions"] == len(blobs)
    assert all(second.is_cached(p, tier="local") for p in blobs)  # promoted by default


def test_miss_fills_both_tiers(tmp_path: Path) -> None:
    store, blobs = _store(1)
    fs = _host(tmp_path, store, "h1")
    path = next(iter(blobs))
    assert fs.cat_file(path) == blobs[path]
    fs.wait_fetches()
    assert fs.is_cached(path, tier="shared") and fs.is_cached(path, tier="local")


def test_serve_policy_reads_in_place(tmp_path: Path) -> None:
    store, blobs = _store(2)
    filler = _host(tmp_path, store, "h1")
    filler.cat(list(blobs))
    filler.wait_fetches()
    reader = _host(tmp_path, store, "h2", shared_policy="serve")
    for path, blob in blobs.items():
        with reader.open(path) as f:
            assert f.read() == blob
        assert not reader.is_cached(path, tier="local")
    assert reader.stats()["shared_hits"] == len(blobs)


def test_shared_entry_of_a_changed_object_is_refetched(tmp_path: Path) -> None:
    store, blobs = _store(1)
    path = next(iter(blobs))
    _host(tmp_path, store, "h1").cat_file(path)
    store.put_bytes("b", path[2:], b"new bytes")
    reader = _host(tmp_path, store, "h2", consistency="always")
    assert reader.cat_file(path) == b"new bytes"


def test_pinned_entries_survive_eviction_in_both_tiers(tmp_path: Path) -> None:
    store, blobs = _store(4)
    fs = _host(tmp_path, store, "h1")
    pinned = "b/s00"
    fs.pin(pinned)
    fs.cat(list(blobs))
    fs.wait_fetches()
    for tier in ("local", "shared"):
        report = fs.evict(0, tier=tier)
        assert report.kept_pinned == 1
        assert fs.is_cached(pinned, tier=tier)
        assert not fs.is_cached("b/s01", tier=tier)
    fs.unpin(pinned)
    fs.evict(0, tier="shared")
    assert not fs.is_cached(pinned, tier="shared")


def test_dry_run_of_the_shared_tier_removes_nothing(tmp_path: Path) -> None:
    store, blobs = _store(3)
    fs = _host(tmp_path, store, "h1")
    fs.cat(list(blobs))
    fs.wait_fetches()
    report = fs.evict(0, tier="shared", dry_run=True)
    assert len(report.removed) == 3
    assert all(fs.is_cached(p, tier="shared") for p in blobs)


def test_each_tier_stays_within_its_budget(tmp_path: Path) -> None:
    store, blobs = _store(30)
    entry = 100 * KiB
    fs = _host(tmp_path, store, "h1", local_max_bytes=5 * entry, shared_max_bytes=10 * entry)
    peak_local = peak_shared = 0
    for path, blob in blobs.items():  # 3x the shared budget, 6x the local one
        assert fs.cat_file(path) == blob
        fs.wait_fetches()
        stats = fs.stats()
        peak_local = max(peak_local, stats["local_usage_bytes"])
        peak_shared = max(peak_shared, stats["shared_usage_bytes"])
    assert peak_local <= 5 * entry + entry
    assert peak_shared <= 10 * entry + entry


def test_watermarks_free_down_to_the_low_mark(tmp_path: Path) -> None:
    store, blobs = _store(10)
    fs = _host(
        tmp_path,
        store,
        "h1",
        local_max_bytes=10 * 100 * KiB,
        high_watermark=0.9,
        low_watermark=0.5,
    )
    usages = []
    for path in blobs:
        fs.cat_file(path)
        fs.wait_fetches()
        usages.append(fs.tier.usage(fresh=True))
    assert max(usages) <= 900 * KiB
    assert min(usages[5:]) <= 500 * KiB  # evicted well below the high mark at least once


def test_min_free_bytes_evicts_when_the_disk_is_short(tmp_path: Path) -> None:
    store, blobs = _store(3)
    fs = _host(tmp_path, store, "h1", min_free_bytes=1 << 50)
    for path in blobs:
        fs.cat_file(path)
        fs.wait_fetches()
    # No disk has a petabyte free: every fetch evicts all it can before it lands.
    assert fs.tier.usage(fresh=True) <= 100 * KiB


def test_bad_shared_options_name_the_option(tmp_path: Path) -> None:
    store, _ = _store(1)
    with pytest.raises(ConfigError, match="shared_policy"):
        _host(tmp_path, store, "h1", shared_policy="copy")
    with pytest.raises(ConfigError, match="watermark"):
        _host(tmp_path, store, "h1", high_watermark=0.5, low_watermark=0.8)
    with pytest.raises(ConfigError, match="shared_auth"):
        _host(tmp_path, store, "h1", shared_auth="nobody")
    with pytest.raises(ConfigError, match="shared tier"):
        TierCacheFileSystem(
            store=store, local_dir=str(tmp_path / "l"), skip_instance_cache=True
        ).evict(tier="shared")


# -- leases ------------------------------------------------------------------------------------


def _plant(path: Path, host: str, pid: int, age: float = 0.0) -> None:
    owner = LeaseOwner(host, pid, LeaseLock(host, 30.0, 0o600).boot_id, "t0")
    path.write_bytes(owner.to_json())
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    leases = LeaseLock(socket.gethostname(), 30.0, 0o600)
    _plant(lock, leases.host, _dead_pid())
    token = leases.acquire(str(lock), timeout=5.0, what="test")
    assert LeaseOwner.read(str(lock)) == LeaseOwner(leases.host, os.getpid(), leases.boot_id, token)
    assert leases.broken == 1
    leases.release(str(lock), token)
    assert not lock.exists()


def test_lease_of_another_host_is_broken_only_once_stale(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    leases = LeaseLock("here", 1.0, 0o600)
    _plant(lock, "elsewhere", 1)
    with pytest.raises(CacheTimeoutError, match="elsewhere"):
        leases.acquire(str(lock), timeout=0.3, what="test")  # its heartbeat is fresh
    _plant(lock, "elsewhere", 1, age=5.0)
    token = leases.acquire(str(lock), timeout=5.0, what="test")
    assert leases.broken == 1
    leases.release(str(lock), token)


def test_heartbeat_keeps_a_held_lease_alive(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    owner = LeaseLock("h1", 0.4, 0o600)
    token = owner.acquire(str(lock), timeout=1.0, what="test")
    try:
        time.sleep(1.2)  # three times the staleness window
        other = LeaseLock("h2", 0.4, 0o600)
        assert other.try_acquire(str(lock)) is None
        assert other.is_held(str(lock))
        with pytest.raises(CacheTimeoutError):
            other.acquire(str(lock), timeout=0.3, what="test")
        assert other.broken == 0
    finally:
        owner.release(str(lock), token)


def test_a_released_lease_belongs_to_nobody(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    first = LeaseLock("h1", 30.0, 0o600)
    token = first.acquire(str(lock), timeout=1.0, what="test")
    first.release(str(lock), token)
    second = LeaseLock("h2", 30.0, 0o600)
    token2 = second.acquire(str(lock), timeout=1.0, what="test")
    first.release(str(lock), token)  # a stale release must not remove the new owner's lease
    assert LeaseOwner.read(str(lock)) is not None
    second.release(str(lock), token2)


def test_a_write_drops_the_shared_copy_of_the_old_bytes(tmp_path: Path) -> None:
    store, blobs = _store(1)
    path = next(iter(blobs))
    fs = _host(tmp_path, store, "h1", write_mode="through")
    fs.cat_file(path)
    fs.wait_fetches()
    assert fs.is_cached(path, tier="shared")
    with fs.open(path, "wb") as f:
        f.write(b"rewritten")
    assert not fs.is_cached(path, tier="shared")
    fs.evict(0)  # even with the local copy gone, the old bytes are not served
    assert fs.cat_file(path) == b"rewritten"


def test_a_write_of_an_object_the_shared_tier_lacks_takes_no_lease(
    tmp_path: Path, monkeypatch: Any
) -> None:
    store, blobs = _store(1)
    path = next(iter(blobs))
    fs = _host(tmp_path, store, "h1", write_mode="through")
    shared = fs.tier_named("shared")
    assert isinstance(shared, SharedTier)
    taken: list[str] = []
    real_acquire = shared.leases.acquire
    monkeypatch.setattr(
        shared.leases, "acquire", lambda lock, *a: taken.append(lock) or real_acquire(lock, *a)
    )
    with fs.open(f"{path}.new", "wb") as f:
        f.write(b"fresh object")
    assert taken == []
    fs.cat_file(path)  # cached in the shared tier: the next write takes the lease to drop it
    fs.wait_fetches()
    taken.clear()
    with fs.open(path, "wb") as f:
        f.write(b"rewritten")
    assert len(taken) == 1 and not fs.is_cached(path, tier="shared")


def test_prefetch_into_the_shared_tier_fills_it_for_the_other_hosts(tmp_path: Path) -> None:
    store, blobs = _store(3)
    fs = _host(tmp_path, store, "h1")
    handle = fs.prefetch(list(blobs), tier="shared")
    assert handle.wait(timeout=30)
    assert all(fs.is_cached(p, tier="shared") for p in blobs)
    assert not any(fs.is_cached(p, tier="local") for p in blobs)  # not copied here
    other = _host(tmp_path, store, "h2")
    gets = _gets(store)
    assert [other.cat_file(p) for p in blobs] == list(blobs.values())
    assert _gets(store) == gets


def test_eviction_breaks_the_lease_a_dead_fetcher_left(tmp_path: Path) -> None:
    store, blobs = _store(1)
    path = next(iter(blobs))
    fs = _host(tmp_path, store, socket.gethostname())
    fs.cat_file(path)
    fs.wait_fetches()
    shared = fs.tier_named("shared")
    entry_id = fs.read_path.entry_id("b", path[2:])
    _plant(Path(shared.paths(entry_id).lock), socket.gethostname(), _dead_pid())
    assert fs.evict(0, tier="shared").removed_bytes == len(blobs[path])
