"""Upload while writing: a large file's parts leave while it is written; nothing lands early."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tiercache import TierCacheFileSystem
from tiercache.store.memory import MemoryStore
from tiercache.store.multipart import PartGovernor
from tiercache.write import uploader

MiB = 1024 * 1024
PART = 5 * MiB  # MemoryStore's part size


def _fs(tmp_path: Path, store: MemoryStore, **options: Any) -> TierCacheFileSystem:
    options.setdefault("local_dir", str(tmp_path / "t"))
    options.setdefault("upload_while_writing", "on")  # whatever the cores of this machine
    return TierCacheFileSystem(store=store, skip_instance_cache=True, **options)


def _wait_for(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _parts_sent(store: MemoryStore) -> int:
    return store.request_counts().get("UploadPart", 0)


def _write_in_chunks(f: Any, data: bytes, chunk: int = MiB) -> None:
    for offset in range(0, len(data), chunk):
        f.write(data[offset : offset + chunk])


def _sidecars(fs: TierCacheFileSystem) -> list[str]:
    return [n for n in os.listdir(fs.tier.staging_dir) if n.endswith(".mpu")]


def test_parts_leave_while_the_file_is_written_and_land_only_after_close(
    tmp_path: Path,
) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store)
    data = os.urandom(3 * PART + 123)
    f = fs.open("b/ckpt", "wb")
    _write_in_chunks(f, data[: 2 * PART + MiB])
    _wait_for(lambda: _parts_sent(store) == 2)  # both full parts, before close()
    assert "ckpt" not in [e.key for e in store.list_objects("b", "")]
    assert len(_sidecars(fs)) == 1  # the upload is named where a crash would find it
    _write_in_chunks(f, data[2 * PART + MiB :])
    f.close()
    fs.flush(timeout=30)
    assert store.open_range("b", "ckpt", 0, None).read(len(data) + 1) == data
    assert fs.stats()["uploads_streamed"] == 1
    assert _parts_sent(store) == 4  # three streamed, the tail after close
    assert store.request_counts().get("CompleteMultipartUpload") == 1
    assert store.open_multipart_uploads() == 0
    assert _sidecars(fs) == []
    assert fs.pending() == []


def test_a_dropped_write_never_lands(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    store.put_bytes("b", "ckpt", b"the older version")
    fs = _fs(tmp_path, store)
    with pytest.raises(RuntimeError), fs.open("b/ckpt", "wb") as f:
        _write_in_chunks(f, os.urandom(2 * PART + 1))
        _wait_for(lambda: _parts_sent(store) == 2)
        raise RuntimeError("the training step failed mid-save")
    fs.flush(timeout=30)
    assert store.open_range("b", "ckpt", 0, None).read(100) == b"the older version"
    assert store.open_multipart_uploads() == 0
    assert store.request_counts().get("AbortMultipartUpload") == 1
    assert _sidecars(fs) == []


def test_bytes_changed_through_the_descriptor_are_uploaded_as_written(tmp_path: Path) -> None:
    """DCP fsyncs through fileno(); a writer may also pwrite there: the streamed parts are
    checked against the journaled bytes and the upload starts over when they differ."""
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store)
    data = bytearray(os.urandom(2 * PART + 7))
    f = fs.open("b/ckpt", "wb")
    _write_in_chunks(f, bytes(data))
    _wait_for(lambda: _parts_sent(store) == 2)
    os.pwrite(f.fileno(), b"changed", 10)
    data[10:17] = b"changed"
    f.close()
    fs.flush(timeout=30)
    assert store.open_range("b", "ckpt", 0, None).read(len(data) + 1) == bytes(data)
    assert fs.stats()["streams_restarted"] == 1
    assert store.open_multipart_uploads() == 0


def test_a_descriptor_used_only_for_fsync_keeps_the_streamed_parts(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store)
    data = os.urandom(2 * PART + 7)
    f = fs.open("b/ckpt", "wb")
    _write_in_chunks(f, data)
    os.fsync(f.fileno())
    f.close()
    fs.flush(timeout=30)
    assert store.open_range("b", "ckpt", 0, None).read(len(data) + 1) == data
    assert fs.stats()["uploads_streamed"] == 1


def test_the_newest_of_two_streamed_versions_wins(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store)
    older, newer = os.urandom(2 * PART + 1), os.urandom(2 * PART + 2)
    for data in (older, newer):
        with fs.open("b/ckpt", "wb") as f:
            _write_in_chunks(f, data)
    fs.flush(timeout=30)
    assert store.open_range("b", "ckpt", 0, None).read(len(newer) + 1) == newer
    assert store.open_multipart_uploads() == 0
    assert _sidecars(fs) == []


def test_a_failing_part_falls_back_to_a_whole_upload(tmp_path: Path) -> None:
    class FlakyParts(MemoryStore):
        failures = 1

        def send_part(self, *args: Any) -> str:
            if self.failures:
                self.failures -= 1
                raise ConnectionResetError("the link dropped")
            return super().send_part(*args)

    store = FlakyParts(["b"])
    fs = _fs(tmp_path, store)
    data = os.urandom(2 * PART + 5)
    with fs.open("b/ckpt", "wb") as f:
        _write_in_chunks(f, data)
    fs.flush(timeout=30)
    assert store.open_range("b", "ckpt", 0, None).read(len(data) + 1) == data
    assert fs.stats()["streams_restarted"] == 1
    assert store.open_multipart_uploads() == 0


def test_removing_the_object_aborts_its_streamed_upload(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store)
    with fs.open("b/ckpt", "wb") as f:
        _write_in_chunks(f, os.urandom(2 * PART + 5))
    fs.rm("b/ckpt")
    fs.flush(timeout=30)
    _wait_for(lambda: store.open_multipart_uploads() == 0)
    assert "ckpt" not in [e.key for e in store.list_objects("b", "")]


def test_off_uploads_after_close_with_the_digest_metadata(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store, upload_while_writing="off")
    f = fs.open("b/ckpt", "wb")
    _write_in_chunks(f, os.urandom(2 * PART + 5))
    time.sleep(0.3)
    assert _parts_sent(store) == 0
    f.close()
    fs.flush(timeout=30)
    assert fs.stats()["uploads_streamed"] == 0


def test_auto_on_few_cores_sends_the_parts_once_the_burst_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uploader, "few_cores", lambda: True)
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store, upload_while_writing="auto")
    data = os.urandom(2 * PART + 5)
    f = fs.open("b/ckpt", "wb")
    _write_in_chunks(f, data)
    time.sleep(0.3)
    assert _parts_sent(store) == 0  # queued: the writer keeps the CPU
    f.close()
    fs.flush(timeout=30)
    assert store.open_range("b", "ckpt", 0, None).read(len(data) + 1) == data
    assert fs.stats()["uploads_streamed"] == 1
    assert store.request_counts().get("UploadPart") == 3


class _FarStore(MemoryStore):
    """A store across a network: a request takes 50 ms, a part 0.2 s (25 MiB/s); it counts
    the parts on the wire at once."""

    def __init__(self) -> None:
        super().__init__(["b"])
        self._wire = threading.Lock()
        self.on_wire = 0
        self.most_on_wire = 0

    def create_multipart(self, *args: Any, **kwargs: Any) -> str:
        time.sleep(0.05)
        return super().create_multipart(*args, **kwargs)

    def send_part(self, *args: Any, **kwargs: Any) -> str:
        with self._wire:
            self.on_wire += 1
            self.most_on_wire = max(self.most_on_wire, self.on_wire)
        try:
            time.sleep(0.2)
            return super().send_part(*args, **kwargs)
        finally:
            with self._wire:
                self.on_wire -= 1


def test_auto_on_few_cores_creates_the_upload_at_once_and_holds_every_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A far store gets the request creating the upload while the file is written (it costs
    no CPU); every part waits for the writer, even where each part goes slowly: two parts
    beside a writer on one core made its close() block 1.3-2.3x as long."""
    monkeypatch.setattr(uploader, "few_cores", lambda: True)
    store = _FarStore()
    fs = _fs(tmp_path, store, upload_while_writing="auto")
    for made, name in enumerate(("first", "second"), 1):  # the second knows parts go slowly
        data = os.urandom(6 * PART + 5)
        f = fs.open(f"b/{name}", "wb")
        _write_in_chunks(f, data)
        _wait_for(lambda made=made: store.request_counts().get("CreateMultipartUpload") == made)
        before = _parts_sent(store)
        time.sleep(0.5)  # two parts of this store's would be on the wire by now
        assert _parts_sent(store) == before
        if made == 1:
            assert store._sender._threads == 1  # the others start when the parts may go
        f.close()
        fs.flush(timeout=30)
        assert store.open_range("b", name, 0, None).read(len(data) + 1) == data
    assert store.request_counts().get("CreateMultipartUpload") == 2
    assert store.request_counts().get("UploadPart") == 14


