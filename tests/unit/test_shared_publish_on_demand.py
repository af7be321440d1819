"""A new object written behind on the shared tier is committed as its record and journal copy
alone: its entry is published when it is first read or once it is uploaded, and the tier's
budget counts its bytes exactly once at every step."""

from __future__ import annotations

import glob
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from support.gated_store import GatedStore

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.errors import CacheCorruptError
from tiercache.tiers.local import LocalTier

KiB = 1024


def _fs(tmp_path: Path, store: MemoryStore, local: str = "local") -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / local),
        shared_dir=str(tmp_path / "shared"),
        write_tier="shared",
        skip_instance_cache=True,
    )


def _shared_tier(fs: TierCacheFileSystem) -> LocalTier:
    tier = fs._runtime.write_state.tier
    assert tier.name == "shared"
    return tier


def _metas(tmp_path: Path) -> list[dict[str, Any]]:
    found = []
    for path in glob.glob(str(tmp_path / "shared" / "objects" / "*" / "*.meta")):
        with open(path, "rb") as f:
            found.append(json.loads(f.read()))
    return found


def _journal(tmp_path: Path, suffix: str) -> list[str]:
    return glob.glob(str(tmp_path / "shared" / "journal" / f"*{suffix}"))


@pytest.fixture
def store() -> GatedStore:
    gated = GatedStore(at_most=None)
    yield gated
    gated.gate.set()  # no upload thread is left waiting


def test_close_publishes_no_entry_and_the_budget_counts_the_journal_copy(
    tmp_path: Path, store: GatedStore, caplog: pytest.LogCaptureFixture
) -> None:
    data = os.urandom(300 * KiB + 5)
    fs = _fs(tmp_path, store)
    tier = _shared_tier(fs)
    with fs.open("b/k", "wb") as f:
        f.write(data)
    assert _metas(tmp_path) == []
    assert len(_journal(tmp_path, ".json")) == 1
    assert len(_journal(tmp_path, ".bytes")) == 1
    assert tier.unpublished_bytes() == len(data)
    assert tier.usage(fresh=True) == len(data)
    assert tier.usage() >= len(data)  # this process counted it at its commit
    assert not os.listdir(tmp_path / "shared" / "staging")

    with caplog.at_level(logging.WARNING, logger="tiercache"):
        assert _fs(tmp_path, store, local="other").cat("b/k") == data  # another host
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (meta,) = _metas(tmp_path)
    assert meta["state"] == "dirty"
    assert tier.unpublished_bytes() == 0  # the journal copy is the entry's data now
    assert tier.usage(fresh=True) == len(data)
    assert fs.pending()[0]["name"] == "b/k"


def test_close_makes_no_directory_and_lists_no_journal(
    tmp_path: Path, store: GatedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On ceph-fuse every metadata call a close() makes waits behind the fsync of the bytes:
    the entry's directory and the dirty budget's reading of the journal come at open()."""
    fs = _fs(tmp_path, store)
    shared = str(tmp_path / "shared")
    made: list[str] = []
    listed: list[str] = []
    real_mkdir, real_listdir = os.mkdir, os.listdir

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).startswith(shared):  # the local tier's calls cost no round trip
            made.append(str(path))
        real_mkdir(path, *args, **kwargs)

    def listdir(path: Any = ".") -> list[str]:
        if str(path).startswith(shared):
            listed.append(str(path))
        return real_listdir(path)

    for i in range(3):  # a new object each: a new shard of objects/ each time
        f = fs.open(f"b/k{i}", "wb")
        f.write(os.urandom(2 * KiB))
        with monkeypatch.context() as patched:
            patched.setattr(os, "mkdir", mkdir)
            patched.setattr(os, "listdir", listdir)
            f.close()
        assert made == [] and listed == [], (made, listed)
    assert len(_journal(tmp_path, ".json")) == 3


def test_the_upload_publishes_the_clean_entry_other_hosts_read(
    tmp_path: Path, store: GatedStore
) -> None:
    data = os.urandom(200 * KiB)
    fs = _fs(tmp_path, store)
    with fs.open("b/k", "wb") as f:
        f.write(data)
    store.gate.set()
    fs.flush(timeout=30)
    assert store.head("b", "k").size == len(data)
    (meta,) = _metas(tmp_path)
    assert meta["state"] == "clean" and meta["etag"]
    assert _journal(tmp_path, ".json") == [] and _journal(tmp_path, ".bytes") == []
    tier = _shared_tier(fs)
    assert tier.usage(fresh=True) == len(data)
    gets = store.request_counts().get("GetObject", 0)
    assert _fs(tmp_path, store, local="other").cat("b/k") == data
    assert store.request_counts().get("GetObject", 0) == gets  # read from the shared tier


def test_a_write_over_a_cached_entry_replaces_it_at_once(tmp_path: Path, store: GatedStore) -> None:
    store.gate.set()
    fs = _fs(tmp_path, store)
    with fs.open("b/k", "wb") as f:
        f.write(b"old" * 1000)
    fs.flush(timeout=30)
    store.gate.clear()
    new = os.urandom(100 * KiB)
    with fs.open("b/k", "wb") as f:
        f.write(new)
    (meta,) = _metas(tmp_path)
    assert meta["state"] == "dirty" and meta["size"] == len(new)
    assert _fs(tmp_path, store, local="other").cat("b/k") == new


def test_fsck_does_not_call_an_unpublished_write_damaged(tmp_path: Path, store: GatedStore) -> None:
    data = os.urandom(100 * KiB)
    with _fs(tmp_path, store).open("b/k", "wb") as f:
        f.write(data)
    report = _fs(tmp_path, store, local="fresh").fsck(scrub=False)
    assert report["damaged"] == [] and report["lost"] == []
    assert _metas(tmp_path) == []  # still published on demand only
    (copy,) = _journal(tmp_path, ".bytes")
    with open(copy, "r+b") as f:
        f.write(b"\0" * 16)  # the only copy of the pending bytes is damaged
    scrub = _fs(tmp_path, store, local="scrub")
    scrub.fsck(scrub=True)  # or an uploader's check before it: whichever reads it first
    assert [row["state"] for row in scrub.pending()] == ["lost"]


def test_a_reader_never_gets_the_store_s_older_version_when_the_copy_is_gone(
    tmp_path: Path, store: GatedStore
) -> None:
    store.gate.set()
    store.put_bytes("b", "k", b"older version")  # in the store, cached nowhere
    store.gate.clear()
    with _fs(tmp_path, store).open("b/k", "wb") as f:
        f.write(os.urandom(50 * KiB))
    assert _metas(tmp_path) == []
    (copy,) = _journal(tmp_path, ".bytes")
    os.unlink(copy)
    with pytest.raises(CacheCorruptError):
        _fs(tmp_path, store, local="other").cat("b/k")


def test_a_dead_writer_s_closed_file_is_committed_from_the_shared_tier(
    tmp_path: Path, store: GatedStore
) -> None:
    store.gate.set()
    data = os.urandom(2 * 1024 * KiB + 3)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            f = _fs(tmp_path, store).open("b/k", "wb")
            f.write(data)
            f.mark_closed(store.namespace)  # a mount's file, still open elsewhere
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fs = _fs(tmp_path, store, local="after")
    fs.flush(timeout=30)
    assert store.head("b", "k").size == len(data)
    assert _fs(tmp_path, store, local="reader").cat("b/k") == data
    assert not os.listdir(tmp_path / "shared" / "staging")
