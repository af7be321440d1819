"""A tier lookup reuses the metadata it parsed only while the file is the one it read."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

import tiercache.tiers.local as local_module
from tiercache.store.base import ObjectInfo
from tiercache.tiers.entry import EntryMeta
from tiercache.tiers.local import LocalTier

NS = "s3:test"
SOURCE = "s3://b/k"


def _publish(tier: LocalTier, data: bytes, etag: str) -> str:
    entry_id = tier.entry_id(NS, "b", "k")
    with tier.entry_lock(entry_id, 5.0) as paths:
        fd = tier.create_part(paths)
        try:
            os.write(fd, data)
            meta = EntryMeta.for_object(ObjectInfo("b", "k", len(data), etag), SOURCE, NS, "0" * 16)
            tier.publish(paths, fd, meta)
        finally:
            os.close(fd)
    return entry_id


def test_a_replaced_or_republished_meta_is_read_again(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), 1 << 30)
    entry_id = _publish(tier, b"one", '"e1"')
    first = tier.lookup(entry_id, NS, SOURCE)
    assert first is not None and first.meta.etag == '"e1"'
    assert tier.lookup(entry_id, NS, SOURCE) == first  # unchanged: the same answer

    revalidated = dataclasses.replace(first.meta, validated_at=first.meta.validated_at + 100)
    tier.replace_meta(first, revalidated)
    again = tier.lookup(entry_id, NS, SOURCE)
    assert again is not None and again.meta.validated_at == revalidated.validated_at

    _publish(tier, b"two!", '"e2"')
    newer = tier.lookup(entry_id, NS, SOURCE)
    assert newer is not None and (newer.meta.etag, newer.meta.size) == ('"e2"', 4)

    os.unlink(newer.paths.meta)
    assert tier.lookup(entry_id, NS, SOURCE) is None  # gone: never the remembered one


def test_a_symlinked_meta_is_not_followed(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), 1 << 30)
    entry_id = _publish(tier, b"one", '"e1"')
    entry = tier.lookup(entry_id, NS, SOURCE)
    assert entry is not None
    elsewhere = tmp_path / "planted.meta"
    elsewhere.write_bytes(Path(entry.paths.meta).read_bytes())
    os.unlink(entry.paths.meta)
    os.symlink(elsewhere, entry.paths.meta)
    assert tier.lookup(entry_id, NS, SOURCE) is None


def test_an_access_keeps_the_parse_and_moves_the_lru_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = LocalTier(str(tmp_path / "tier"), 1 << 30)
    entry_id = _publish(tier, b"one", '"e1"')
    entry = tier.lookup(entry_id, NS, SOURCE)
    assert entry is not None
    os.utime(entry.paths.meta, ns=(10**18, 10**18))  # an old access
    entry = tier.lookup(entry_id, NS, SOURCE)
    assert entry is not None
    parses: list[str] = []
    real = local_module.read_meta
    monkeypatch.setattr(local_module, "read_meta", lambda path: parses.append(path) or real(path))
    for _ in range(5):
        tier.touch(entry)
        again = tier.lookup(entry_id, NS, SOURCE)
        assert again is not None and again.meta is entry.meta
    assert parses == []  # every open touches the meta: none parsed it again
    assert os.stat(entry.paths.meta).st_mtime_ns > 10**18 + 10**9  # the LRU clock moved

    # Republished after the touch (a new file, its own inode): read again, never the old.
    _publish(tier, b"two!", '"e2"')
    tier.touch(entry)  # a reader of the old version records its access late
    newer = tier.lookup(entry_id, NS, SOURCE)
    assert newer is not None and (newer.meta.etag, newer.meta.size) == ('"e2"', 4)
    assert len(parses) == 1
