"""Fenced uploads (``write/fence.py``): what the store holds decides, never a stale claim.

An in-memory store stands for S3 with conditional writes; a hook writes another version
into it while an upload is under way, as another host (or another tool) would.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiercache import TierCacheFileSystem
from tiercache.errors import ObjectChangedError
from tiercache.store.memory import MemoryStore
from tiercache.write.fence import upload_metadata
from tiercache.write.state import Record

pytestmark = pytest.mark.partition


class InterposingStore(MemoryStore):
    """Runs ``meanwhile`` once, when an upload has looked at the store and is about to send."""

    def __init__(self) -> None:
        super().__init__(buckets=("b",))
        self.meanwhile: Callable[[], None] | None = None

    def upload_file(self, *args: Any, **kwargs: Any) -> Any:
        hook, self.meanwhile = self.meanwhile, None
        fence = kwargs.get("fence")
        if hook is not None:
            if fence is not None:
                fence.seen()  # the upload's HEAD was answered: what follows is "meanwhile"
            hook()
        return super().upload_file(*args, **kwargs)


def _fs(tmp_path: Path, store: MemoryStore) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=store, local_dir=str(tmp_path / "local"), skip_instance_cache=True
    )


def _write(fs: TierCacheFileSystem, data: bytes) -> Record:
    with fs.open("b/ckpt.pt", "wb") as f:
        f.write(data)
    (record,) = fs._runtime.write_state.records()
    return record


def _held(store: MemoryStore) -> bytes:
    return store._buckets["b"]["ckpt.pt"].data


def test_a_newer_version_uploaded_meanwhile_supersedes_this_one(tmp_path: Path) -> None:
    store = InterposingStore()
    fs = _fs(tmp_path, store)
    record = _write(fs, b"v1" * 1000)
    newer = Record(**{**record.__dict__, "generation": record.generation + 1, "digest": "x"})
    store.meanwhile = lambda: store.put_bytes("b", "ckpt.pt", b"v2", upload_metadata(newer))
    fs.flush(timeout=30)  # succeeds: superseded is not a failure
    assert _held(store) == b"v2"
    assert fs.pending() == []
    assert [n["name"] for n in fs.superseded()] == ["b/ckpt.pt"]
    assert "newer acknowledged version" in fs.superseded()[0]["why"]
    assert fs.stats()["uploads_superseded"] == 1
    assert fs.cat_file("b/ckpt.pt") == b"v2"  # the superseded version is not served either


def test_a_version_written_outside_meanwhile_supersedes_this_one(tmp_path: Path) -> None:
    store = InterposingStore()
    fs = _fs(tmp_path, store)
    _write(fs, b"v1" * 1000)
    store.meanwhile = lambda: store.put_bytes("b", "ckpt.pt", b"other tool")
    fs.flush(timeout=30)
    assert _held(store) == b"other tool"
    assert "outside tiercache" in fs.superseded()[0]["why"]


def test_this_version_delivered_by_another_host_is_marked_clean(tmp_path: Path) -> None:
    store = InterposingStore()
    fs = _fs(tmp_path, store)
    data = os.urandom(3000)
    record = _write(fs, data)
    store.meanwhile = lambda: store.put_bytes("b", "ckpt.pt", data, upload_metadata(record))
    fs.flush(timeout=30)
    assert _held(store) == data
    assert fs.superseded() == []
    stats = fs.stats()
    assert stats["uploads_delivered_elsewhere"] == 1
    # The other host's PUT, and this one's, refused by its condition (412): nothing sent after.
    assert store.request_counts().get("PutObject") == 2
    assert fs.is_cached("b/ckpt.pt")


def test_an_older_version_landing_late_is_overwritten(tmp_path: Path) -> None:
    store = InterposingStore()
    fs = _fs(tmp_path, store)
    data = os.urandom(3000)
    record = _write(fs, data)
    older = Record(**{**record.__dict__, "generation": record.generation - 1, "digest": "x"})
    store.meanwhile = lambda: store.put_bytes("b", "ckpt.pt", b"old", upload_metadata(older))
    fs.flush(timeout=30)  # refused once (412), then sent again on the new ETag
    assert hashlib.sha256(_held(store)).digest() == hashlib.sha256(data).digest()
    assert fs.superseded() == []


def test_a_store_without_conditional_writes_is_overwritten_as_documented(
    tmp_path: Path,
) -> None:
    store = InterposingStore()
    store.conditional = False
    fs = _fs(tmp_path, store)
    data = os.urandom(3000)
    _write(fs, data)
    store.meanwhile = lambda: store.put_bytes("b", "ckpt.pt", b"other tool")
    fs.flush(timeout=30)
    assert _held(store) == data  # the window the guarantees page states


def test_a_lost_claim_sends_nothing_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = InterposingStore()
    fs = _fs(tmp_path, store)
    _write(fs, b"v1" * 1000)
    state = fs._runtime.write_state
    monkeypatch.setattr(state, "still_claimed", lambda entry_id, claim: False)
    fs._runtime.uploader.retry_now([r.entry_id for r in state.records()])
    for _ in range(500):  # the upload attempt runs on the uploader's thread
        if fs.stats()["uploads_claim_lost"]:
            break
        time.sleep(0.02)
    assert fs.stats()["uploads_claim_lost"] >= 1
    assert store.request_counts().get("PutObject", 0) == 0
    assert [r.state for r in state.records()] == ["dirty"]  # not failed, not lost
    monkeypatch.undo()
    fs.flush(timeout=30)
    assert _held(store) == b"v1" * 1000


def test_an_outcome_never_rebuilds_a_record_another_process_ended(tmp_path: Path) -> None:
    store = MemoryStore(buckets=("b",))
    fs = _fs(tmp_path, store)
    record = _write(fs, b"v1")
    fs.flush(timeout=30)  # ended: uploaded, record gone
    state = fs._runtime.write_state
    state.failed(record, "UploadPart: no such upload")  # a resumed host's stale verdict
    state.lost(record, "gone")
    assert state.records() == []
    fs.flush(timeout=30)


class MisjudgingStore(MemoryStore):
    """Answers ``If-None-Match: *`` with 412 even for a key it does not hold (Ceph RGW 16)."""

    def _put(self, bucket: str, key: str, data: bytes, metadata: Any, condition: Any) -> Any:
        if condition is not None and condition.etag is None and self.conditional:
            raise ObjectChangedError(f"memory://{bucket}/{key}: precondition failed")
        return super()._put(bucket, key, data, metadata, condition)


def test_a_store_that_misjudges_a_condition_gets_the_write_without_conditions(
    tmp_path: Path,
) -> None:
    store = MisjudgingStore(buckets=("b",))
    fs = _fs(tmp_path, store)
    _write(fs, b"v1" * 1000)
    fs.flush(timeout=30)
    assert _held(store) == b"v1" * 1000
    assert store.conditional_writes("b") is False  # remembered: no 412 loop on every upload
    assert fs.superseded() == []
