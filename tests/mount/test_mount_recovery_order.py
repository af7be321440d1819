"""A dead mount's acknowledged write is recovered in its place: it never overtakes a newer one.

A file written through the mount, fsynced and held open is staged, not committed, when the
mount is killed; recovery commits it. A write of the same key acknowledged after that fsync
(another process, the fsspec face, the same tier) is newer and must be what the store ends
with, whenever recovery runs.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, cleanup_mount, requires_fuse, stored_or_none

from tiercache import TierCacheFileSystem

pytestmark = [pytest.mark.integration, requires_fuse]

MiB = 1024 * 1024


def _wait_dead(pid: int, timeout: float = 30) -> bool:
    """Whether the killed mount process is gone (or a zombie: its files, and the lock on its
    staged file, are closed either way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _kill_mount_holding_a_synced_file(cli: Cli, bucket: str, tmp_path: Path, body: bytes) -> None:
    """Mount, write ``job/ckpt.bin`` through it, fsync, and kill -9 the mount with it open."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    pid = int(cli.json("mount", f"s3://{bucket}/job", str(mnt))["pid"])
    fd = -1
    try:
        fd = os.open(mnt / "ckpt.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, body)
        os.fsync(fd)  # acknowledged: must survive the mount's death
        os.kill(pid, signal.SIGKILL)
        assert _wait_dead(pid)
    finally:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass  # the mount is dead
        cleanup_mount(cli, str(mnt), pid)


def test_a_dead_mounts_older_write_never_overtakes_a_newer_one(
    bucket: str, s3: Any, s3_client: Any, cli: Cli, tmp_path: Path
) -> None:
    older = b"written through the mount, fsynced, then the mount died " + os.urandom(MiB)
    newer = b"written later through the fsspec face " + os.urandom(MiB)
    _kill_mount_holding_a_synced_file(cli, bucket, tmp_path, older)
    fs = TierCacheFileSystem(
        target_options=s3.target_options(), local_dir=cli.local_dir, skip_instance_cache=True
    )
    with fs.open(f"{bucket}/job/ckpt.bin", "wb") as f:
        f.write(newer)  # acknowledged after the mount's fsync: the newer version
    assert fs.cat_file(f"{bucket}/job/ckpt.bin") == newer
    done = cli("flush", "--timeout", "120", timeout=180)
    assert done.returncode == 0, done.stderr
    assert stored_or_none(s3_client, bucket, "job/ckpt.bin") == newer
    fs.flush(timeout=60)  # this process reconciles too: still nothing older comes back
    assert stored_or_none(s3_client, bucket, "job/ckpt.bin") == newer
    report = fs.fsck(scrub=False)
    assert report["pending"] == [] and report["closed_committed"] == 0


def test_a_dead_mounts_write_acknowledged_last_wins(
    bucket: str, s3: Any, s3_client: Any, cli: Cli, tmp_path: Path
) -> None:
    earlier = b"written through the fsspec face first " + os.urandom(MiB)
    later = b"then through the mount, fsynced, and the mount died " + os.urandom(MiB)
    fs = TierCacheFileSystem(
        target_options=s3.target_options(), local_dir=cli.local_dir, skip_instance_cache=True
    )
    with fs.open(f"{bucket}/job/ckpt.bin", "wb") as f:
        f.write(earlier)
    fs.flush(timeout=60)
    _kill_mount_holding_a_synced_file(cli, bucket, tmp_path, later)
    done = cli("flush", "--timeout", "120", timeout=180)
    assert done.returncode == 0, done.stderr
    assert stored_or_none(s3_client, bucket, "job/ckpt.bin") == later
