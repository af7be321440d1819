"""A reader that waited for another process's fetch of an object joins it, also when that
fetch's GET began before the reader opened the object (``consistency="always"``): one HEAD
says whether those bytes are still current, instead of a second GET of the whole object.

The other process is played by the test: it holds the entry's lock (``flock`` on another open
file description conflicts within one process too) and publishes the object under it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.store.base import ObjectInfo
from tiercache.tiers.entry import EntryMeta

MiB = 1024 * 1024


def _fs(tmp_path: Path, store: MemoryStore, **options: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=store, local_dir=str(tmp_path / "t"), skip_instance_cache=True, **options
    )


def _read_while_another_process_fetches(
    fs: TierCacheFileSystem,
    store: MemoryStore,
    published: tuple[ObjectInfo, bytes],
    asked_before: float,
    then: Callable[[], None] = lambda: None,
) -> bytes:
    """Read ``b/k`` while "another process" holds its lock and publishes ``published``, whose
    GET it sent ``asked_before`` seconds ago, then runs ``then`` (still under the lock)."""
    entry_id = fs.read_path.entry_id("b", "k")
    info, data = published
    got: list[bytes] = []
    with fs.tier.entry_lock(entry_id, timeout=10) as paths:
        reader = threading.Thread(target=lambda: got.append(bytes(fs.cat_file("b/k"))))
        reader.start()
        deadline = time.monotonic() + 10
        while fs.read_path.in_flight("b", "k") is None:  # it missed, and waits for the lock
            assert time.monotonic() < deadline
            time.sleep(0.001)
        time.sleep(0.05)
        fd = fs.tier.create_part(paths)
        try:
            os.write(fd, data)
            digest = xxhash.xxh3_64_hexdigest(data)
            asked_at = time.time() - asked_before
            meta = EntryMeta.for_object(info, "s3://b/k", store.namespace, digest, asked_at)
            fs.tier.publish(paths, fd, meta)
        finally:
            os.close(fd)
        then()
    reader.join(timeout=10)
    assert not reader.is_alive()
    return got[0]


def test_a_fetch_begun_before_the_open_is_joined_after_one_head(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    data = os.urandom(3 * MiB)
    store.put_bytes("b", "k", data)
    fs = _fs(tmp_path, store, consistency="always")
    published = (store.head("b", "k"), data)
    before = store.request_counts()
    assert _read_while_another_process_fetches(fs, store, published, asked_before=5.0) == data
    counts = store.request_counts()
    assert counts.get("GetObject", 0) == before.get("GetObject", 0)  # no second fetch
    assert counts["HeadObject"] == before["HeadObject"] + 1
    stats = fs.stats()
    assert (stats["fetches"], stats["fetches_joined_other_process"]) == (0, 1)
    assert stats["revalidations"] == 1


def test_an_entry_the_store_replaced_meanwhile_is_fetched_anew(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    old, new = os.urandom(2 * MiB), os.urandom(2 * MiB)
    store.put_bytes("b", "k", old)
    fs = _fs(tmp_path, store, consistency="always")

    def replace() -> None:  # after the other process's GET: its bytes are stale
        store.replace("b", "k", new)

    published = (store.head("b", "k"), old)
    assert _read_while_another_process_fetches(fs, store, published, 5.0, then=replace) == new
    fs.wait_fetches()
    stats = fs.stats()
    assert (stats["fetches"], stats["fetches_joined_other_process"]) == (1, 0)
    entry = fs.read_path.cached("b", "k")
    assert entry is not None and entry.meta.etag == store.head("b", "k").etag


def test_ttl_mode_joins_without_asking_the_store(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    data = os.urandom(MiB)
    store.put_bytes("b", "k", data)
    fs = _fs(tmp_path, store)  # ttl: an entry validated within ttl seconds is taken as it is
    published = (store.head("b", "k"), data)
    before = store.request_counts()
    assert _read_while_another_process_fetches(fs, store, published, asked_before=5.0) == data
    assert store.request_counts() == before
    assert fs.stats()["fetches_joined_other_process"] == 1
