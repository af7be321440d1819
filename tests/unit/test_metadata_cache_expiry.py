"""``MetadataCache`` on a fake clock: expiry per mode, invalidation, the write-after-ask rule."""

from __future__ import annotations

import time
from pathlib import Path

from tiercache.metadata.cache import KnownInfo, MetadataCache

NS = "http://store.example:9000"
ROW = {"name": "b/d/a", "type": "file", "size": 3, "ETag": '"e"', "mtime": 1.0}


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _cache(tmp_path: Path, consistency: str, clock: Clock, ttl: float = 10.0) -> MetadataCache:
    return MetadataCache(str(tmp_path), NS, consistency, ttl, clock=clock)


def test_ttl_serves_an_answer_for_ttl_seconds_after_the_store_was_asked(tmp_path: Path) -> None:
    clock = Clock()
    cache = _cache(tmp_path, "ttl", clock)
    asked = clock()
    clock.now += 3  # the store took 3 s to answer: the ttl counts from the question
    cache.remember_info("b", "d/a", "file", ROW, asked)
    cache.remember_listing("b", "d/", False, [ROW], asked)
    clock.now = asked + 9.9
    assert cache.info("b", "d/a") == KnownInfo("file", ROW, asked)
    assert cache.listing("b", "d/", recursive=False) == [ROW]
    clock.now = asked + 10.0
    assert cache.info("b", "d/a") is None
    assert cache.listing("b", "d/", recursive=False) is None
    assert cache.prune() == 2


def test_immutable_keeps_answers_and_always_keeps_none(tmp_path: Path) -> None:
    clock = Clock()
    immutable = _cache(tmp_path / "i", "immutable", clock)
    always = _cache(tmp_path / "a", "always", clock)
    for cache in (immutable, always):
        cache.remember_info("b", "gone", "absent", None, clock())
    clock.now += 10**6
    assert immutable.info("b", "gone") == KnownInfo("absent", None, clock.now - 10**6)
    assert always.info("b", "gone") is None
    assert immutable.prune() == 0 and immutable.prune(everything=True) == 1
    assert list((tmp_path / "a" / "metadata").rglob("*.info")) == []


def test_a_listing_answers_for_its_children(tmp_path: Path) -> None:
    clock = Clock()
    cache = _cache(tmp_path, "ttl", clock)
    subdir = {"name": "b/d/sub", "type": "directory", "size": 0}
    cache.remember_listing("b", "d/", False, [ROW, subdir], clock())
    assert cache.info("b", "d/a") == KnownInfo("file", ROW, clock())
    assert cache.info("b", "d/sub") == KnownInfo("directory", subdir, clock())
    assert cache.info("b", "d/zz") == KnownInfo("absent", None, clock())
    assert cache.info("b", "e/a") is None  # its parent was never listed


def test_a_write_forgets_the_key_its_parents_and_every_listing_above_it(tmp_path: Path) -> None:
    clock = Clock()
    cache = _cache(tmp_path, "immutable", clock)
    asked = clock()
    cache.remember_info("b", "x/y/z", "absent", None, asked)
    cache.remember_info("b", "x", "absent", None, asked)
    cache.remember_info("b", "other", "absent", None, asked)
    for prefix in ("", "x/", "x/y/"):
        cache.remember_listing("b", prefix, False, [], asked)
        cache.remember_listing("b", prefix, True, [], asked)
    cache.remember_listing("b", "other/", False, [], asked)
    clock.now += 1
    cache.invalidate("b", ["x/y/z"])
    assert cache.info("b", "x/y/z") is None and cache.info("b", "x") is None
    for prefix in ("", "x/", "x/y/"):
        assert cache.listing("b", prefix, False) is None
        assert cache.listing("b", prefix, True) is None
    assert cache.info("b", "other") is not None
    assert cache.listing("b", "other/", False) == []


def test_an_answer_asked_before_a_write_is_not_kept(tmp_path: Path) -> None:
    clock = Clock()
    cache = _cache(tmp_path, "ttl", clock)
    asked = clock()  # a reader asks the store ...
    clock.now += 0.5
    cache.invalidate("b", ["k"])  # ... this host writes k meanwhile ...
    clock.now += 0.5
    cache.remember_info("b", "k", "absent", None, asked)  # ... the reader's answer is stale
    cache.remember_listing("b", "", False, [], asked)
    assert cache.info("b", "k") is None
    assert cache.listing("b", "", False) is None
    cache.remember_info("b", "k", "file", ROW, clock())  # asked after the write: kept
    assert cache.info("b", "k") == KnownInfo("file", ROW, clock())


def test_another_store_or_bucket_never_sees_a_record(tmp_path: Path) -> None:
    clock = Clock()
    cache = _cache(tmp_path, "immutable", clock)
    other = MetadataCache(str(tmp_path), "http://elsewhere:9000", "immutable", 10.0, clock=clock)
    cache.remember_info("b", "k", "file", ROW, clock())
    assert other.info("b", "k") is None
    assert cache.info("c", "k") is None


def test_a_replaced_listing_is_read_again(tmp_path: Path) -> None:
    clock = Clock()
    cache = _cache(tmp_path, "ttl", clock)
    cache.remember_listing("b", "d/", False, [ROW], clock())
    assert cache.info("b", "d/a") == KnownInfo("file", ROW, clock())  # parsed, then reused
    clock.now += 1
    cache.remember_listing("b", "d/", False, [], clock())
    assert cache.listing("b", "d/", False) == []
    assert cache.info("b", "d/a") == KnownInfo("absent", None, clock())
