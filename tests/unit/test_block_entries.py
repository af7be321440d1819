"""Block-granular entries: a huge object is cached block by block as its readers touch it."""

from __future__ import annotations

import glob
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from tiercache import MemoryStore, TierCacheFileSystem

KiB = 1024
MiB = 1024 * KiB
SIZE = 8 * MiB
BLOCK = 64 * KiB


def _fs(tmp_path: Path, store: MemoryStore, **options: Any) -> TierCacheFileSystem:
    defaults: dict[str, Any] = {
        "local_dir": str(tmp_path / "tier"),
        "consistency": "immutable",
        "block_threshold": 1 * MiB,
        "block_size": BLOCK,
        "whole_object_after": 1.0,
        "readahead_blocks": 0,
    }
    return TierCacheFileSystem(store=store, skip_instance_cache=True, **{**defaults, **options})


def _huge(store: MemoryStore) -> bytes:
    data = os.urandom(SIZE)
    store.put_bytes("b", "huge.bin", data)
    return data


def test_random_small_reads_fetch_only_the_blocks_they_touch(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    data = _huge(store)
    fs = _fs(tmp_path, store)
    rng = random.Random(7)
    offsets = [rng.randrange(0, SIZE - 4 * KiB) for _ in range(20)]
    with fs.open("b/huge.bin") as f:
        for offset in offsets:
            f.seek(offset)
            assert f.read(4 * KiB) == data[offset : offset + 4 * KiB]
    touched = {o // BLOCK for o in offsets} | {(o + 4 * KiB - 1) // BLOCK for o in offsets}
    stats = fs.stats()
    assert stats["blocks_fetched"] == len(touched)
    assert stats["bytes_fetched"] == len(touched) * BLOCK < SIZE * 0.2
    assert stats["fetches"] == 0  # never fetched whole
    # A second open reads the same bytes from the tier, with no further GET.
    gets = store.request_counts()["GetObject"]
    with fs.open("b/huge.bin") as f:
        f.seek(offsets[0])
        assert f.read(4 * KiB) == data[offsets[0] : offsets[0] + 4 * KiB]
    assert store.request_counts()["GetObject"] == gets


def test_another_filesystem_reuses_blocks_already_fetched(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    data = _huge(store)
    with _fs(tmp_path, store).open("b/huge.bin") as f:
        f.seek(3 * BLOCK)
        f.read(BLOCK)
    gets = store.request_counts()["GetObject"]
    other = _fs(tmp_path, store)
    with other.open("b/huge.bin") as f:
        f.seek(3 * BLOCK)
        assert f.read(BLOCK) == data[3 * BLOCK : 4 * BLOCK]
    assert store.request_counts()["GetObject"] == gets


def test_reading_past_the_threshold_completes_the_object(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    data = _huge(store)
    fs = _fs(tmp_path, store, whole_object_after=0.25, readahead_blocks=4)
    with fs.open("b/huge.bin") as f:
        assert f.read(SIZE // 4) == data[: SIZE // 4]
    deadline = time.monotonic() + 30
    while not fs.is_cached("b/huge.bin"):  # the background completion publishes it whole
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # Then it removes the block entry's files (kept until the whole entry was published, so
    # that a reader arriving meanwhile finds one or the other).
    while glob.glob(str(tmp_path / "tier/objects/*/*.blk*")):
        assert time.monotonic() < deadline, "the block entry's files were left behind"
        time.sleep(0.02)
    gets = store.request_counts()["GetObject"]
    assert fs.cat_file("b/huge.bin") == data
    assert store.request_counts()["GetObject"] == gets
    assert fs.stats()["bytes_fetched"] < SIZE + BLOCK * 8  # each block about once


def test_a_reader_open_while_its_entry_completes_reads_on(tmp_path: Path) -> None:
    """The background completion publishes the file whole and removes the block log under a
    reader that still has the block entry open: its next reads are served all the same."""
    store = MemoryStore(["b"])
    data = _huge(store)
    for verify in ("reboot", "first", "always"):
        fs = _fs(tmp_path / verify, store, whole_object_after=0.25, verify=verify)
        with fs.open("b/huge.bin") as f:
            assert f.read(SIZE // 4) == data[: SIZE // 4]
            deadline = time.monotonic() + 30
            while not fs.is_cached("b/huge.bin"):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            for offset in (SIZE // 2, SIZE - 100, SIZE // 4 + 1):
                f.seek(offset)
                assert f.read(4 * KiB) == data[offset : offset + 4 * KiB], (verify, offset)
        assert fs.stats()["block_errors"] == 0


def test_sequential_reader_gets_every_byte(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    data = _huge(store)
    fs = _fs(tmp_path, store, readahead_blocks=3)
    out = bytearray()
    with fs.open("b/huge.bin") as f:
        while chunk := f.read(100 * KiB):
            out += chunk
    assert bytes(out) == data


def test_small_objects_are_still_fetched_whole(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    store.put_bytes("b", "small.bin", b"x" * (MiB - 1))
    fs = _fs(tmp_path, store)
    assert fs.cat_file("b/small.bin") == b"x" * (MiB - 1)
    fs.wait_fetches()
    assert fs.is_cached("b/small.bin") and fs.stats()["blocks_fetched"] == 0


def test_a_corrupt_block_is_fetched_again_when_verifying(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    data = _huge(store)
    fs = _fs(tmp_path, store, verify="always")
    with fs.open("b/huge.bin") as f:
        f.seek(2 * BLOCK)
        f.read(10)
    (blk,) = glob.glob(str(tmp_path / "tier/objects/*/*.blk"))
    with open(blk, "r+b") as raw:
        raw.seek(2 * BLOCK + 5)
        raw.write(b"\xff" * 100)
    with fs.open("b/huge.bin") as f:
        f.seek(2 * BLOCK)
        assert f.read(BLOCK) == data[2 * BLOCK : 3 * BLOCK]


def test_a_changed_object_drops_its_blocks(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    _huge(store)
    with _fs(tmp_path, store).open("b/huge.bin") as f:
        f.read(10)
    fresh = os.urandom(SIZE)
    store.put_bytes("b", "huge.bin", fresh)
    with _fs(tmp_path, store, consistency="always").open("b/huge.bin") as f:
        assert f.read(BLOCK) == fresh[:BLOCK]


def test_block_entries_are_evicted_like_others(tmp_path: Path) -> None:
    store = MemoryStore(["b"])
    _huge(store)
    fs = _fs(tmp_path, store)
    with fs.open("b/huge.bin") as f:
        f.read(4 * BLOCK)
        assert fs.evict(0).kept_busy == 1  # open: kept
    assert fs.tier.usage(fresh=True) >= 4 * BLOCK
    assert fs.evict(0).removed_bytes >= 4 * BLOCK
    assert glob.glob(str(tmp_path / "tier/objects/*/*.blk*")) == []


def test_a_reader_arriving_while_its_entry_completes_fetches_nothing(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Between the whole entry's data and its metadata going into place, the block entry is
    still whole and readable: a reader that comes then reads it (it found neither entry, and
    fetched the object again, when the block file was moved rather than linked)."""
    import tiercache.tiers.local as local_module

    store = MemoryStore(["b"])
    data = _huge(store)
    fs = _fs(tmp_path, store, whole_object_after=0.25, readahead_blocks=4)
    other = _fs(tmp_path, store)  # reads what is there: completes nothing itself
    seen: list[tuple[bytes, int]] = []
    real_install = local_module.install

    def install_after_a_reader(tmp: str, path: str) -> None:
        if path.endswith(".meta") and not seen:  # the whole entry's metadata, next
            before = store.request_counts().get("GetObject", 0)

            def read_the_end() -> None:
                with other.open("b/huge.bin") as f:
                    f.seek(SIZE - 1000)
                    got = f.read(1000)
                seen.append((got, store.request_counts().get("GetObject", 0) - before))

            # The reader waits for the entry lock the completion holds, then reads.
            threading.Thread(target=read_the_end, daemon=True).start()
            time.sleep(0.2)
        real_install(tmp, path)

    monkeypatch.setattr(local_module, "install", install_after_a_reader)
    with fs.open("b/huge.bin") as f:
        assert f.read(SIZE // 4) == data[: SIZE // 4]
    deadline = time.monotonic() + 30
    while not fs.is_cached("b/huge.bin"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    fs.wait_fetches()
    deadline = time.monotonic() + 30
    while not seen:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert seen == [(data[-1000:], 0)]
