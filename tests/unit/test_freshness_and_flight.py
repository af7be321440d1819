"""The one freshness rule, the flight governor's sizing, and tier usage under concurrent fetches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.metadata.freshness import CLOCK_SLACK, Freshness
from tiercache.prefetch.governor import QUEUEING, FlightGovernor


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_freshness_per_mode() -> None:
    clock = Clock(1000.0)
    ttl = Freshness("ttl", 60.0, clock)
    assert ttl.holds(1000.0) and ttl.holds(941.0)
    assert not ttl.holds(940.0)
    assert Freshness("immutable", 60.0, clock).holds(0.0)
    assert not Freshness("always", 60.0, clock).holds(1000.0)
    assert ttl.by_listing and not Freshness("ttl", 0.0, clock).by_listing
    assert not Freshness("always", 60.0, clock).by_listing


def test_a_stamp_from_a_clock_running_ahead_earns_no_freshness() -> None:
    """Another process whose clock is an hour ahead stamped the entry: a reader with a right
    clock must not serve it for an hour plus the ttl."""
    clock = Clock(1000.0)
    fresh = Freshness("ttl", 2.0, clock)
    assert fresh.holds(1000.0 + CLOCK_SLACK / 2)  # clocks that agree to NTP's error
    assert not fresh.holds(1000.0 + 3600.0)


def test_the_governor_grows_by_half_while_fetches_take_the_latency() -> None:
    governor = FlightGovernor(start=4, maximum=64)
    for _ in range(8):
        governor.sample(0.030, 128 * 1024)
    widths = []
    while governor.grow():
        widths.append(governor.width)
        for _ in range(8):
            governor.sample(0.031, 128 * 1024)
    assert widths[:4] == [6, 9, 13, 19]
    assert governor.width == 64


def test_the_governor_holds_once_fetches_queue() -> None:
    governor = FlightGovernor(start=4, maximum=64)
    for _ in range(8):
        governor.sample(0.030, 128 * 1024)
    assert governor.grow() == 2
    for _ in range(8):
        governor.sample(0.030 * (QUEUEING + 0.5), 128 * 1024)  # a queue formed somewhere
    assert governor.grow() == 0
    assert governor.width == 6


def test_the_governor_times_only_small_objects() -> None:
    governor = FlightGovernor(start=2, maximum=8)
    governor.sample(0.01, 1024)
    for _ in range(8):
        governor.sample(5.0, 64 * 1024 * 1024)  # a shard's time is its bytes: not a queue
    assert governor.grow() == 1


def test_a_usage_scan_that_a_publish_overlapped_is_kept_and_never_under(tmp_path: Path) -> None:
    """A fetch publishes while ``usage`` scans the tier: the scan's total is kept, counting
    that entry twice rather than missing it. Dropping such a scan made every fetch rescan the
    whole tier while others published: a small object's cost grew with the objects cached."""
    store = MemoryStore(["b"])
    store.put_bytes("b", "k", b"x" * 1000)
    fs = TierCacheFileSystem(store=store, local_dir=str(tmp_path / "t"), skip_instance_cache=True)
    tier = fs.tier
    scan = tier._scan
    inside = False

    def scan_while_a_fetch_publishes(
        count_parts: bool = True, sizes_only: bool = False
    ) -> list[Any]:
        nonlocal inside
        if inside:  # the fetch's own reservation asks for usage too
            return scan(count_parts, sizes_only)
        rows = scan(count_parts, sizes_only)  # the tier is empty when this scan reads it
        inside = True
        assert fs.cat_file("b/k") == b"x" * 1000
        fs.wait_fetches()
        return rows

    tier._scan = scan_while_a_fetch_publishes  # type: ignore[method-assign]
    usage = tier.usage(max_age=0.0)
    tier._scan = scan  # type: ignore[method-assign]
    assert usage >= 1000
    assert tier._scan_cache is not None  # kept: the next fetch does not scan again
    assert tier.usage() >= 1000
    assert tier.usage(fresh=True) == 1000
