"""A fetch's, a promotion's and a write-through's bytes count in the tier's usage at every
moment of their publication, once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import tiercache.tiers.local as local_module
from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.promote import promote
from tiercache.store.base import ObjectInfo
from tiercache.tiers.entry import EntryMeta
from tiercache.tiers.local import LocalTier

NS = "s3:test"
SIZE = 100 * 1024
META = EntryMeta.for_object(ObjectInfo("b", "k", SIZE, '"e"'), "s3://b/k", NS, "0" * 16)


def test_a_publishing_fetch_is_never_missing_from_the_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = LocalTier(str(tmp_path / "tier"), 10 * SIZE)
    assert tier.usage() == 0  # a scan kept for the next calls: reserved bytes count on top
    entry_id = tier.entry_id(NS, "b", "k")
    seen: list[int] = []
    install = local_module.install

    def install_and_look(tmp: str, path: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(tier.usage())  # the data renamed into place, its meta not yet there
        return install(tmp, path, *args, **kwargs)

    monkeypatch.setattr(local_module, "install", install_and_look)
    with tier.entry_lock(entry_id, 5.0) as paths:
        fd = tier.create_part(paths)
        try:
            tier.reserve(SIZE)  # as a fetch does once the store said the size
            os.write(fd, os.urandom(SIZE))
            tier.publish(paths, fd, META, reserved=SIZE)
        finally:
            os.close(fd)
    # Released before the publication, the bytes counted nowhere until it ended: fetches
    # beginning then saw room that was not there and took the tier over its budget.
    assert seen == [SIZE]
    assert tier.usage() == SIZE  # once: no longer reserved
    assert tier.usage(fresh=True) == SIZE


def test_a_failed_publication_leaves_the_bytes_reserved_for_the_caller(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), 10 * SIZE)
    entry_id = tier.entry_id(NS, "b", "k")
    with tier.entry_lock(entry_id, 5.0) as paths:
        fd = tier.create_part(paths)
        try:
            tier.reserve(SIZE)
            os.unlink(paths.part)  # nothing to rename: the publication fails
            with pytest.raises(FileNotFoundError):
                tier.publish(paths, fd, META, reserved=SIZE)
        finally:
            os.close(fd)
    assert tier.usage() == SIZE  # still reserved: the fetch's own cleanup releases them
    tier.release(SIZE)
    assert tier.usage() == 0


def _release_and_look(monkeypatch: pytest.MonkeyPatch, tier: LocalTier) -> list[int]:
    """The tier's usage each time a reservation is released (before it is)."""
    seen: list[int] = []
    release = tier.release

    def release_and_look(nbytes: int) -> None:
        seen.append(tier.usage())
        release(nbytes)

    monkeypatch.setattr(tier, "release", release_and_look)
    return seen


def test_a_promotion_counts_its_bytes_once_as_it_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = LocalTier(str(tmp_path / "shared"), 10 * SIZE)
    local = LocalTier(str(tmp_path / "local"), 10 * SIZE)
    entry_id = shared.entry_id(NS, "b", "k")
    with shared.entry_lock(entry_id, 5.0) as paths:
        fd = shared.create_part(paths)
        try:
            os.write(fd, os.urandom(SIZE))
            source = shared.publish(paths, fd, META)
        finally:
            os.close(fd)
    assert local.usage() == 0
    seen = _release_and_look(monkeypatch, local)
    promote(source, local, 5.0)
    # Released after the publication, the bytes counted twice in between.
    assert seen == [SIZE]
    assert local.usage() == SIZE and local.usage(fresh=True) == SIZE


def test_a_write_through_counts_its_bytes_once_as_it_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = TierCacheFileSystem(
        store=MemoryStore(["b"]),
        local_dir=str(tmp_path / "tier"),
        write_mode="through",
        skip_instance_cache=True,
    )
    assert fs.tier.usage() == 0
    seen = _release_and_look(monkeypatch, fs.tier)
    fs.pipe_file("b/k", os.urandom(SIZE))
    assert seen == [SIZE]
    assert fs.tier.usage() == SIZE
