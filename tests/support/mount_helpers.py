"""Helpers of the mount tests: the CLI run as a user runs it, and unmounting however it takes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tiercache.mount import active_mounts, fuse_support

_support = fuse_support()
# Stated once for every mount test: without FUSE there is nothing to mount with.
requires_fuse = pytest.mark.skipif(
    not _support.usable,
    reason="FUSE is not usable here: " + "; ".join(_support.problems),
)


def server_env(endpoint: str, key: str, secret: str, region: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": region,
    }


@dataclass
class Cli:
    """Runs ``python -m tiercache.cli`` with the test server's environment and a private tier."""

    env: dict[str, str]
    local_dir: str

    def __call__(
        self, *args: str, timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tiercache.cli", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def json(self, *args: str, **env: str) -> Any:
        done = self(*args, "--json", **env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


def make_cli(tmp_path: Path, endpoint_env: dict[str, str]) -> Cli:
    local_dir = str(tmp_path / "tier")
    env = {
        **os.environ,
        **endpoint_env,
        "TIERCACHE_LOCAL_DIR": local_dir,
        "TIERCACHE_RETRIES": "2",
        "TIERCACHE_CONNECT_TIMEOUT": "2",
        "TIERCACHE_READ_TIMEOUT": "3",
        "HOME": str(tmp_path / "home"),  # no ~/.aws or ~/.config of the machine's user
    }
    env.pop("TIERCACHE_CONFIG", None)
    return Cli(env, local_dir)


def mount_entry(report: Any, mountpoint: Path | str) -> Any:
    """The entry of ``mountpoint`` in a ``status``/``stats`` report, or None.

    Those reports list every tiercache mount on the host, so a test picks its own by mountpoint.
    """
    entries = [m for m in report["mounts"] if m["mountpoint"] == str(mountpoint)]
    assert len(entries) <= 1, report["mounts"]
    return entries[0] if entries else None


def mount_counters(
    cli: Cli, mountpoint: Path, ready: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The mount's counters (``tiercache stats``) once ``ready`` holds for them; they are
    published about once a second."""
    deadline = time.monotonic() + 20
    while True:
        entry = mount_entry(cli.json("stats"), mountpoint)
        counters = entry["stats"] if entry else None
        if counters and ready(counters):
            return dict(counters)
        assert time.monotonic() < deadline, counters
        time.sleep(0.2)


def mounted(mountpoint: str) -> bool:
    return any(m.mountpoint == os.path.realpath(mountpoint) for m in active_mounts())


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie of ours still answers kill(0); reap it if it is our child.
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                return f.read().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True


def cleanup_mount(cli: Cli, mountpoint: str, pid: int | None) -> None:
    """Unmount however it takes, then make sure the mount process is gone."""
    if mounted(mountpoint):
        done = cli("unmount", mountpoint)
        if done.returncode != 0 and mounted(mountpoint):
            subprocess.run(["fusermount3", "-uz", mountpoint], check=False)
    if pid is not None:
        deadline = time.monotonic() + 15
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def stored_or_none(s3_client: Any, bucket: str, key: str) -> bytes | None:
    """The object's bytes read straight from the store, or None when there is no such object."""
    try:
        return bytes(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3_client.exceptions.NoSuchKey:
        return None
