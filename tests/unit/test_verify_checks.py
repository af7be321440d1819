"""Cached bytes that no longer match their digest are never handed over as a complete read.

A clean entry that fails is dropped and its bytes come from the store again, transparently if
the reader had none of them yet; a dirty entry (the only copy of a pending write) is never
dropped nor replaced by the store's older version: its reader gets ``CacheCorruptError``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.tier_damage import flip_byte, forget_checks

from tiercache import CacheCorruptError, MemoryStore, TierCacheFileSystem, verify

KiB = 1024
MiB = 1024 * KiB
SMALL = 64 * KiB  # checked as it is opened (verify.CHECK_AT_OPEN_MAX)
LARGE = 4 * MiB  # checked by a worker, ahead of its reader (the bar lowered: see below)


@pytest.fixture(autouse=True)
def _worker_checks_above_1_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Objects above 64 MiB are checked by a worker, ahead of their reader: these tests make
    a 4 MiB object stand for one (``test_corrupt_cache.py`` checks the real bar)."""
    monkeypatch.setattr(verify, "CHECK_AT_OPEN_MAX", MiB)


def _fs(tmp_path: Path, store: MemoryStore, **options: Any) -> TierCacheFileSystem:
    options.setdefault("consistency", "immutable")
    options.setdefault("local_dir", str(tmp_path / "t"))
    return TierCacheFileSystem(store=store, skip_instance_cache=True, **options)


def _cached(fs: TierCacheFileSystem, payload: bytes, store: MemoryStore) -> str:
    """Put ``payload`` as b/k, read it into the tier; the path of its data file."""
    store.put_bytes("b", "k", payload)
    assert fs.cat("b/k") == payload
    fs.wait_fetches()
    entry = fs.read_path.cached("b", "k")
    assert entry is not None
    return entry.paths.data


def _read_all(fs: TierCacheFileSystem, chunk: int, readinto: bool = False) -> bytes:
    out = bytearray()
    with fs.open("b/k", "rb") as f:
        if readinto:
            buffer = bytearray(chunk)
            while got := f.readinto(buffer):
                out += buffer[:got]
        else:
            while data := f.read(chunk):
                out += data
    return bytes(out)


def test_corrupt_error_is_an_os_error_with_eio() -> None:
    err = CacheCorruptError("s3://b/k: bad digest")
    assert isinstance(err, OSError) and err.errno == errno.EIO
    assert str(err) == "s3://b/k: bad digest"


@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_flipped_byte_is_refetched_before_an_open_read_hands_anything(
    tmp_path: Path, size: int
) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(size)
    fs = _fs(tmp_path, store)
    flip_byte(_cached(fs, payload, store), size // 2)
    forget_checks(fs)
    assert fs.cat("b/k") == payload  # one read of it all: the verdict comes first
    stats = fs.stats()
    assert stats["verify_failures"] == 1 and stats["corrupt_entries"] == 1
    assert store.request_counts()["GetObject"] == 2
    assert fs.cat("b/k") == payload


@pytest.mark.parametrize("where", ["middle", "last_bytes"])
def test_a_read_out_of_order_waits_for_the_check(tmp_path: Path, where: str) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(LARGE)
    fs = _fs(tmp_path, store)
    flip_byte(_cached(fs, payload, store), 3 * MiB)
    forget_checks(fs)
    offset = LARGE // 3 if where == "middle" else LARGE - 100
    with fs.open("b/k", "rb") as f:
        f.seek(offset)
        assert f.read(100) == payload[offset : offset + 100]
        f.seek(3 * MiB - 10)
        assert f.read(20) == payload[3 * MiB - 10 : 3 * MiB + 10]
    assert fs.stats()["verify_failures"] == 1
    assert store.request_counts()["GetObject"] == 2


@pytest.mark.parametrize("readinto", [False, True])
def test_a_sequential_reader_never_completes_a_read_of_corrupt_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readinto: bool
) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(LARGE)
    fs = _fs(tmp_path, store)
    flip_byte(_cached(fs, payload, store), MiB + 5)
    forget_checks(fs)
    # No worker hashes ahead: the reader is handed the early bytes before any verdict, and
    # its read of the last bytes runs the check itself.
    monkeypatch.setattr(fs.read_path.verifier, "start", lambda check: None)
    with pytest.raises(CacheCorruptError) as raised:
        _read_all(fs, 512 * KiB, readinto)
    assert raised.value.errno == errno.EIO and "s3://b/k" in str(raised.value)
    assert fs.read_path.cached("b", "k") is None  # dropped: a retry fetches it
    assert _read_all(fs, 512 * KiB, readinto) == payload


