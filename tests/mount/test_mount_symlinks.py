"""Symbolic links on a read-write mount: stored as s3fs-fuse stores them, kept across mounts."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, requires_fuse, stored_or_none

pytestmark = [pytest.mark.integration, requires_fuse]

LINK_MODE = str(stat.S_IFLNK | 0o777)  # "41471", s3fs-fuse's x-amz-meta-mode of a link


def _unmount(cli: Cli, mnt: Path) -> None:
    done = cli("unmount", str(mnt))
    assert done.returncode == 0, done.stderr


def _stored_mode(s3_client: Any, bucket: str, key: str) -> str | None:
    head = s3_client.head_object(Bucket=bucket, Key=key)
    mode: str | None = head["Metadata"].get("mode")
    return mode


def test_ln_s_readlink_ls_and_a_remount(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="w/lib/data.txt", Body=b"through the link")
    mnt = mount(f"s3://{bucket}/w")
    subprocess.run(["ln", "-s", "lib", str(mnt / "lib64")], check=True)
    subprocess.run(["ln", "-s", "lib/data.txt", str(mnt / "data")], check=True)
    os.symlink("../nowhere", mnt / "dangling")

    def check(where: Path) -> None:
        assert os.readlink(where / "lib64") == "lib"
        assert os.readlink(where / "dangling") == "../nowhere"
        assert stat.S_ISLNK(os.lstat(where / "data").st_mode)
        assert os.lstat(where / "data").st_size == len("lib/data.txt")
        assert (where / "data").read_bytes() == b"through the link"  # followed
        assert (where / "lib64" / "data.txt").read_bytes() == b"through the link"
        assert (where / "lib64").is_dir() and (where / "lib64").is_symlink()
        assert not (where / "dangling").exists() and (where / "dangling").is_symlink()
        listing = subprocess.run(
            ["ls", "-l", str(where)], capture_output=True, text=True, check=True
        ).stdout
        assert any(line.startswith("l") and "lib64 -> lib" in line for line in listing.split("\n"))
        assert "data -> lib/data.txt" in listing and "dangling -> ../nowhere" in listing
        assert stat.S_ISREG(os.lstat(where / "lib" / "data.txt").st_mode)

    check(mnt)
    # In the store at once (no upload to wait for): the target as bytes, the type as metadata.
    assert stored_or_none(s3_client, bucket, "w/lib64") == b"lib"
    assert _stored_mode(s3_client, bucket, "w/lib64") == LINK_MODE

    with pytest.raises(FileExistsError):
        os.symlink("elsewhere", mnt / "lib64")
    os.rename(mnt / "data", mnt / "data2")
    assert os.readlink(mnt / "data2") == "lib/data.txt"
    os.unlink(mnt / "dangling")
    assert not os.path.lexists(mnt / "dangling")
    assert stored_or_none(s3_client, bucket, "w/lib/data.txt") == b"through the link"
    when = 1_600_000_000_250_000_000
    os.utime(mnt / "lib64", ns=(when, when), follow_symlinks=False)  # touch -h: the link's own
    assert os.lstat(mnt / "lib64").st_mtime_ns == when

    _unmount(cli, mnt)  # publishes the link's mtime
    again = mount(f"s3://{bucket}/w", name="again")
    assert os.readlink(again / "data2") == "lib/data.txt"
    assert stat.S_ISLNK(os.lstat(again / "lib64").st_mode)
    assert os.lstat(again / "lib64").st_mtime_ns == when
    assert _stored_mode(s3_client, bucket, "w/lib64") == LINK_MODE
    assert sorted(os.listdir(again)) == ["data2", "lib", "lib64"]
    assert stored_or_none(s3_client, bucket, "w/data2") == b"lib/data.txt"
    assert _stored_mode(s3_client, bucket, "w/data2") == LINK_MODE


def test_links_from_tar_cp_a_and_git_clone(
    bucket: str, s3_client: Any, mount: Callable[..., Path], tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f.txt").write_text("f")
    os.symlink("sub/f.txt", tree / "link")
    subprocess.run(["tar", "-cf", str(tmp_path / "t.tar"), "-C", str(tree), "."], check=True)
    git = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "HOME": str(tmp_path)}
    git |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "links"]):
        subprocess.run(["git", "-C", str(tree), *command], env=git, check=True)
    mnt = mount(f"s3://{bucket}/t")

    (mnt / "untar").mkdir()
    subprocess.run(["tar", "-xf", str(tmp_path / "t.tar"), "-C", str(mnt / "untar")], check=True)
    subprocess.run(["cp", "-a", str(tree), str(mnt / "copy")], check=True)
    cloned = subprocess.run(
        ["git", "clone", "-q", str(tree), str(mnt / "clone")],
        env=git,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cloned.returncode == 0, cloned.stderr
    for where in ("untar", "copy", "clone"):
        assert os.readlink(mnt / where / "link") == "sub/f.txt", where
        assert (mnt / where / "link").read_text() == "f", where
    assert os.lstat(mnt / "copy" / "link").st_mtime_ns == os.lstat(tree / "link").st_mtime_ns
    status = subprocess.run(
        ["git", "-C", str(mnt / "clone"), "status", "--porcelain"],
        env=git,
        capture_output=True,
        text=True,
        check=True,
    )
    assert status.stdout == ""  # the link checked out is the link committed


def test_a_link_another_client_stored_is_a_link(
    bucket: str, s3_client: Any, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="d/real", Body=b"x")
    s3_client.put_object(Bucket=bucket, Key="d/alias", Body=b"real", Metadata={"mode": LINK_MODE})
    s3_client.put_object(Bucket=bucket, Key="d/plain", Body=b"real")  # no metadata: a file
    mnt = mount(f"s3://{bucket}/d")
    assert os.readlink(mnt / "alias") == "real"
    assert (mnt / "alias").read_bytes() == b"x"
    assert not (mnt / "plain").is_symlink() and (mnt / "plain").read_bytes() == b"real"
    with pytest.raises(OSError) as raised:
        os.readlink(mnt / "plain")
    assert raised.value.errno == errno.EINVAL


def test_a_read_only_mount_refuses_links(
    bucket: str, s3_client: Any, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="r/a", Body=b"x")
    mnt = mount(f"s3://{bucket}/r", "--read-only")
    with pytest.raises(OSError) as raised:
        os.symlink("a", mnt / "b")
    assert raised.value.errno == errno.EROFS


def test_python_venv_with_copies_in_the_mount(
    bucket: str, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt = mount(f"s3://{bucket}/envs")
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--copies", "--without-pip", str(mnt / "venv")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    if os.path.lexists(mnt / "venv" / "lib64"):  # made on 64-bit Linux, a link to lib
        assert os.readlink(mnt / "venv" / "lib64") == "lib"
    python = mnt / "venv" / "bin" / "python"
    ran = subprocess.run(
        [str(python), "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(mnt / "venv")
    flush = cli("flush", "--timeout", "120")
    assert flush.returncode == 0, flush.stderr
