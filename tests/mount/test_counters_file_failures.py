"""The mount's counters file: a write that keeps failing is logged once, not once a second."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tiercache.mount import runner
from tiercache.mount.runner import MountSpec, RepeatedFailure


class _Cache:
    def stats(self) -> dict[str, int]:
        return {"hits": 1}


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tiercache.mount"]


def test_a_counters_file_that_cannot_be_written_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "_STATS_SECONDS", 0.01)
    missing = tmp_path / "gone"
    path = missing / "counters.json"
    spec = MountSpec(url="s3://b", bucket="b", prefix="", mountpoint=str(tmp_path / "mnt"))
    stop = threading.Event()
    caplog.set_level(logging.INFO, logger="tiercache.mount")
    args: Any = (_Cache(), spec, str(path), stop, dict)
    writer = threading.Thread(target=runner._write_stats, args=args, daemon=True)
    writer.start()
    try:
        deadline = time.monotonic() + 10
        while not any("counters" in m for m in _messages(caplog)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)  # some thirty more failures
        failed = [r for r in caplog.records if "counters" in r.getMessage()]
        assert len(failed) == 1, _messages(caplog)
        assert str(path) in failed[0].getMessage() and failed[0].exc_info is not None
        missing.mkdir()
        while not path.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.05)
    finally:
        stop.set()
        writer.join(5)
    assert "works again after" in _messages(caplog)[-1]
    assert '"hits": 1' in path.read_text()


def test_a_lasting_failure_is_reported_again_at_most_once_a_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = RepeatedFailure("doing it", every=600, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="tiercache.mount")
    for _ in range(700):  # once a second for 700 s
        failures.failed(FileNotFoundError(2, "No such file or directory"))
        now[0] += 1
    assert _messages(caplog) == [
        "doing it failed: [Errno 2] No such file or directory",
        "doing it still fails (600 times more since the last report): "
        "[Errno 2] No such file or directory",
    ]
    failures.failed(PermissionError(13, "Permission denied"))  # another failure: said at once
    failures.succeeded()
    failures.succeeded()
    assert _messages(caplog)[2:] == [
        "doing it failed: [Errno 13] Permission denied",
        "doing it works again after 701 failures",
    ]
