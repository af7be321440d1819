"""The dirty budget's check reads the journal rarely far from the budget, often near it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tiercache import MemoryStore, TierCacheFileSystem
from tiercache.write import behind
from tiercache.write.state import WriteState

KiB = 1024


def _count_budget_reads(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Times at which the budget check (not the uploader) read every record."""
    reads: list[float] = []
    real = WriteState.records

    def records(self: WriteState) -> Any:
        if sys._getframe(1).f_code.co_name == "_dirty_bytes":
            reads.append(time.monotonic())
        return real(self)

    monkeypatch.setattr(WriteState, "records", records)
    return reads


def _write(fs: TierCacheFileSystem, path: str, data: bytes) -> None:
    with fs.open(path, "wb") as f:  # a file opened for writing: written behind
        f.write(data)


def _fs(tmp_path: Path, budget: str) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=MemoryStore(["bkt"]),
        local_dir=str(tmp_path / "tier"),
        skip_instance_cache=True,
        write_mode="behind",
        dirty_max_bytes=budget,
    )


def test_far_from_the_budget_the_journal_is_read_once_for_many_closes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reads = _count_budget_reads(monkeypatch)
    fs = _fs(tmp_path, "1GiB")
    start = time.monotonic()
    for i in range(20):
        _write(fs, f"bkt/f{i}", b"x" * KiB)
        if i == 9:
            time.sleep(behind._RESCAN_NEAR + 0.1)  # a reading this old is still used here
    if time.monotonic() - start < behind._RESCAN_FAR:
        assert len(reads) == 1, reads
    fs.flush(timeout=30)


def test_near_the_budget_it_is_read_again_after_half_a_second(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reads = _count_budget_reads(monkeypatch)
    fs = _fs(tmp_path, "64KiB")
    _write(fs, "bkt/a", b"x" * 40 * KiB)  # known pending: 40 KiB, over half the budget
    first = len(reads)
    time.sleep(behind._RESCAN_NEAR + 0.1)
    _write(fs, "bkt/b", b"x" * KiB)
    assert len(reads) > first, reads
    fs.flush(timeout=30)
