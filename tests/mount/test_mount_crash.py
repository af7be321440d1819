"""A mount process killed with ``kill -9`` after ``close()`` loses nothing: flush uploads it."""

from __future__ import annotations

import errno
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import s3server
from mount_helpers import active_mounts, cleanup_mount, make_cli, requires_fuse, server_env

pytestmark = [pytest.mark.integration, requires_fuse]

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server of this module's own: freezing it must not disturb the shared one."""
    server = s3server.start_server(data_dir=str(tmp_path_factory.mktemp("private-s3")))
    yield server
    server.stop()


def _client(server: Any) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
    )


def _wait_unmounted(mountpoint: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mountpoint not in {m.mountpoint for m in active_mounts()}:
            return True
        time.sleep(0.05)
    return False


def test_kill_9_with_dirty_files_loses_nothing(private: Any, tmp_path: Path) -> None:
    bucket = f"tc-crash-{secrets.token_hex(5)}"
    client = _client(private)
    client.create_bucket(Bucket=bucket)
    cli = make_cli(
        tmp_path,
        server_env(private.endpoint, private.access_key, private.secret_key, private.region),
    )
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    report = cli.json("mount", f"s3://{bucket}/job", str(mnt))
    pid = int(report["pid"])
    data = {"ckpt/model.bin": os.urandom(7 * MiB), "ckpt/.metadata": b"meta"}
    try:
        (mnt / "ckpt").mkdir()  # while the store answers
        private.pause()  # no upload can finish from here on
        try:
            source = tmp_path / "model.bin"
            source.write_bytes(data["ckpt/model.bin"])
            subprocess.run(["cp", str(source), str(mnt / "ckpt/model.bin")], check=True, timeout=60)
            (mnt / "ckpt/.metadata").write_bytes(data["ckpt/.metadata"])  # closed: durable
            os.kill(pid, signal.SIGKILL)
            # fusermount3's auto_unmount takes the dead mount away.
            assert _wait_unmounted(str(mnt), 15)
        finally:
            private.resume()
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
        private.resume()
        cleanup_mount(cli, str(mnt), pid)


def test_a_frozen_store_answers_eio_in_bounded_time(private: Any, tmp_path: Path) -> None:
    bucket = f"tc-crash-{secrets.token_hex(5)}"
    client = _client(private)
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="d/remote.bin", Body=os.urandom(MiB))
    cli = make_cli(
        tmp_path,
        server_env(private.endpoint, private.access_key, private.secret_key, private.region),
    )
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    pid = int(cli.json("mount", f"s3://{bucket}/d", str(mnt), "--read-only")["pid"])
    try:
        assert os.listdir(mnt) == ["remote.bin"]  # listed while the store answers
        private.pause()
        try:
            with pytest.raises(OSError) as caught:
                (mnt / "remote.bin").read_bytes()  # not cached: needs the store
            assert caught.value.errno == errno.EIO
        finally:
            private.resume()
    finally:
        cleanup_mount(cli, str(mnt), pid)
