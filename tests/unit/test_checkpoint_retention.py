"""Write-behind with an in-memory store: newest checkpoints stay local, the journal is robust."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache import MemoryStore, TierCacheFileSystem, UploadFailedError
from tiercache.write.state import Record


def _fs(tmp_path: Path, store: MemoryStore, **options: object) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=store, local_dir=str(tmp_path / "t"), skip_instance_cache=True, **options
    )


def _checkpoint(fs: TierCacheFileSystem, step: int) -> list[str]:
    paths = [f"b/ckpt/step-{step}/shard-{i}.distcp" for i in range(2)]
    for path in paths:
        with fs.open(path, "wb") as f:
            f.write(b"x" * 1000)
    with fs.open(f"b/ckpt/step-{step}/.metadata", "wb") as f:
        f.write(b"meta")
    fs.flush(f"b/ckpt/step-{step}", timeout=30)
    return [*paths, f"b/ckpt/step-{step}/.metadata"]


def test_newest_checkpoints_survive_eviction(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store, keep_checkpoints=2)
    steps = {step: _checkpoint(fs, step) for step in (1, 2, 3)}
    report = fs.evict(0)
    assert not any(fs.is_cached(p) for p in steps[1])
    assert all(fs.is_cached(p) for p in steps[2] + steps[3])
    assert report.kept_busy == 6
    assert store.request_counts()["PutObject"] == 9


def test_keep_zero_evicts_every_clean_entry(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store, keep_checkpoints=0)
    paths = _checkpoint(fs, 1)
    fs.evict(0)
    assert not any(fs.is_cached(p) for p in paths)
    assert fs.cat("b/ckpt/step-1/.metadata") == b"meta"  # still readable from the store


def test_garbage_in_the_journal_is_reported_never_dropped(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store)
    journal_dir = Path(fs.tier.root) / "journal"
    (journal_dir / ("0" * 64 + ".json")).write_bytes(b"{torn")
    assert Record.from_json(b"[]") is None
    with fs.open("b/k", "wb") as f:
        f.write(b"value")
    with pytest.raises(UploadFailedError, match="unreadable"):
        fs.flush(timeout=30)  # the good write is uploaded; the torn record is named
    assert store.request_counts()["PutObject"] == 1
    assert [p["state"] for p in fs.pending()] == ["lost"]
    lost = fs.pending()[0]["name"]
    assert fs.discard(lost) == [lost]
    fs.flush(timeout=30)
    assert fs.pending() == []


def test_a_cache_shared_by_two_stores_uploads_each_file_to_its_own(tmp_path: Path) -> None:
    first, second = MemoryStore(["b"]), MemoryStore(["b"])
    fs_first = _fs(tmp_path, first)
    fs_second = _fs(tmp_path, second)
    with fs_first.open("b/one", "wb") as f:
        f.write(b"for the first store")
    with fs_second.open("b/two", "wb") as f:
        f.write(b"for the second store")
    assert "b/two" not in [p["name"] for p in fs_first.pending()]
    fs_first.flush(timeout=30)
    fs_second.flush(timeout=30)
    assert first.head("b", "one").size == len(b"for the first store")
    assert second.head("b", "two").size == len(b"for the second store")
    assert first.request_counts()["PutObject"] == 1  # "two" never went to the first store
    assert second.request_counts()["PutObject"] == 1
    assert first.list_objects("b", "") and [e.key for e in first.list_objects("b", "")] == ["one"]
