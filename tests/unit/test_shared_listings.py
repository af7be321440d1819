"""Listings kept in the shared tier: one LIST for every host, forgotten on this host's writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tiercache.errors import AccessDeniedError
from tiercache.metadata.freshness import Freshness
from tiercache.metadata.shared import ListingProofs, SharedListings
from tiercache.store.base import ListEntry
from tiercache.store.memory import MemoryStore
from tiercache.tiers.shared import SharedTier


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _listings(
    tmp_path: Path,
    clock: Clock,
    ttl: float = 60.0,
    proofs: ListingProofs | None = None,
    consistency: str = "ttl",
) -> SharedListings:
    tier = SharedTier(str(tmp_path / "shared"), 1 << 30, host_id="host-a")
    freshness = Freshness(consistency, ttl, clock)
    return SharedListings(tier, "s3:ns", freshness, lock_timeout=5.0, proofs=proofs)


class RefusingStore(MemoryStore):
    """A user's store that may not list bucket ``b`` (as S3 answers 403)."""

    def list_objects(
        self, bucket: str, prefix: str, delimiter: str | None = "/"
    ) -> Iterator[ListEntry]:
        self._count("ListObjectsV2")
        raise AccessDeniedError(13, "ListObjectsV2: access denied (AccessDenied)", bucket)


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


def _rows_of_a() -> list[dict[str, Any]]:
    return [{"name": "b/p/secret-name", "type": "file", "size": 1, "ETag": '"e"'}]


def test_another_users_listing_is_served_after_one_request_of_ones_own_per_ttl(
    tmp_path: Path,
) -> None:
    """Immutable listings never expire; what this process may list is asked again per ttl."""
    clock = Clock()
    store_a, store_b = MemoryStore(["b"]), MemoryStore(["b"])
    host_a = _listings(tmp_path, clock, 60.0, ListingProofs(store_a, 60.0, clock), "immutable")
    host_b = _listings(tmp_path, clock, 60.0, ListingProofs(store_b, 60.0, clock), "immutable")
    rows, _ = host_a.listing("b", "p/", False, _rows_of_a)
    assert store_a.request_counts() == {}  # its own listing was its answer
    assert host_b.listing("b", "p/", False, _unexpected)[0] == rows
    assert host_b.listing("b", "p/", True, lambda: rows)[0] == rows  # listed now, kept
    assert store_b.request_counts() == {"ListObjectsV2": 1}  # one page, for ls and find
    host_a.listing("b", "p/", False, _unexpected)
    clock.now += 59.0
    host_b.listing("b", "p/", False, _unexpected)
    assert store_b.request_counts() == {"ListObjectsV2": 1}
    clock.now += 1.0  # the answer is ttl seconds old: asked again
    host_b.listing("b", "p/", False, _unexpected)
    assert store_b.request_counts() == {"ListObjectsV2": 2}
    host_b.listing("b", "q/", False, lambda: [])  # listed here: no request for q/
    host_b.listing("b", "", True, _rows_of_a)
    host_b.listing("b", "p/", False, _unexpected)
    assert store_b.request_counts() == {"ListObjectsV2": 2}
    assert store_a.request_counts() == {}


def test_a_user_the_store_refuses_gets_the_refusal_and_no_name(tmp_path: Path) -> None:
    clock = Clock()
    owner = _listings(tmp_path, clock, proofs=ListingProofs(MemoryStore(["b"]), 60.0, clock))
    owner.listing("b", "p/", False, _rows_of_a)
    refused_store = RefusingStore(["b"])
    refused = _listings(tmp_path, clock, proofs=ListingProofs(refused_store, 60.0, clock))
    for _ in range(2):  # a refusal is not kept: asked again, refused again
        with pytest.raises(AccessDeniedError):
            refused.listing("b", "p/", False, _unexpected)
    assert refused_store.request_counts() == {"ListObjectsV2": 2}
    trusting = _listings(tmp_path, clock)  # shared_auth="trust": no proofs
    assert trusting.listing("b", "p/", False, _unexpected)[0] == _rows_of_a()


def _unexpected() -> list[dict[str, Any]]:
    raise AssertionError("listed again: the shared record should have served")
