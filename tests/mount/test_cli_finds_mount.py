"""``status``/``flush`` without ``--local-dir`` find a running mount's tier, or refuse to guess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import (
    Cli,
    cleanup_mount,
    make_cli,
    mount_entry,
    requires_fuse,
    server_env,
)

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _default_tier_cli(tmp_path: Path, endpoint: str, s3: Any) -> Cli:
    """A CLI with no TIERCACHE_LOCAL_DIR: its tier is the default under its own HOME.

    Mount records go to a directory of this test's own, so other mounts on the host are not
    among the ones it sees.
    """
    cli = make_cli(tmp_path, server_env(endpoint, s3.key, s3.secret, s3.region))
    env = {k: v for k, v in cli.env.items() if k not in ("TIERCACHE_LOCAL_DIR", "XDG_CACHE_HOME")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return Cli(env, str(tmp_path / "home" / ".cache" / "tiercache"))


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Callable[..., tuple[Path, int]]]:
    """``mount(cli, url, name, *flags)`` → (mountpoint, pid); every one unmounted after."""
    made: list[tuple[Cli, str, int]] = []

    def do_mount(cli: Cli, url: str, name: str, *flags: str) -> tuple[Path, int]:
        mountpoint = tmp_path / name
        mountpoint.mkdir()
        pid = int(cli.json("mount", url, str(mountpoint), *flags)["pid"])
        made.append((cli, str(mountpoint), pid))
        return mountpoint, pid

    yield do_mount
    for cli, mountpoint, pid in made:
        cleanup_mount(cli, mountpoint, pid)


@requires_fuse
def test_status_and_flush_use_the_running_mounts_tier(
    bucket: str, s3: Any, s3_client: Any, proxy: Any, tmp_path: Path, mounts: Any
) -> None:
    cli = _default_tier_cli(tmp_path, proxy.url, s3)
    tier = tmp_path / "mount-tier"
    mnt, pid = mounts(cli, f"s3://{bucket}/job", "mnt", "--local-dir", str(tier))
    proxy.fail_next(1_000_000, status=503, method="PUT")  # uploads wait: the write stays pending
    data = os.urandom(3 * MiB)
    (mnt / "ckpt.bin").write_bytes(data)

    status = cli.json("status")
    assert status["local_dir"] == str(tier)  # not the default tier, which holds nothing
    assert [p["name"] for p in status["pending"]] == [f"{bucket}/job/ckpt.bin"]
    assert status["pending_bytes"] == len(data)
    ours = mount_entry(status, mnt)
    assert ours["pid"] == pid and ours["local_dir"] == str(tier)
    assert status["tier_of_mounts"] == [str(mnt)]
    text = cli("status")
    assert text.returncode == 0 and f"of {mnt}" in text.stdout and "1 upload(s)" in text.stdout
    # A tier named by flag is the one shown, mount or not.
    named = cli.json("status", "--local-dir", cli.local_dir)
    assert named["local_dir"] == cli.local_dir and named["pending_uploads"] == 0
    assert cli.json("status", "--mount", str(mnt))["pending_bytes"] == len(data)

    proxy.clear()
    flushed = cli.json("flush", "--timeout", "60")
    assert flushed["local_dir"] == str(tier)
    stored = s3_client.get_object(Bucket=bucket, Key="job/ckpt.bin")["Body"].read()
    assert stored == data
    assert cli.json("status")["pending_uploads"] == 0


@requires_fuse
def test_mounts_with_different_tiers_need_the_tier_named(
    bucket: str, s3: Any, s3_client: Any, tmp_path: Path, mounts: Any
) -> None:
    s3_client.put_object(Bucket=bucket, Key="d/x.bin", Body=b"x")
    cli = _default_tier_cli(tmp_path, s3.endpoint, s3)
    tiers = [tmp_path / "tier-a", tmp_path / "tier-b"]
    made = [
        mounts(cli, f"s3://{bucket}/d", f"mnt-{i}", "--read-only", "--local-dir", str(tier))
        for i, tier in enumerate(tiers)
    ]

    for command in ("status", "flush"):
        done = cli(command)
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert "--mount PATH" in done.stderr and str(made[1][0]) in done.stderr
        as_json = cli(command, "--json")
        assert as_json.returncode == 1 and as_json.stderr == ""
        report = json.loads(as_json.stdout)
        assert "--local-dir" in report["error"]
        listed = {m["mountpoint"]: (m["pid"], m["local_dir"]) for m in report["mounts"]}
        for (mnt, pid), tier in zip(made, tiers, strict=True):
            assert listed[str(mnt)] == (pid, str(tier))

    assert cli.json("status", "--mount", str(made[1][0]))["local_dir"] == str(tiers[1])
    # The environment naming one of the mounts' tiers is an answer too; a tier of no mount is not.
    chosen = cli.json("status", TIERCACHE_LOCAL_DIR=str(tiers[0]))
    assert chosen["local_dir"] == str(tiers[0])
    other = cli("status", "--json", TIERCACHE_LOCAL_DIR=str(tmp_path / "elsewhere"))
    assert other.returncode == 1 and "no running mount's" in json.loads(other.stdout)["error"]
    conflict = cli("status", "--mount", str(made[0][0]), "--local-dir", str(tiers[1]))
    assert conflict.returncode == 1 and "is not the tier of the mount" in conflict.stderr
    not_mount = cli("status", "--mount", str(tmp_path), "--json")
    assert not_mount.returncode == 1
    assert "not a tiercache mount" in json.loads(not_mount.stdout)["error"]


def test_usage_errors_are_json_with_json(cli: Cli) -> None:
    done = cli("status", "--no-such-flag", "--json")
    assert done.returncode == 2 and "--no-such-flag" in json.loads(done.stdout)["error"]


def test_a_reader_that_goes_away_ends_the_command_quietly(cli: Cli) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read: the first write fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tiercache.cli", "status"],
            env=cli.env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == ""


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_ends_flush_watch_with_one_line(cli: Cli, as_json: bool) -> None:
    args = ["flush", "--watch", *(["--json"] if as_json else [])]
    child = subprocess.Popen(
        [sys.executable, "-m", "tiercache.cli", *args],
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        # The tier exists once the command has built its filesystem: it is past its imports.
        while not os.path.isdir(os.path.join(cli.local_dir, "objects")):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130
    if as_json:
        assert err == "" and "interrupted" in json.loads(out)["error"]
    else:
        assert out == "" and err.count("\n") == 1 and err.startswith("tiercache flush: interrupted")
