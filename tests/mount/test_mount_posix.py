"""A read-write mount used as programs use a local filesystem, checked in the store by boto3."""

from __future__ import annotations

import mmap
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, requires_fuse, stored_or_none

pytestmark = [pytest.mark.integration, requires_fuse]

KiB = 1024
MiB = 1024 * KiB


def flush(cli: Cli) -> None:
    done = cli("flush", "--timeout", "120")
    assert done.returncode == 0, done.stderr


def bash(script: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, timeout=60, check=True, **kwargs
    )


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def test_a_file_open_anywhere_is_published_only_at_its_last_close(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt = mount(f"s3://{bucket}/out")
    fd = os.open(mnt / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"first\n")
    # A child shell writes through the inherited descriptor and a duplicate of it, closes
    # the duplicate and exits: FUSE sends a flush for each of those closes.
    bash(f"echo second >&{fd}; exec {{d}}>&{fd}; echo third >&$d; exec {{d}}>&-", pass_fds=(fd,))
    flush(cli)
    assert stored_or_none(s3_client, bucket, "out/log.txt") is None  # still open here
    assert (mnt / "log.txt").read_bytes() == b"first\nsecond\nthird\n"
    os.close(fd)
    flush(cli)
    assert stored_or_none(s3_client, bucket, "out/log.txt") == b"first\nsecond\nthird\n"


def test_read_write_descriptors_read_what_is_there(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    old = os.urandom(3 * MiB + 5)
    s3_client.put_object(Bucket=bucket, Key="out/existing.bin", Body=old)
    mnt = mount(f"s3://{bucket}/out")

    fd = os.open(mnt / "new.bin", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"0123456789", 0)
    os.pwrite(fd, b"ab", 4)
    assert os.pread(fd, 100, 0) == b"0123ab6789"
    os.close(fd)

    fd = os.open(mnt / "existing.bin", os.O_RDWR)  # no O_TRUNC: starts from the object
    assert os.pread(fd, MiB, 2 * MiB) == old[2 * MiB : 3 * MiB]
    os.pwrite(fd, b"patched", MiB)
    assert os.pread(fd, 20, MiB - 5) == old[MiB - 5 : MiB] + b"patched" + old[MiB + 7 : MiB + 15]
    assert os.fstat(fd).st_size == len(old)
    os.close(fd)

    fd = os.open(mnt / "existing.bin", os.O_RDWR)  # opened and only read: nothing to commit
    assert os.pread(fd, 7, MiB) == b"patched"
    os.close(fd)

    flush(cli)
    assert stored_or_none(s3_client, bucket, "out/new.bin") == b"0123ab6789"
    assert stored_or_none(s3_client, bucket, "out/existing.bin") == (
        old[:MiB] + b"patched" + old[MiB + 7 :]
    )


def test_sqlite_database_made_closed_reopened_and_queried(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path], tmp_path: Path
) -> None:
    mnt = mount(f"s3://{bucket}/db")
    db = mnt / "app.db"
    with sqlite3.connect(db) as con:
        con.execute("create table t (k integer primary key, v text)")
        con.executemany("insert into t values (?, ?)", [(i, f"row {i}" * 20) for i in range(500)])
    con.close()
    con = sqlite3.connect(db)  # reopen: reads on a read-write descriptor
    assert con.execute("select count(*), max(k) from t").fetchone() == (500, 499)
    with con:
        con.executemany("insert into t values (?, ?)", [(i, "more") for i in range(500, 600)])
    assert con.execute("pragma integrity_check").fetchone() == ("ok",)
    con.close()
    assert not (mnt / "app.db-journal").exists()

    flush(cli)
    copy = tmp_path / "copy.db"
    copy.write_bytes(stored_or_none(s3_client, bucket, "db/app.db") or b"")
    assert stored_or_none(s3_client, bucket, "db/app.db-journal") is None
    con = sqlite3.connect(copy)
    assert con.execute("select count(*), max(k) from t").fetchone() == (600, 599)
    assert con.execute("pragma integrity_check").fetchone() == ("ok",)
    con.close()


def test_numpy_memmap_write_and_update(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    np = pytest.importorskip("numpy", reason="numpy is not installed")
    mnt = mount(f"s3://{bucket}/arrays")
    values = np.arange(1 << 20, dtype=np.float32)
    written = np.memmap(mnt / "a.f32", dtype=np.float32, mode="w+", shape=values.shape)
    written[:] = values
    written.flush()
    assert (mnt / "a.f32").read_bytes() == values.tobytes()  # right after flush
    del written

    updated = np.memmap(mnt / "a.f32", dtype=np.float32, mode="r+")
    assert bool((updated[:1000] == values[:1000]).all())
    updated[100:200] = -1
    updated.flush()
    del updated
    values[100:200] = -1

    flush(cli)
    assert stored_or_none(s3_client, bucket, "arrays/a.f32") == values.tobytes()


def test_a_killed_dd_publishes_nothing(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path], tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="out/kept.bin", Body=b"the old object")
    mnt = mount(f"s3://{bucket}/out")
    fifo = tmp_path / "fifo"
    for name, feed in (("fresh.bin", 0), ("partial.bin", 3 * MiB), ("kept.bin", MiB)):
        os.mkfifo(fifo)
        dd = subprocess.Popen(
            ["dd", f"if={fifo}", f"of={mnt / name}", "bs=64K", "status=none"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with open(fifo, "wb") as source:  # dd opens its output once this opens
            wait_for(lambda n=name: (mnt / n).exists() and os.stat(mnt / n).st_size == 0, "dd")
            source.write(os.urandom(feed))
            source.flush()
            wait_for(lambda n=name, f=feed: os.stat(mnt / n).st_size >= f, "dd wrote")
            dd.send_signal(signal.SIGKILL)
            assert dd.wait(30) == -signal.SIGKILL
        fifo.unlink()
    flush(cli)
    assert stored_or_none(s3_client, bucket, "out/fresh.bin") is None
    assert stored_or_none(s3_client, bucket, "out/partial.bin") is None
    assert stored_or_none(s3_client, bucket, "out/kept.bin") == b"the old object"

    # A dd that finishes publishes, of course.
    (tmp_path / "src").write_bytes(b"complete")
    subprocess.run(
        ["dd", f"if={tmp_path / 'src'}", f"of={mnt / 'done.bin'}"], check=True, capture_output=True
    )
    flush(cli)
    assert stored_or_none(s3_client, bucket, "out/done.bin") == b"complete"


def test_touch_then_append_keeps_the_bytes(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="out/notes.txt", Body=b"hello\n")
    mnt = mount(f"s3://{bucket}/out")
    f = mnt / "notes.txt"
    bash(f"touch {f}")
    assert os.stat(f).st_size == 6
    bash(f"chmod 600 {f}; touch -d '2020-01-01' {f}")
    assert os.stat(f).st_size == 6
    bash(f"echo x >> {f}")
    assert f.read_bytes() == b"hello\nx\n"
    bash(f"touch {f}; echo y >> {f}")
    assert os.stat(f).st_size == 10
    flush(cli)
    assert stored_or_none(s3_client, bucket, "out/notes.txt") == b"hello\nx\ny\n"


def test_unlinked_while_open_and_renamed_right_after_close(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt = mount(f"s3://{bucket}/out")
    with open(mnt / "scratch", "w+b") as f:
        f.write(b"temporary")
        os.unlink(mnt / "scratch")
        f.write(b" still usable")
        f.seek(0)
        assert f.read() == b"temporary still usable"
    # close; rename: the rename can reach the mount before the release of the closed file.
    for i in range(20):
        with open(mnt / "index.lock", "wb") as f:
            f.write(b"version %d" % i)
        os.rename(mnt / "index.lock", mnt / "index")
        assert (mnt / "index").read_bytes() == b"version %d" % i
    flush(cli)
    assert stored_or_none(s3_client, bucket, "out/scratch") is None
    assert stored_or_none(s3_client, bucket, "out/index.lock") is None
    assert stored_or_none(s3_client, bucket, "out/index") == b"version 19"


class FsxRun:
    """Random writes, truncates, reads, renames, reopens and mmap writes against a model."""

    def __init__(self, mnt: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.names = [mnt / "fsx-a", mnt / "fsx-b"]
        self.model = bytearray()
        self.fd = os.open(self.names[0], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def step(self) -> str:
        rng, model = self.rng, self.model
        op = rng.choice(["write", "write", "truncate", "read", "read", "rename", "mmap", "reopen"])
        if op == "write":
            offset, data = (
                rng.randrange(len(model) + 4 * KiB),
                rng.randbytes(rng.randrange(64 * KiB)),
            )
            assert os.pwrite(self.fd, data, offset) == len(data)
            model.extend(bytes(max(0, offset + len(data) - len(model))))
            model[offset : offset + len(data)] = data
        elif op == "truncate":
            length = rng.randrange(256 * KiB)
            os.ftruncate(self.fd, length)
            del model[length:]
            model.extend(bytes(length - len(model)))
        elif op == "read":
            offset, size = rng.randrange(len(model) + 1), rng.randrange(1, 96 * KiB)
            assert os.pread(self.fd, size, offset) == bytes(model[offset : offset + size])
        elif op == "rename":  # close then rename at once, as git and rsync do
            os.close(self.fd)
            os.rename(self.names[0], self.names[1])
            self.names.reverse()
            self.fd = os.open(self.names[0], os.O_RDWR)
        elif op == "mmap" and model:
            offset = rng.randrange(len(model))
            data = rng.randbytes(min(rng.randrange(1, 16 * KiB), len(model) - offset))
            with mmap.mmap(self.fd, len(model)) as mapped:
                mapped[offset : offset + len(data)] = data
                mapped.flush()
            model[offset : offset + len(data)] = data
        elif op == "reopen":
            os.close(self.fd)
            self.fd = os.open(self.names[0], os.O_RDWR)
        assert os.stat(self.names[0]).st_size == len(model), op
        assert not self.names[1].exists()
        return op


def test_fsx_random_operations_match_a_model(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    seed = int(os.environ.get("FSX_SEED") or random.randrange(1 << 32))
    print(f"fsx seed: {seed} (rerun with FSX_SEED={seed})")
    mnt = mount(f"s3://{bucket}/fsx")
    run = FsxRun(mnt, seed)
    done = [run.step() for _ in range(150)]
    os.close(run.fd)
    assert run.names[0].read_bytes() == bytes(run.model), done[-5:]
    flush(cli)
    key = f"fsx/{run.names[0].name}"
    assert stored_or_none(s3_client, bucket, key) == bytes(run.model), f"seed {seed}"
    assert stored_or_none(s3_client, bucket, f"fsx/{run.names[1].name}") is None


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd), "GIT_AUTHOR_NAME": "t"}
    env |= {"GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    # The mount reports its own user as the owner; sudo-style environments make git doubt it.
    env |= {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_clone_then_status_and_commit(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    for i in range(20):
        (src / "pkg" / f"m{i}.py").write_text(f"x = {i}\n" * (i + 1))
    (src / "README").write_text("hello\n")
    git("init", "-q", "-b", "main", cwd=src)
    git("add", ".", cwd=src)
    git("commit", "-q", "-m", "one", cwd=src)

    mnt = mount(f"s3://{bucket}/work")
    git("clone", "-q", f"file://{src}", str(mnt / "repo"), cwd=tmp_path)
    repo = mnt / "repo"
    for name in os.listdir(repo / ".git"):  # every name listed can be stat'ed
        os.stat(repo / ".git" / name)
    assert git("status", "--porcelain", cwd=repo) == ""
    (repo / "README").write_text("changed\n")
    git("commit", "-q", "-am", "two", cwd=repo)
    assert git("status", "--porcelain", cwd=repo) == ""
    assert git("log", "--format=%s", cwd=repo).split() == ["two", "one"]
    flush(cli)
    assert stored_or_none(s3_client, bucket, "work/repo/README") == b"changed\n"
