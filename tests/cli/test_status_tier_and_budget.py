"""``status``/``flush`` look at this user's tier, and show the budget the running cache uses.

Another user's mount (its process runs as another user) never chooses, nor refuses, the tier:
it is the one the flags, environment or config file resolve to, the one ``prefetch`` fills.
The running mounts are stood in for here (``running_mounts``), with real processes of this
user and of another; the budget a real mount publishes is checked with a real mount.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, requires_fuse, server_env

from tiercache.cli import main, which_tier
from tiercache.mount.control import RunningMount, state_path

pytestmark = pytest.mark.integration

GiB = 1024**3


@pytest.fixture
def another_users_pid() -> Iterator[int]:
    """A process that runs as another user than this one."""
    if os.geteuid() == 0:
        child = subprocess.Popen(["sleep", "300"], user=65534)  # nobody
        try:
            yield child.pid
        finally:
            child.kill()
            child.wait()
        return
    if os.stat("/proc/1").st_uid == os.geteuid():
        pytest.skip("no process of another user to stand for another user's mount")
    yield 1


@pytest.fixture
def user(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """A user with nothing set: the default tier under their own HOME, the test server as the
    store. The environment is this process's too, for the commands run in it."""
    for name in list(os.environ):
        if name.startswith(("TIERCACHE_", "AWS_", "XDG_")):
            monkeypatch.delenv(name)
    env = {
        **server_env(s3.endpoint, s3.key, s3.secret, s3.region),
        "HOME": str(tmp_path / "home"),
        "TIERCACHE_RETRIES": "2",
        "TIERCACHE_CONNECT_TIMEOUT": "2",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Cli(dict(os.environ), str(tmp_path / "home" / ".cache" / "tiercache"))


def _mounts(monkeypatch: pytest.MonkeyPatch, *mounts: RunningMount) -> None:
    monkeypatch.setattr(which_tier, "running_mounts", lambda: list(mounts))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _mount(tmp_path: Path, name: str, pid: int, tier: Path) -> RunningMount:
    tier.mkdir(parents=True, exist_ok=True)
    return RunningMount(
        mountpoint=str(tmp_path / name),
        url="s3://their-bucket",
        read_only=False,
        pid=pid,
        local_dir=os.path.realpath(tier),
    )


def test_status_shows_the_tier_prefetch_filled_not_another_users_mounts(
    bucket: str,
    s3_client: Any,
    user: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    another_users_pid: int,
) -> None:
    data = os.urandom(300_000)
    s3_client.put_object(Bucket=bucket, Key="ds/a.bin", Body=data)
    fetched = user("prefetch", f"s3://{bucket}/ds/a.bin", "--json")
    assert fetched.returncode == 0, fetched.stderr
    theirs = _mount(tmp_path, "their-mnt", another_users_pid, tmp_path / "their-tier")
    _mounts(monkeypatch, theirs)

    code, out, err = _run(capsys, "status", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["local_dir"] == os.path.realpath(user.local_dir)  # the tier prefetch filled
    assert report["local_usage_bytes"] == len(data)
    (listed,) = report["mounts"]
    assert listed["mountpoint"] == theirs.mountpoint and listed["this_user"] is False
    code, out, _ = _run(capsys, "status")
    assert code == 0 and f"{theirs.local_dir}, another user's)" in out

    # A tier this user names is the one shown and flushed, whatever other users' mounts use.
    mine = tmp_path / "my-tier"
    monkeypatch.setenv("TIERCACHE_LOCAL_DIR", str(mine))
    code, out, err = _run(capsys, "status", "--json")
    assert code == 0, err
    assert json.loads(out)["local_dir"] == os.path.realpath(mine)
    code, out, err = _run(capsys, "flush", "--timeout", "30", "--json")
    assert code == 0, err
    assert json.loads(out)["local_dir"] == str(mine) and json.loads(out)["uploaded"] == 0


def test_this_users_own_mount_still_chooses_the_tier(
    user: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    another_users_pid: int,
) -> None:
    ours = _mount(tmp_path, "our-mnt", os.getpid(), tmp_path / "our-tier")
    theirs = _mount(tmp_path, "their-mnt", another_users_pid, tmp_path / "their-tier")
    _mounts(monkeypatch, ours, theirs)
    code, out, err = _run(capsys, "status", "--json")
    assert code == 0, err
    assert json.loads(out)["local_dir"] == ours.local_dir
    # Naming a tier none of this user's mounts uses is still refused while they run (only
    # this user's mounts are named).
    monkeypatch.setenv("TIERCACHE_LOCAL_DIR", str(tmp_path / "elsewhere"))
    code, _, err = _run(capsys, "status")
    assert code == 1 and "no running mount's" in err
    assert ours.mountpoint in err and theirs.mountpoint not in err


def test_status_shows_the_budget_the_running_mount_published(
    user: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ours = _mount(tmp_path, "mnt", os.getpid(), Path(user.local_dir))
    _mounts(monkeypatch, ours)
    code, out, err = _run(capsys, "status", "--json")
    assert code == 0, err
    assert json.loads(out)["local_max_bytes"] == 10 * GiB  # no counters yet: the options'
    # What a mount started with --local-max-bytes 500GiB publishes with its counters.
    counters = state_path(user.local_dir, ours.mountpoint, "json")
    payload = {"pid": os.getpid(), "stats": {"local_max_bytes": 500 * GiB}}
    Path(counters).write_text(json.dumps(payload))
    code, out, err = _run(capsys, "status", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["local_max_bytes"] == 500 * GiB
    assert report["local_max_bytes_of"] == ours.mountpoint
    code, out, _ = _run(capsys, "status")
    assert code == 0 and "of 500.0 GiB (the budget of the mount on " in out
    # Counters left by an earlier process on that mountpoint say nothing of this one's.
    Path(counters).write_text(json.dumps({**payload, "pid": os.getpid() + 1}))
    code, out, _ = _run(capsys, "status", "--json")
    assert json.loads(out)["local_max_bytes"] == 10 * GiB


@requires_fuse
def test_status_and_stats_show_a_real_mounts_budget(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="ds/a.bin", Body=b"a")
    mnt = mount(f"s3://{bucket}/ds", "--read-only", "--local-max-bytes", "500GiB")
    deadline = time.monotonic() + 20
    while (status := cli.json("status"))["local_max_bytes"] != 500 * GiB:
        assert time.monotonic() < deadline, status  # a mount publishes about once a second
        time.sleep(0.2)
    assert status["local_max_bytes_of"] == str(mnt)
    assert "of 500.0 GiB" in cli("status").stdout
    assert cli.json("stats")["local_max_bytes"] == 500 * GiB
