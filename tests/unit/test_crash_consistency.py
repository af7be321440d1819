"""Entries survive process crashes as published; after a reboot they are checked before use."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from tiercache import MemoryStore, TierCacheFileSystem


def _fs(tmp_path: Path, store: MemoryStore) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / "t"),
        consistency="immutable",
        skip_instance_cache=True,
    )


def _pretend_previous_boot(fs: TierCacheFileSystem, key: str) -> str:
    entry = fs.read_path.cached("b", key)
    assert entry is not None and entry.meta.boot_id == fs.tier.boot_id != ""
    fs.tier.replace_meta(entry, dataclasses.replace(entry.meta, boot_id="an-earlier-boot"))
    return entry.paths.data


def test_entry_from_an_earlier_boot_is_verified_once(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    store.put_bytes("b", "k", b"intact bytes")
    fs = _fs(tmp_path, store)
    assert fs.cat("b/k") == b"intact bytes"
    fs.wait_fetches()
    _pretend_previous_boot(fs, "k")
    assert fs.cat("b/k") == b"intact bytes"
    entry = fs.read_path.cached("b", "k")
    assert entry is not None and entry.meta.boot_id == fs.tier.boot_id  # re-stamped
    assert store.request_counts()["GetObject"] == 1 and fs.stats()["corrupt_entries"] == 0


def test_torn_entry_from_an_earlier_boot_is_refetched(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    store.put_bytes("b", "k", b"the real object")
    fs = _fs(tmp_path, store)
    fs.cat("b/k")
    fs.wait_fetches()
    data_path = _pretend_previous_boot(fs, "k")
    Path(data_path).write_bytes(b"\0" * len(b"the real object"))  # blocks lost in a power cut
    assert fs.cat("b/k") == b"the real object"
    assert fs.stats()["corrupt_entries"] == 1
    assert store.request_counts()["GetObject"] == 2


def test_garbage_metadata_is_a_miss_not_an_error(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    store.put_bytes("b", "k", b"object")
    fs = _fs(tmp_path, store)
    fs.cat("b/k")
    fs.wait_fetches()
    entry = fs.read_path.cached("b", "k")
    assert entry is not None
    for garbage in (b"", b"{not json", json.dumps({"size": "big"}).encode(), os.urandom(64)):
        Path(entry.paths.meta).write_bytes(garbage)
        assert fs.read_path.cached("b", "k") is None
        assert fs.cat("b/k") == b"object"
        fs.wait_fetches()


def test_verify_always_catches_a_file_corrupted_on_disk(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(64 * 1024)
    store.put_bytes("b", "k", payload)
    fs = TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / "t"),
        consistency="immutable",
        verify="always",
        skip_instance_cache=True,
    )
    assert fs.cat("b/k") == payload
    fs.wait_fetches()
    entry = fs.read_path.cached("b", "k")
    assert entry is not None
    flipped = bytearray(payload)
    flipped[1000] ^= 0xFF  # one bit flip, same size: only the digest can tell
    Path(entry.paths.data).write_bytes(bytes(flipped))
    assert fs.cat("b/k") == payload
    assert fs.stats()["corrupt_entries"] == 1
    assert fs.cat("b/k") == payload  # the refetched entry verifies clean
    assert fs.stats()["corrupt_entries"] == 1 and store.request_counts()["GetObject"] == 2