def test_auto_on_few_cores_holds_every_part_staged_on_the_shared_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts staged on the shared tier are read back through its filesystem: none go beside
    a writer there, nor does the request creating their upload, however far the store."""
    monkeypatch.setattr(uploader, "few_cores", lambda: True)
    store = _FarStore()
    fs = _fs(
        tmp_path,
        store,
        upload_while_writing="auto",
        shared_dir=str(tmp_path / "shared"),
        write_tier="shared",
    )
    data = os.urandom(3 * PART + 5)
    f = fs.open("b/ckpt", "wb")
    _write_in_chunks(f, data)
    time.sleep(0.3)
    assert store.request_counts() == {}
    assert store._sender._threads == 0  # no part queued: uploaded after close() instead
    f.close()
    fs.flush(timeout=30)
    assert store.open_range("b", "ckpt", 0, None).read(len(data) + 1) == data
    assert fs.stats()["uploads_streamed"] == 0


def test_bools_read_as_on_and_off(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    assert _fs(tmp_path, store, upload_while_writing=True).config.upload_while_writing == "on"
    assert _fs(tmp_path, store, upload_while_writing=False).config.upload_while_writing == "off"


def test_the_governor_learns_parts_in_flight_from_the_link() -> None:
    remote = PartGovernor(None, maximum=16)
    for _ in range(6):  # each part alone gets 25 MiB/s: more parts pay
        remote.observed(16 * MiB, 16 / 25)
    assert remote.limit() == 10
    for _ in range(6):  # now each gets a third: they share the link
        remote.observed(16 * MiB, 16 / 8)
    assert remote.limit() == 4
    local = PartGovernor(None)
    local.observed(16 * MiB, 16 / 900)  # one part at local-disk speed
    assert local.limit() == 2
    fixed = PartGovernor(3)
    fixed.observed(16 * MiB, 16 / 25)
    assert fixed.limit() == 3
