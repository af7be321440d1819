"""Back-pressure paces writers at the speed of the uploads, without stalling them further.

A ``close()`` blocked on a full dirty budget waits for uploads; it must not, as a writer still
writing would, hold those very uploads back. Each test times the same writes with and without
a budget that makes them wait, on one run against the real server.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tiercache import TierCacheFileSystem
from tiercache.errors import UploadFailedError

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _fs(s3: Any, local_dir: Path, **options: Any) -> TierCacheFileSystem:
    return _fs_at(s3.target_options(), local_dir, **options)


def _fs_at(target: dict[str, Any], local_dir: Path, **options: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=target,
        local_dir=str(local_dir),
        skip_instance_cache=True,
        **options,
    )


def _write_then_flush(fs: TierCacheFileSystem, prefix: str, count: int) -> tuple[float, float]:
    """Seconds the ``count`` writes of 2 MiB took, and the writes plus the flush after them."""
    start = time.monotonic()
    for i in range(count):
        with fs.open(f"{prefix}/f{i:02d}.bin", "wb") as f:
            f.write(os.urandom(2 * MiB))
    written = time.monotonic() - start
    try:
        fs.flush(timeout=120)
    except UploadFailedError:
        pass  # refused keys: reported, which is all a flush can do for them
    return written, time.monotonic() - start


def test_a_throttled_writer_goes_at_the_pace_of_the_uploads(
    s3: Any, bucket: str, tmp_path: Path
) -> None:
    free = _fs(s3, tmp_path / "free")
    _, unthrottled = _write_then_flush(free, f"{bucket}/free", 12)
    throttled_fs = _fs(s3, tmp_path / "throttled", dirty_max_bytes=8 * MiB)
    writes, throttled = _write_then_flush(throttled_fs, f"{bucket}/throttled", 12)
    assert throttled_fs.stats()["writes_throttled"] >= 1  # the budget did make writers wait
    # The same bytes go up either way: waiting for room may not add more than slack.
    assert throttled <= 3 * unthrottled + 3.0, (writes, throttled, unthrottled)
    assert free.pending() == [] and throttled_fs.pending() == []


def test_writes_to_refused_keys_are_not_held_back_either(
    s3: Any, bucket: str, tmp_path: Path, proxy: Any
) -> None:
    # Every upload is refused for good (a FAILED record then no longer counts against the
    # budget): a throttled close() waits only for the store to say no.
    proxy.fail_next(10**6, status=400, code="KeyTooLongError", path_contains="refused")
    through_proxy = dict(s3.target_options(), endpoint_url=proxy.url)
    free = _fs_at(through_proxy, tmp_path / "free")
    _, unthrottled = _write_then_flush(free, f"{bucket}/refused-free", 6)
    throttled_fs = _fs_at(through_proxy, tmp_path / "throttled", dirty_max_bytes=4 * MiB)
    writes, throttled = _write_then_flush(throttled_fs, f"{bucket}/refused-throttled", 6)
    assert throttled_fs.stats()["writes_throttled"] >= 1
    assert throttled <= 3 * unthrottled + 3.0, (writes, throttled, unthrottled)
    assert {p["state"] for p in throttled_fs.pending()} == {"failed"}
