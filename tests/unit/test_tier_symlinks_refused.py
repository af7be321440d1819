"""No symlink planted in a tier is followed: ``journal/`` (local and shared), ``metrics/``,
``checkpoints/``, ``commit-holds/`` and the lease files, and the files of the journal.

Each test plants a link to a directory (or file) outside the tier, does what a user does, and
checks that nothing was written outside and that the user got a clear error or was served.
``objects/``, ``staging/`` and ``metadata/`` are covered by ``test_tier_keys.py`` and
``test_tier_lookup_memo.py``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from support.gated_store import GatedStore

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.config import TierCacheConfig
from tiercache.metrics.node import NodeReader
from tiercache.metrics.publish import Publisher
from tiercache.mount.control import state_path
from tiercache.write.state import Record

pytestmark = pytest.mark.partition

KiB = 1024


@pytest.fixture
def store() -> Any:
    gated = GatedStore()
    yield gated
    gated.gate.set()  # no upload thread is left waiting


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside every tier, where a planted link points."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


def _fs(tmp_path: Path, store: MemoryStore, shared: bool = False) -> TierCacheFileSystem:
    extra: dict[str, Any] = {}
    if shared:
        extra = {"shared_dir": str(tmp_path / "shared"), "write_tier": "shared"}
    return TierCacheFileSystem(
        store=store, local_dir=str(tmp_path / "local"), skip_instance_cache=True, **extra
    )


def _plant(tier: Path, name: str, target: Path) -> Path:
    """Make the tier's root and plant ``tier/name`` as a link to ``target``."""
    tier.mkdir(exist_ok=True)
    link = tier / name
    os.symlink(target, link)
    return link


def _write(fs: TierCacheFileSystem, path: str, data: bytes) -> None:
    with fs.open(path, "wb") as f:
        f.write(data)


def test_a_symlinked_local_journal_is_refused(
    tmp_path: Path, store: GatedStore, outside: Path
) -> None:
    _plant(tmp_path / "local", "journal", outside)
    with pytest.raises(PermissionError, match="symlink") as refused:
        _write(_fs(tmp_path, store), "b/k", b"x" * KiB)
    assert refused.value.filename == os.path.join(os.path.realpath(tmp_path / "local"), "journal")
    assert list(outside.iterdir()) == []


def test_a_symlinked_shared_journal_is_refused(
    tmp_path: Path, store: GatedStore, outside: Path
) -> None:
    _plant(tmp_path / "shared", "journal", outside)
    with pytest.raises(PermissionError, match="symlink") as refused:
        _write(_fs(tmp_path, store, shared=True), "b/k", b"x" * KiB)
    assert refused.value.filename == os.path.join(os.path.realpath(tmp_path / "shared"), "journal")
    assert list(outside.iterdir()) == []


def test_a_symlinked_metrics_directory_is_refused(
    tmp_path: Path, store: GatedStore, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _plant(tmp_path / "local", "metrics", outside)
    fs = _fs(tmp_path, store)
    root = os.path.realpath(tmp_path / "local")  # as the tier resolves it
    publisher = Publisher(interval=3600)
    publisher.track(root, fs, lambda: {"hits": 1.0})
    with caplog.at_level(logging.WARNING, logger="tiercache.metrics"):
        publisher.publish_now()  # best effort: said once, and nothing written
    link = os.path.join(root, "metrics")
    assert any("symlink" in r.getMessage() and link in r.getMessage() for r in caplog.records)
    with pytest.raises(PermissionError, match="symlink"):  # ``tiercache metrics``, ``stats``
        NodeReader(TierCacheConfig(local_dir=str(tmp_path / "local")))
    assert list(outside.iterdir()) == []


def test_a_symlinked_lease_directory_is_refused(
    tmp_path: Path, store: GatedStore, outside: Path
) -> None:
    # Commit holds are leases on the shared tier, kept alive by their holder's heartbeat.
    _plant(tmp_path / "shared", "commit-holds", outside)
    with pytest.raises(PermissionError, match="symlink"):
        _fs(tmp_path, store, shared=True).commit_holds.hold("b", "ckpt")
    assert list(outside.iterdir()) == []


def test_a_symlinked_checkpoints_directory_is_refused(
    tmp_path: Path, store: GatedStore, outside: Path
) -> None:
    _plant(tmp_path / "local", "checkpoints", outside)
    with pytest.raises(PermissionError, match="symlink"):
        _write(_fs(tmp_path, store), "b/ckpt/.metadata", b"marker")
    assert list(outside.iterdir()) == []


def test_a_lease_file_planted_as_a_symlink_is_never_followed(tmp_path: Path, outside: Path) -> None:
    store = MemoryStore(buckets=("b",))
    store.put_bytes("b", "k", b"object")
    fs = TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / "local"),
        shared_dir=str(tmp_path / "shared"),
        lease_stale_after=0.2,
        skip_instance_cache=True,
    )
    shared = fs._runtime.shared
    assert shared is not None
    lease = shared.paths(fs.read_path.entry_id("b", "k")).lock
    target = outside / "lease"
    target.write_bytes(b"not a lease")
    os.symlink(target, lease)
    os.utime(lease, (1.0, 1.0), follow_symlinks=False)  # a lease that went stale long ago
    os.utime(target, None)  # its target looks alive: the link's own age is what counts
    assert fs.cat("b/k") == b"object"  # the planted lease is broken, never written through
    assert target.read_bytes() == b"not a lease"
    assert sorted(p.name for p in outside.iterdir()) == ["lease"]
    assert not os.path.islink(lease)


