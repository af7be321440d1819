"""What a read-write mount remembers of metadata in each consistency mode; its look-ahead."""

from __future__ import annotations

import threading
import time

import pytest

from tiercache.metadata.freshness import Freshness
from tiercache.mount.lookahead import MetadataLookAhead
from tiercache.mount.stored import SETTLED, SetAttrs, StoredMetadata, Version

NOW = 1_700_000_000.0
OLD = Version("etag-1", 10, int(NOW - 100))  # LastModified well before the HEAD
MODE = SetAttrs(mode=0o600)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def remembered(
    consistency: str, version: Version = OLD, ttl: float = 60.0
) -> tuple[StoredMetadata, Clock]:
    clock = Clock()
    stored = StoredMetadata(Freshness(consistency, ttl, clock))
    stored.remember("/f", version, MODE, NOW)
    return stored, clock


def test_immutable_serves_by_etag_for_ever() -> None:
    stored, clock = remembered("immutable")
    clock.now += 10**6
    assert stored.known("/f", Version("etag-1", 10, None), vouched=False) == MODE
    assert stored.known("/f", Version("etag-2", 10, OLD.modified), vouched=True) is None


def test_ttl_serves_for_the_ttl_then_what_a_listing_vouches_for() -> None:
    stored, clock = remembered("ttl")
    clock.now += 59
    assert stored.known("/f", Version("etag-1", 10, None), vouched=False) == MODE
    clock.now += 2
    assert stored.known("/f", OLD, vouched=False) is None  # a tier copy's LastModified
    assert stored.known("/f", OLD, vouched=True) == MODE
    # Metadata set elsewhere: the same ETag, a new LastModified.
    assert stored.known("/f", Version("etag-1", 10, int(clock.now)), vouched=True) is None


def test_always_serves_only_what_a_store_answer_of_the_moment_vouches_for() -> None:
    stored, _ = remembered("always")
    assert stored.known("/f", OLD, vouched=False) is None
    assert stored.known("/f", OLD, vouched=True) == MODE
    assert stored.known("/f", Version("etag-1", 10, None), vouched=True) is None


def test_a_last_modified_within_the_second_of_the_head_vouches_for_nothing() -> None:
    recent = Version("etag-1", 10, int(NOW - SETTLED + 1))
    stored, _ = remembered("always", recent)
    assert stored.known("/f", recent, vouched=True) is None


def test_forgetting_and_newer_reads_win_over_older_reads() -> None:
    stored, _ = remembered("immutable")
    stored.remember("/f", OLD, SetAttrs(mode=0o644), NOW - 1)  # a HEAD begun earlier
    assert stored.known("/f", OLD, vouched=True) == MODE
    stored.forget("/f")
    stored.remember("/f", OLD, SetAttrs(mode=0o644), time.time() - 1)  # begun before forget
    assert stored.known("/f", OLD, vouched=True) is None
    stored.remember("/f", OLD, SetAttrs(mode=0o640), time.time() + 1)
    assert stored.known("/f", OLD, vouched=True) == SetAttrs(mode=0o640)


def test_the_number_of_paths_remembered_is_bounded() -> None:
    stored = StoredMetadata(Freshness("immutable", 0.0), limit=3)
    for i in range(5):
        stored.remember(f"/f{i}", OLD, MODE, NOW)
    assert [stored.known(f"/f{i}", OLD, vouched=True) for i in range(5)] == [None] * 2 + [MODE] * 3


@pytest.mark.parametrize(("stats", "read"), [(["/d/a"], []), (["/d/a", "/d/b"], ["/d/c", "/d/d"])])
def test_look_ahead_follows_stats_in_listing_order(stats: list[str], read: list[str]) -> None:
    done: list[str] = []
    lock = threading.Lock()

    def reader(path: str) -> None:
        with lock:
            done.append(path)

    ahead = MetadataLookAhead(reader, window=2, threads=1)
    ahead.listed("/d", ["/d/a", "/d/b", "/d/c", "/d/d", "/d/e"])
    for path in stats:
        ahead.wanted(path)
    deadline = time.monotonic() + 5
    while sorted(done) != read and time.monotonic() < deadline:
        time.sleep(0.01)
    ahead.close()
    assert sorted(done) == read
