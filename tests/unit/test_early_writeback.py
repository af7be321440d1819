"""``EarlyWriteback``: the disk writes of each step written start at once, in order, once each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tiercache.write import writeback
from tiercache.write.writeback import EarlyWriteback


def _recording(monkeypatch: pytest.MonkeyPatch, answer: int = 0) -> list[tuple[int, int, int]]:
    calls: list[tuple[int, int, int]] = []

    def record(fd: int, offset: int, nbytes: int, flags: int) -> int:
        calls.append((offset, nbytes, flags))
        return answer

    monkeypatch.setattr(writeback, "_sync_file_range", record)
    return calls


def test_each_full_step_is_started_once_and_the_ranges_follow_each_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _recording(monkeypatch)
    early = EarlyWriteback(fd=7, step=100)
    for size in (40, 99, 100, 150, 260, 261, 299, 1000):
        early.wrote(size)
    assert calls == [(0, 100, 2), (100, 160, 2), (260, 740, 2)]
    assert early.calls == 3


def test_a_refusal_stops_it_and_raises_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _recording(monkeypatch, answer=-1)
    early = EarlyWriteback(fd=7, step=10)
    early.wrote(10)
    early.wrote(20)
    assert calls == [(0, 10, 2)]


def test_without_the_call_nothing_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writeback, "_sync_file_range", None)
    early = EarlyWriteback(fd=7, step=1)
    early.wrote(10)
    assert early.calls == 0


def test_a_bad_step_is_refused() -> None:
    with pytest.raises(ValueError, match="step"):
        EarlyWriteback(fd=7, step=0)


@pytest.mark.skipif(writeback._sync_file_range is None, reason="Linux only")
def test_the_real_call_starts_a_regular_files_writeback_and_is_refused_on_a_pipe(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f"
    data = os.urandom(3 * 65536 + 17)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        early = EarlyWriteback(fd, step=65536)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written : written + 40000])
            early.wrote(written)
        assert early.calls == 2 and early._enabled  # at 80 000 and 160 000 bytes: accepted
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    read_end, write_end = os.pipe()
    try:
        on_pipe = EarlyWriteback(write_end, step=1)
        os.write(write_end, b"xy")
        on_pipe.wrote(2)
        on_pipe.wrote(4)
        assert on_pipe.calls == 1 and not on_pipe._enabled  # ESPIPE: the fsync does it all
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_staged_write_starts_its_writeback_as_it_writes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _recording(monkeypatch)
    monkeypatch.setattr(writeback, "STEP_BYTES", 1 << 20)
    from tiercache.tiers.local import LocalTier
    from tiercache.write.staged import StagedWriteFile

    tier = LocalTier(str(tmp_path / "tier"), max_bytes=1 << 30)
    committed: list[Any] = []
    f = StagedWriteFile(
        "b/k",
        "b",
        "k",
        tier=tier,
        entry_id=tier.entry_id("ns", "b", "k"),
        source="s3://b/k",
        commit=lambda staged: committed.append(staged) or {},
    )
    chunk = os.urandom(512 * 1024)
    for _ in range(5):
        f.write(chunk)
    f.close()
    assert committed and committed[0].size == 5 * len(chunk)
    assert calls == [(0, 1 << 20, 2), (1 << 20, 1 << 20, 2)]
