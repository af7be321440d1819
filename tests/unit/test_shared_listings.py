"""Listings kept in the shared tier: one LIST for every host, forgotten on this host's writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiercache.metadata.freshness import Freshness
from tiercache.metadata.shared import SharedListings
from tiercache.tiers.shared import SharedTier


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _listings(tmp_path: Path, clock: Clock, ttl: float = 60.0) -> SharedListings:
    tier = SharedTier(str(tmp_path / "shared"), 1 << 30, host_id="host-a")
    return SharedListings(tier, "s3:ns", Freshness("ttl", ttl, clock), lock_timeout=5.0)


def test_one_listing_serves_every_host_within_the_ttl(tmp_path: Path) -> None:
    clock = Clock()
    host_a, host_b = _listings(tmp_path, clock), _listings(tmp_path, clock)
    calls: list[str] = []

    def list_now(who: str) -> Any:
        def run() -> list[dict[str, Any]]:
            calls.append(who)
            return [{"name": "b/p/k", "type": "file", "size": 1, "ETag": '"e"'}]

        return run

    rows, asked_at = host_a.listing("b", "p/", False, list_now("a"))
    assert host_b.listing("b", "p/", False, list_now("b")) == (rows, asked_at)
    assert calls == ["a"]
    clock.now += 61.0  # past the ttl: listed again
    host_b.listing("b", "p/", False, list_now("b"))
    assert calls == ["a", "b"]


def test_a_write_forgets_the_listings_above_its_key(tmp_path: Path) -> None:
    clock = Clock()
    listings = _listings(tmp_path, clock)
    lists: list[str] = []

    def list_now() -> list[dict[str, Any]]:
        lists.append("x")
        return []

    for prefix in ("", "p/", "p/q/"):
        listings.listing("b", prefix, False, list_now)
        listings.listing("b", prefix, True, list_now)
    listings.listing("b", "other/", False, list_now)
    assert len(lists) == 7
    listings.invalidate("b", ["p/q/k"])
    for prefix in ("", "p/", "p/q/"):
        listings.listing("b", prefix, False, list_now)
        listings.listing("b", prefix, True, list_now)
    listings.listing("b", "other/", False, list_now)  # not above the key: still kept
    assert len(lists) == 13


def test_a_listing_that_an_invalidation_raced_is_not_kept(tmp_path: Path) -> None:
    """A write lands (and invalidates) while another host's LIST is in flight: the LIST may
    predate the write, so its record must not be served afterwards."""
    clock = Clock()
    lister, writer = _listings(tmp_path, clock), _listings(tmp_path, clock)
    lists: list[str] = []

    def list_raced_by_a_write() -> list[dict[str, Any]]:
        lists.append("raced")
        writer.invalidate("b", ["p/new"])  # the write lands while this LIST runs
        return []

    def list_now() -> list[dict[str, Any]]:
        lists.append("again")
        return [{"name": "b/p/new", "type": "file", "size": 1, "ETag": '"e"'}]

    assert lister.listing("b", "p/", False, list_raced_by_a_write)[0] == []
    assert lister.listing("b", "p/", False, list_now)[0] != []  # listed again, not the stale one
    assert lists == ["raced", "again"]