def test_a_sequential_reader_whose_check_finished_first_gets_the_right_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's verdict comes before the reader's first bytes (here: it hashes the file
    as the reader opens it): the corrupt entry is dropped and the reader, handed nothing yet,
    reads the store's bytes without an error, wherever the flipped byte is."""
    store = MemoryStore(["b"])
    payload = os.urandom(LARGE)
    fs = _fs(tmp_path, store)
    monkeypatch.setattr(fs.read_path.verifier, "start", lambda check: check.run())
    for round_ in range(5):
        data_path = _cached(fs, payload, store)
        flip_byte(data_path, (round_ + 1) * 700 * KiB)
        forget_checks(fs)
        gets = store.request_counts()["GetObject"]
        assert _read_all(fs, 256 * KiB) == payload
        assert fs.stats()["verify_failures"] == round_ + 1
        assert store.request_counts()["GetObject"] > gets  # the store's bytes, fetched again
        assert _read_all(fs, 256 * KiB) == payload


def test_a_truncated_file_with_its_size_edited_is_caught_by_the_digest(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(SMALL)
    fs = _fs(tmp_path, store)
    data_path = _cached(fs, payload, store)
    entry = fs.read_path.cached("b", "k")
    assert entry is not None
    os.truncate(data_path, SMALL - 1000)
    fs.tier.replace_meta(entry, dataclasses.replace(entry.meta, size=SMALL - 1000))
    forget_checks(fs)
    assert fs.cat("b/k") == payload
    assert fs.stats()["verify_failures"] == 1


def test_a_file_is_checked_once_per_process(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(LARGE)
    fs = _fs(tmp_path, store)
    _cached(fs, payload, store)
    assert fs.cat("b/k") == payload
    assert fs.stats()["verify_checks"] == 0  # fetched by this process: hashed as it came
    forget_checks(fs)
    for _ in range(3):
        assert _read_all(fs, MiB) == payload
    stats = fs.stats()
    assert stats["verify_checks"] == 1 and stats["verify_failures"] == 0
    assert stats["verify_seconds"] > 0


def test_a_file_changed_after_its_check_is_checked_again(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(SMALL)
    fs = _fs(tmp_path, store)
    data_path = _cached(fs, payload, store)
    time.sleep(0.05)  # past the filesystem's timestamp granularity
    flip_byte(data_path, 10)  # a new mtime and ctime: no longer the file this process fetched
    assert fs.cat("b/k") == payload
    assert fs.stats()["verify_failures"] == 1


def test_verify_reboot_costs_nothing_and_serves_what_is_on_disk(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(SMALL)
    fs = _fs(tmp_path, store, verify="reboot")
    flip_byte(_cached(fs, payload, store), 10)
    forget_checks(fs)
    assert fs.cat("b/k") != payload  # the documented trade: no defence against disk damage
    assert fs.stats().get("verify_checks", 0) == 0
    checked = _fs(tmp_path, store)  # the default, on the same tier
    assert checked.cat("b/k") == payload


class _HeldUploads(MemoryStore):
    """Uploads wait until released: what is written behind stays dirty meanwhile."""

    def __init__(self) -> None:
        super().__init__(["b"])
        self.released = threading.Event()

    def upload_file(self, *args: Any, **kwargs: Any) -> Any:
        self.released.wait(60)
        return super().upload_file(*args, **kwargs)


@pytest.mark.parametrize("verify", ["default", "always"])
@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_a_corrupt_dirty_entry_is_neither_served_nor_dropped(
    tmp_path: Path, verify: str, size: int
) -> None:
    store = _HeldUploads()
    store.put_bytes("b", "k", b"the store's older version")
    options = {} if verify == "default" else {"verify": verify}
    fs = _fs(tmp_path, store, consistency="always", **options)
    written = os.urandom(size)
    with fs.open("b/k", "wb") as f:
        f.write(written)
    entry = fs.read_path.cached("b", "k")
    assert entry is not None and entry.meta.state == "dirty"
    flip_byte(entry.paths.data, size - 10)
    forget_checks(fs)
    try:
        for _ in range(2):
            with pytest.raises(CacheCorruptError) as raised:
                _read_all(fs, 256 * KiB)
            message = str(raised.value)
            assert raised.value.errno == errno.EIO
            assert "s3://b/k" in message and "upload is kept" in message
            after = fs.read_path.cached("b", "k")
            assert after is not None and after.meta.state == "dirty"
            assert after.meta.digest == entry.meta.digest
            assert Path(after.paths.data).stat().st_size == size
        assert store.request_counts().get("GetObject", 0) == 0  # never the older version
    finally:
        if os.path.exists(entry.paths.data):
            flip_byte(entry.paths.data, size - 10)  # intact again: the held upload may go
        store.released.set()
        fs.flush(timeout=30)


def test_a_corrupt_block_is_refetched_by_default(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    data = os.urandom(2 * MiB)
    store.put_bytes("b", "huge.bin", data)
    block = 64 * KiB
    fs = _fs(
        tmp_path,
        store,
        block_threshold=MiB,
        block_size=block,
        whole_object_after=1.0,
        readahead_blocks=0,
    )
    with fs.open("b/huge.bin") as f:
        f.seek(2 * block)
        assert f.read(10) == data[2 * block : 2 * block + 10]
    (blk,) = Path(tmp_path / "t").glob("objects/*/*.blk")
    flip_byte(str(blk), 2 * block + 5)
    forget_checks(fs)
    gets = store.request_counts()["GetObject"]
    for _ in range(2):  # checked on its first read in the process, then trusted
        with fs.open("b/huge.bin") as f:
            f.seek(2 * block)
            assert f.read(block) == data[2 * block : 3 * block]
    assert store.request_counts()["GetObject"] == gets + 1
    assert fs.stats()["verify_failures"] == 1 and fs.stats()["verify_checks"] == 1


@pytest.mark.parametrize("policy", ["promote", "serve"])
def test_a_corrupt_shared_copy_is_not_served_to_another_host(tmp_path: Path, policy: str) -> None:
    store = MemoryStore(["b"])
    payload = os.urandom(SMALL)
    store.put_bytes("b", "k", payload)

    def host(name: str) -> TierCacheFileSystem:
        return _fs(
            tmp_path,
            store,
            local_dir=str(tmp_path / f"local-{name}"),
            shared_dir=str(tmp_path / "shared"),
            host_id=name,
            shared_policy=policy,
        )

    first = host("h1")
    assert first.cat("b/k") == payload
    first.wait_fetches()
    shared = first.read_path.cached_shared("b", "k")
    assert shared is not None
    flip_byte(shared.paths.data, 100)
    second = host("h2")
    assert second.cat("b/k") == payload
    assert second.stats()["verify_failures"] >= 1
    assert store.request_counts()["GetObject"] == 2
    assert second.cat("b/k") == payload


def test_an_empty_object_is_checked_without_hanging(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    fs = _fs(tmp_path, store)
    _cached(fs, b"", store)
    forget_checks(fs)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fs.cat("b/k")), daemon=True)
    reader.start()
    reader.join(10)
    assert got == [b""]
    assert fs.stats()["verify_checks"] == 1 and fs.stats()["verify_failures"] == 0
