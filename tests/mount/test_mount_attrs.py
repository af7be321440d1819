"""Times, modes and directory renames through a read-write mount, checked in the store by boto3."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, requires_fuse, stored_or_none

from tiercache.mount.library import prefer_libfuse3
from tiercache.mount.moves import TreeMoveError, move_tree, objects_under

pytestmark = [pytest.mark.integration, requires_fuse]


def fuse_major() -> int:
    """The major version of the libfuse a mount here loads (0: none loads)."""
    prefer_libfuse3()  # as the mount does
    try:
        import mfusepy  # loads libfuse: only here, once FUSE is known to be usable
    except (ImportError, OSError):
        return 0
    return int(mfusepy.fuse_version_major)


FUSE_MAJOR = fuse_major()
# A time with nanoseconds (what ``stat`` reports must be exactly what was set).
SET_NS = 1_500_000_000_123_456_789


def flush(cli: Cli) -> None:
    done = cli("flush", "--timeout", "120")
    assert done.returncode == 0, done.stderr


def run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, cwd=cwd)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def metadata(s3_client: Any, bucket: str, key: str) -> dict[str, str]:
    try:
        return dict(s3_client.head_object(Bucket=bucket, Key=key)["Metadata"])
    except s3_client.exceptions.ClientError:
        return {}


def unmount(cli: Cli, mnt: Path) -> None:
    done = cli("unmount", str(mnt))
    assert done.returncode == 0, done.stderr


def test_touch_utimes_and_chmod_are_kept_as_object_metadata(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="a/stored.txt", Body=b"stored bytes")
    mnt = mount(f"s3://{bucket}/a")
    stored = mnt / "stored.txt"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o644  # no metadata: the default

    os.utime(stored, ns=(SET_NS, SET_NS))
    os.chmod(stored, 0o600)
    st = stored.stat()
    assert (st.st_mtime_ns, stat.S_IMODE(st.st_mode)) == (SET_NS, 0o600)
    assert stored.read_bytes() == b"stored bytes"

    run("touch", "-d", "2020-01-02 03:04:05 UTC", str(mnt / "made.txt"))  # creates it
    assert (mnt / "made.txt").stat().st_mtime == 1577934245
    (mnt / "written.txt").write_bytes(b"written here")
    os.chmod(mnt / "written.txt", 0o751)
    run("touch", "-d", "@1600000000.5", str(mnt / "written.txt"))
    before = time.time_ns()
    run("touch", str(mnt / "made.txt"))  # no time given: now
    assert (mnt / "made.txt").stat().st_mtime_ns >= before - 10**9
    now_ns = (mnt / "made.txt").stat().st_mtime_ns

    flush(cli)
    wanted = {
        "stored.txt": {"mtime": "1500000000.123456789", "mode": str(0o100600)},
        "written.txt": {"mtime": "1600000000.500000000", "mode": str(0o100751)},
    }
    for name, meta in wanted.items():
        wait_for(
            lambda n=name, m=meta: m.items() <= metadata(s3_client, bucket, f"a/{n}").items(),
            f"metadata of {name} in the store",
        )
    unmount(cli, mnt)  # publishes what is still kept here
    assert stored_or_none(s3_client, bucket, "a/stored.txt") == b"stored bytes"
    assert stored_or_none(s3_client, bucket, "a/written.txt") == b"written here"

    again = mount(f"s3://{bucket}/a", name="again")
    st = (again / "stored.txt").stat()
    assert (st.st_mtime_ns, stat.S_IMODE(st.st_mode)) == (SET_NS, 0o600)
    st = (again / "written.txt").stat()
    assert (st.st_mtime_ns, stat.S_IMODE(st.st_mode)) == (1_600_000_000_500_000_000, 0o751)
    assert (again / "made.txt").stat().st_mtime_ns == now_ns
    assert (again / "written.txt").read_bytes() == b"written here"

    with open(again / "written.txt", "r+b") as f:  # a rewrite: a new mtime, the same mode
        f.write(b"W")
    st = (again / "written.txt").stat()
    assert st.st_mtime_ns > 1_600_000_000_500_000_000 and stat.S_IMODE(st.st_mode) == 0o751
    flush(cli)
    wait_for(
        lambda: metadata(s3_client, bucket, "a/written.txt").get("mode") == str(0o100751),
        "the mode of the rewritten file in the store",
    )
    assert stored_or_none(s3_client, bucket, "a/written.txt") == b"Written here"
    assert "mtime" not in metadata(s3_client, bucket, "a/written.txt")


def source_tree(root: Path) -> Path:
    src = root / "src"
    (src / "sub").mkdir(parents=True)
    for name, mode, when in (("a.txt", 0o644, 1_400_000_000), ("sub/b.sh", 0o755, 1_450_000_000)):
        path = src / name
        path.write_bytes(os.urandom(5000) + name.encode())
        path.chmod(mode)
        os.utime(path, (when, when))
    return src


def same_files(src: Path, dst: Path) -> None:
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        copy = dst / path.relative_to(src)
        assert copy.read_bytes() == path.read_bytes(), copy
        want, got = path.stat(), copy.stat()
        assert int(got.st_mtime) == int(want.st_mtime), copy
        assert stat.S_IMODE(got.st_mode) == stat.S_IMODE(want.st_mode), copy


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_rsync_a_twice_copies_nothing_the_second_time(
    bucket: str, cli: Cli, mount: Callable[..., Path], tmp_path: Path
) -> None:
    src = source_tree(tmp_path)
    mnt = mount(f"s3://{bucket}/sync")
    first = run("rsync", "-a", "--itemize-changes", f"{src}/", f"{mnt}/dst/")
    assert "a.txt" in first and "sub/b.sh" in first
    same_files(src, mnt / "dst")
    second = run("rsync", "-a", "--itemize-changes", f"{src}/", f"{mnt}/dst/")
    assert second == ""
    flush(cli)
    unmount(cli, mnt)
    again = mount(f"s3://{bucket}/sync", name="again")
    same_files(src, again / "dst")  # what the store kept, through a new mount
    # Directories have no object to keep times on: only a new mount's own are set again.
    third = run("rsync", "-a", "--itemize-changes", f"{src}/", f"{again}/dst/")
    assert all(line.startswith(".d..t") for line in third.splitlines()), third


def test_cp_p_keeps_times_and_modes(
    bucket: str, mount: Callable[..., Path], tmp_path: Path
) -> None:
    src = source_tree(tmp_path)
    mnt = mount(f"s3://{bucket}/copies")
    run("cp", "-rp", str(src), str(mnt / "cp"))
    same_files(src, mnt / "cp")


@pytest.mark.skipif(
    FUSE_MAJOR == 2,
    reason="libfuse 2 drops a change of the mtime alone, which GNU tar -x makes (it leaves "
    "the atime); libfuse 3 passes it on",
)
def test_tar_x_keeps_times_and_modes(
    bucket: str, mount: Callable[..., Path], tmp_path: Path
) -> None:
    src = source_tree(tmp_path)
    mnt = mount(f"s3://{bucket}/copies")
    archive = tmp_path / "src.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(src, arcname="tree")
    (mnt / "untar").mkdir()
    run("tar", "-xpf", str(archive), cwd=mnt / "untar")
    same_files(src, mnt / "untar" / "tree")


def test_directory_renames_made_and_stored(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    for key in ("d/stored/x.bin", "d/stored/deep/y.bin"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    mnt = mount(f"s3://{bucket}/d")

    (mnt / "made").mkdir()
    (mnt / "made" / "inner").mkdir()
    (mnt / "made" / "inner" / "f.txt").write_bytes(b"made here")
    os.rename(mnt / "made", mnt / "made2")
    assert sorted(os.listdir(mnt)) == ["made2", "stored"]
    assert (mnt / "made2" / "inner" / "f.txt").read_bytes() == b"made here"

    os.rename(mnt / "stored", mnt / "moved")
    assert sorted(os.listdir(mnt)) == ["made2", "moved"]
    assert (mnt / "moved" / "deep" / "y.bin").read_bytes() == b"d/stored/deep/y.bin"
    assert not (mnt / "stored").exists()

    (mnt / "empty").mkdir()
    os.rename(mnt / "empty", mnt / "empty2")
    assert (mnt / "empty2").is_dir() and not (mnt / "empty").exists()

    flush(cli)
    assert stored_or_none(s3_client, bucket, "d/moved/x.bin") == b"d/stored/x.bin"
    assert stored_or_none(s3_client, bucket, "d/moved/deep/y.bin") == b"d/stored/deep/y.bin"
    assert stored_or_none(s3_client, bucket, "d/stored/x.bin") is None
    assert stored_or_none(s3_client, bucket, "d/made2/inner/f.txt") == b"made here"
    assert stored_or_none(s3_client, bucket, "d/made/inner/f.txt") is None

    # Onto a directory that holds something: refused, nothing moved.
    (mnt / "made2" / "keep.txt").write_bytes(b"keep")
    try:
        os.rename(mnt / "moved", mnt / "made2")
    except OSError as exc:
        assert exc.errno == 39  # ENOTEMPTY
    else:
        raise AssertionError("renamed onto a directory that holds files")
    assert (mnt / "moved" / "x.bin").exists()


def test_rmdir_after_deleting_the_last_file(
    bucket: str, s3_client: Any, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="r/stored/only.txt", Body=b"x")
    mnt = mount(f"s3://{bucket}/r")
    assert os.listdir(mnt / "stored") == ["only.txt"]
    (mnt / "stored" / "only.txt").unlink()
    assert os.listdir(mnt / "stored") == []
    os.rmdir(mnt / "stored")
    assert os.listdir(mnt) == []
    assert stored_or_none(s3_client, bucket, "r/stored/only.txt") is None

    (mnt / "made").mkdir()
    (mnt / "made" / "f").write_bytes(b"y")
    (mnt / "made" / "f").unlink()
    os.rmdir(mnt / "made")  # rm -r of a tree written here
    assert os.listdir(mnt) == []


def test_a_directory_rename_whose_copy_fails_leaves_everything_as_it_was(
    bucket: str,
    s3_client: Any,
    make_fs: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = [f"t/dir/{name}" for name in ("a", "b", "sub/c")]
    for key in keys:
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    fs = make_fs()
    real_copy = fs.cp_file

    def refused_second(src: str, dst: str, **kwargs: Any) -> None:
        if src.endswith("/dir/b"):  # the store refuses this one copy
            raise PermissionError(13, "copy refused by the store", src)
        real_copy(src, dst, **kwargs)

    monkeypatch.setattr(fs, "cp_file", refused_second)
    names = objects_under(fs, f"{bucket}/t/dir")
    assert sorted(names) == sorted(f"{bucket}/{key}" for key in keys)
    with pytest.raises(TreeMoveError):
        move_tree(fs, f"{bucket}/t/dir", f"{bucket}/t/new", names)
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="t/")
    assert sorted(o["Key"] for o in listed.get("Contents", [])) == sorted(keys)
    assert "copying" in caplog.text and "nothing was moved" in caplog.text
