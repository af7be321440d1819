"""A mount on a frozen store: ``kill -9`` after ``close()`` loses nothing; reads fail with EIO.

Both tests freeze the store (SIGSTOP), which a test can only do to a server it owns: they run on
``own_server``, a SeaweedFS of this module's own, not on the server under test.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.mount_helpers import active_mounts, cleanup_mount, make_cli, requires_fuse

if TYPE_CHECKING:  # the fixture's class; imported for annotations only
    from support.servers_under_test import OwnServer

pytestmark = [pytest.mark.integration, requires_fuse]

MiB = 1024 * 1024


def _wait_unmounted(mountpoint: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mountpoint not in {m.mountpoint for m in active_mounts()}:
            return True
        time.sleep(0.05)
    return False


def test_kill_9_with_dirty_files_loses_nothing(own_server: OwnServer, tmp_path: Path) -> None:
    bucket = f"tc-crash-{secrets.token_hex(5)}"
    client = own_server.client()
    client.create_bucket(Bucket=bucket)
    cli = make_cli(tmp_path, own_server.env())
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    report = cli.json("mount", f"s3://{bucket}/job", str(mnt))
    pid = int(report["pid"])
    data = {"ckpt/model.bin": os.urandom(7 * MiB), "ckpt/.metadata": b"meta"}
    try:
        (mnt / "ckpt").mkdir()  # while the store answers
        own_server.pause()  # no upload can finish from here on
        try:
            source = tmp_path / "model.bin"
            source.write_bytes(data["ckpt/model.bin"])
            subprocess.run(["cp", str(source), str(mnt / "ckpt/model.bin")], check=True, timeout=60)
            (mnt / "ckpt/.metadata").write_bytes(data["ckpt/.metadata"])  # closed: durable
            os.kill(pid, signal.SIGKILL)
            # fusermount3's auto_unmount takes the dead mount away.
            assert _wait_unmounted(str(mnt), 15)
        finally:
            own_server.resume()
        listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
        assert listed == []  # nothing was uploaded before the kill

        status = cli.json("status")
        assert sorted(p["name"] for p in status["pending"]) == sorted(
            f"{bucket}/job/{k}" for k in data
        )
        done = cli("flush", "--timeout", "120", timeout=180)
        assert done.returncode == 0, done.stderr
        for key, value in data.items():
            body = client.get_object(Bucket=bucket, Key=f"job/{key}")["Body"].read()
            assert body == value
    finally:
        own_server.resume()
        cleanup_mount(cli, str(mnt), pid)


def test_a_frozen_store_answers_eio_in_bounded_time(own_server: OwnServer, tmp_path: Path) -> None:
    bucket = f"tc-crash-{secrets.token_hex(5)}"
    client = own_server.client()
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="d/remote.bin", Body=os.urandom(MiB))
    cli = make_cli(tmp_path, own_server.env())
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    pid = int(cli.json("mount", f"s3://{bucket}/d", str(mnt), "--read-only")["pid"])
    try:
        assert os.listdir(mnt) == ["remote.bin"]  # listed while the store answers
        own_server.pause()
        try:
            with pytest.raises(OSError) as caught:
                (mnt / "remote.bin").read_bytes()  # not cached: needs the store
            assert caught.value.errno == errno.EIO
        finally:
            own_server.resume()
    finally:
        cleanup_mount(cli, str(mnt), pid)
