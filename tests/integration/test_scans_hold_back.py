"""The uploader's scans of the journal hold back while this process writes, as its uploads
do, and run at once when a flush asks for them (real server)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.servers_under_test import S3Endpoint

from tiercache import TierCacheFileSystem
from tiercache.write import uploader
from tiercache.write.reconcile import reconcile


@pytest.fixture
def reconciled_at(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When (``time.monotonic()``) each reconciliation of the journal began."""
    times: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        times.append(time.monotonic())
        return reconcile(*args, **kwargs)

    monkeypatch.setattr("tiercache.write.uploader.reconcile", timed)
    return times


def _fs(s3: S3Endpoint, tmp_path: Path) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=str(tmp_path / "tier"),
        skip_instance_cache=True,
    )


def test_the_first_scan_waits_for_the_burst_of_writes(
    s3: S3Endpoint, bucket: str, tmp_path: Path, reconciled_at: list[float]
) -> None:
    fs = _fs(s3, tmp_path)
    with fs.open(f"{bucket}/first", "wb") as f:  # its commit starts the uploader's threads
        f.write(b"first")
    second = fs.open(f"{bucket}/second", "wb")
    writing_until = time.monotonic() + 1.5
    while time.monotonic() < writing_until:  # a file written for 1.5 s, in small pieces
        second.write(b"x" * 4096)
        time.sleep(0.01)
    second.close()
    closed = time.monotonic()
    fs.flush(timeout=60)
    assert len(reconciled_at) == 1
    assert reconciled_at[0] >= closed, "the journal was scanned while a file was written"
    assert fs.pending() == []


def test_a_flush_scans_at_once_while_a_file_is_open(
    s3: S3Endpoint, bucket: str, tmp_path: Path, reconciled_at: list[float]
) -> None:
    fs = _fs(s3, tmp_path)
    with fs.open(f"{bucket}/done", "wb") as f:
        f.write(b"done")
    held = fs.open(f"{bucket}/held", "wb")  # a writer that stays open through the flush
    held.write(b"held open")
    flushed = threading.Event()

    def flush() -> None:
        fs.flush(f"{bucket}/done", timeout=60)
        flushed.set()

    started = time.monotonic()
    flusher = threading.Thread(target=flush)
    flusher.start()
    flusher.join(60)
    took = time.monotonic() - started
    assert flushed.is_set()
    assert len(reconciled_at) == 1
    # The scan (and the upload) went while "held" was open, not after the 10 s that
    # background work waits at most for a writer.
    assert took < uploader._DEFER_WHILE_WRITING / 2, f"the flush took {took:.1f} s"
    held.close()
    fs.flush(timeout=60)
    assert fs.cat_file(f"{bucket}/held") == b"held open"
