"""Failures through the mount get the errno a shell user expects; bad input gets one line."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, cleanup_mount, requires_fuse

from tiercache.mount import active_mounts

pytestmark = [pytest.mark.integration, requires_fuse]


def _open_errno(path: Path, mode: str) -> int | None:
    """The errno of opening (and, for reading, reading) ``path``; None if it worked."""
    try:
        with open(path, mode) as f:
            if "r" in mode:
                f.read()
    except OSError as exc:
        return exc.errno
    return None


def _errno_of(action: Callable[[], Any]) -> int | None:
    try:
        action()
    except OSError as exc:
        return exc.errno
    return None


def test_errnos_of_a_read_only_mount(
    bucket: str, s3_client: Any, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="d/file.txt", Body=b"contents")
    s3_client.put_object(Bucket=bucket, Key="d/sub/inner.txt", Body=b"inner")
    mnt = mount(f"s3://{bucket}/d", "--read-only")

    assert _open_errno(mnt / "missing.txt", "rb") == errno.ENOENT
    assert _errno_of(lambda: os.stat(mnt / "sub/missing")) == errno.ENOENT
    assert _open_errno(mnt / "file.txt", "wb") == errno.EROFS
    assert _open_errno(mnt / "new.txt", "wb") == errno.EROFS
    assert _errno_of(lambda: os.unlink(mnt / "file.txt")) == errno.EROFS
    assert _errno_of(lambda: os.mkdir(mnt / "newdir")) == errno.EROFS
    assert _open_errno(mnt / "sub", "rb") == errno.EISDIR
    assert _open_errno(mnt / "file.txt/x", "rb") == errno.ENOTDIR
    assert _errno_of(lambda: os.listdir(mnt / "file.txt")) == errno.ENOTDIR
    assert (mnt / "file.txt").read_bytes() == b"contents"  # reading still works


def test_errnos_of_a_writable_mount(
    bucket: str, s3_client: Any, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="w/sub/inner.txt", Body=b"inner")
    mnt = mount(f"s3://{bucket}/w")
    assert _open_errno(mnt / "sub", "wb") == errno.EISDIR
    assert _errno_of(lambda: os.rmdir(mnt / "sub")) == errno.ENOTEMPTY
    assert _errno_of(lambda: os.unlink(mnt / "sub")) == errno.EISDIR
    assert _errno_of(lambda: os.mkdir(mnt / "sub")) == errno.EEXIST
    assert _open_errno(mnt / "sub/inner.txt/x", "wb") == errno.ENOTDIR
    assert _errno_of(lambda: os.rmdir(mnt / "nothing-here")) == errno.ENOENT
    assert _errno_of(lambda: os.rename(mnt / "sub", mnt / "sub/inside")) == errno.EINVAL
    os.mkdir(mnt / "made")
    assert os.listdir(mnt / "made") == []
    os.rmdir(mnt / "made")
    assert not (mnt / "made").exists()


def test_a_busy_mount_needs_lazy_unmount(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="b/open.txt", Body=b"held open")
    mnt = mount(f"s3://{bucket}/b", "--read-only")
    with open(mnt / "open.txt", "rb") as held:
        line = _one_line_error(cli("unmount", str(mnt)))
        assert "busy" in line and "--lazy" in line
        done = cli("unmount", "--lazy", str(mnt))
        assert done.returncode == 0, done.stderr
        assert held.read() == b"held open"  # an open file keeps working after a lazy unmount
    assert os.listdir(mnt) == []


def test_foreground_mount_runs_until_unmounted(bucket: str, cli: Cli, tmp_path: Path) -> None:
    mnt = tmp_path / "fg"
    mnt.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-m", "tiercache.cli", "mount", f"s3://{bucket}", str(mnt), "-f"],
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while str(mnt) not in {m.mountpoint for m in active_mounts()}:
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        done = cli("unmount", str(mnt))
        assert done.returncode == 0, done.stderr
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            cleanup_mount(cli, str(mnt), child.pid)
        child.communicate()


def _one_line_error(done: Any) -> str:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return str(lines[0])


def test_bad_mount_input_says_what_to_do(
    bucket: str, cli: Cli, mount: Callable[..., Path], tmp_path: Path, s3: Any
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    line = _one_line_error(cli("mount", f"s3://{bucket}", str(tmp_path / "absent")))
    assert "does not exist" in line and "mkdir" in line

    full = tmp_path / "full"
    full.mkdir()
    (full / "somefile").write_text("x")
    assert "not empty" in _one_line_error(cli("mount", f"s3://{bucket}", str(full)))

    (tmp_path / "plain-file").write_text("x")
    assert "not a directory" in _one_line_error(
        cli("mount", f"s3://{bucket}", str(tmp_path / "plain-file"))
    )

    for url in ("http://example/bucket", "bucket/key", "s3://", "s3://Bad_Bucket!"):
        assert "bad URL" in _one_line_error(cli("mount", url, str(empty)))

    line = _one_line_error(cli("mount", f"s3://{bucket}-missing", str(empty)))
    assert "does not exist" in line

    no_keys = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    line = _one_line_error(cli("mount", f"s3://{bucket}", str(empty), **no_keys))
    assert "no credentials" in line and "AWS_ACCESS_KEY_ID" in line

    mnt = mount(f"s3://{bucket}")
    line = _one_line_error(cli("mount", f"s3://{bucket}", str(mnt)))
    assert "already a mount point" in line and "tiercache unmount" in line

    assert "not a tiercache mount" in _one_line_error(cli("unmount", str(empty)))
    assert os.listdir(empty) == []
    for done in [cli("mount", f"s3://{bucket}", str(empty), **no_keys)]:
        assert s3.secret not in done.stdout + done.stderr


def test_a_full_tier_answers_enospc_and_commits_nothing(
    small_tier: Path, bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt = mount(f"s3://{bucket}/full", "--local-dir", str(small_tier))
    chunk = os.urandom(1024 * 1024)

    def write_too_much() -> None:
        with open(mnt / "too-big.bin", "wb") as f:
            for _ in range(12):
                f.write(chunk)

    assert _errno_of(write_too_much) == errno.ENOSPC
    with open(mnt / "small.bin", "wb") as f:  # the failed file's space was given back
        f.write(chunk)
    done = cli("flush", "--local-dir", str(small_tier), "--timeout", "60")
    assert done.returncode == 0, done.stderr
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == ["full/small.bin"]