def test_a_journal_copy_planted_as_a_symlink_is_never_written_through(
    tmp_path: Path, store: GatedStore, outside: Path
) -> None:
    fs = _fs(tmp_path, store)
    _write(fs, "b/k", b"first")
    entry_id = fs.read_path.entry_id("b", "k")
    journal = tmp_path / "local" / "journal"
    record_path = journal / f"{entry_id}.json"
    # A record written by a host whose clock runs ahead: the next generation is this one's
    # successor, so its journal copy's name is known in advance.
    record = json.loads(record_path.read_bytes())
    record["generation"] += 10**15
    record_path.write_text(json.dumps(record))
    planted = journal / f"{entry_id}.{record['generation'] + 1}.bytes"
    os.symlink(outside / "stolen", planted)
    _write(fs, "b/k", b"second")  # served: the planted name is replaced, not written through
    assert list(outside.iterdir()) == []
    assert not planted.is_symlink()
    assert planted.read_bytes() == b"second"
    assert fs.cat("b/k") == b"second"


def test_a_record_planted_as_a_symlink_is_not_read_through(
    tmp_path: Path, store: GatedStore, outside: Path
) -> None:
    fs = _fs(tmp_path, store)
    entry_id = fs.read_path.entry_id("b", "k")
    foreign = Record(
        entry_id=entry_id,
        bucket="b",
        key="secret",
        source="s3://b/secret",
        namespace=store.namespace,
        size=3,
        digest="0" * 16,
        generation=1,
        created_at=time.time(),
    )
    target = outside / "record.json"
    target.write_bytes(foreign.to_json())
    os.symlink(target, tmp_path / "local" / "journal" / f"{entry_id}.json")
    assert all(row["name"] != "b/secret" for row in fs.pending())
    _write(fs, "b/k", b"mine")  # the link is replaced by this write's own record
    assert [row["name"] for row in fs.pending()] == ["b/k"]
    assert target.read_bytes() == foreign.to_json()
    assert sorted(p.name for p in outside.iterdir()) == ["record.json"]


@pytest.mark.parametrize("tier", ["local", "shared"])
def test_a_symlinked_metadata_directory_is_refused(
    tmp_path: Path, store: GatedStore, outside: Path, tier: str
) -> None:
    # The listings kept for every host (shared) and this host's metadata cache (local).
    _plant(tmp_path / tier, "metadata", outside)
    with pytest.raises(PermissionError, match="symlink"):
        fs = _fs(tmp_path, store, shared=True)
        fs.ls("b/")
    assert list(outside.iterdir()) == []


def test_a_symlinked_mounts_directory_is_refused(tmp_path: Path, outside: Path) -> None:
    # A mount's log and counters live in LOCAL/mounts.
    (tmp_path / "local").mkdir()
    _plant(tmp_path / "local", "mounts", outside)
    with pytest.raises(PermissionError, match="symlink"):
        state_path(str(tmp_path / "local"), str(tmp_path), "log")
    assert list(outside.iterdir()) == []
