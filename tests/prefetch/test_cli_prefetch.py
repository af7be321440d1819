"""``tiercache prefetch`` on the real S3 server: summary, --json, failures, progress, Ctrl-C."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.proxy import FaultProxy

MiB = 1024 * 1024
CLI = [sys.executable, "-m", "tiercache.cli", "prefetch"]


def _env(s3: Any, tmp_path: Path, endpoint: str | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint or s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.key,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_DEFAULT_REGION": s3.region,
        "TIERCACHE_LOCAL_DIR": str(tmp_path / "tier"),
        "TIERCACHE_RETRIES": "2",
    }


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _put(s3_client: Any, bucket: str, count: int, size: int = MiB) -> list[str]:
    keys = [f"train/shard-{i:02d}.tar" for i in range(count)]
    for key in keys:
        s3_client.put_object(Bucket=bucket, Key=key, Body=os.urandom(size))
    return keys


def test_json_summary_then_everything_is_cached(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    _put(s3_client, bucket, 5)
    env = _env(s3, tmp_path)
    url = f"s3://{bucket}/train/"
    first = _cli(url, "--json", "--jobs", "2", env=env)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert (report["objects"], report["fetched"], report["failed"]) == (5, 5, 0)
    assert report["bytes"] == 5 * MiB and report["errors"] == {}
    assert s3.secret not in first.stdout + first.stderr
    again = _cli(f"s3://{bucket}/train/*.tar", env=env)
    assert again.returncode == 0, again.stderr
    assert "5 object(s): 0 fetched, 5 already cached, 0 failed" in again.stdout


def test_tier_shared_fills_the_shared_tier_only(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    from tiercache import TierCacheFileSystem

    keys = _put(s3_client, bucket, 3)
    env = {**_env(s3, tmp_path), "TIERCACHE_SHARED_DIR": str(tmp_path / "shared")}
    done = _cli(f"s3://{bucket}/train/", "--tier", "shared", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fetched"] == 3
    view = TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=str(tmp_path / "tier"),
        shared_dir=str(tmp_path / "shared"),
        skip_instance_cache=True,
    )
    assert all(view.is_cached(f"{bucket}/{k}", tier="shared") for k in keys)
    assert not any(view.is_cached(f"{bucket}/{k}", tier="local") for k in keys)
    refused = _cli(f"s3://{bucket}/train/", "--tier", "shared", env=_env(s3, tmp_path))
    assert refused.returncode == 1 and "shared tier" in refused.stderr


def test_a_failed_object_fails_the_command(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, proxy: FaultProxy
) -> None:
    keys = _put(s3_client, bucket, 3)
    proxy.fail_next(1, 403, method="GET", path_contains=keys[1])
    env = _env(s3, tmp_path, endpoint=proxy.url)
    url = f"s3://{bucket}/train/"
    done = _cli(url, "--json", env=env)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert (report["fetched"], report["failed"]) == (2, 1)
    assert list(report["errors"]) == [f"{bucket}/{keys[1]}"]
    missing = _cli(f"s3://{bucket}/nothing-here", env=env)
    assert missing.returncode == 1
    assert "tiercache prefetch:" in missing.stderr and "Traceback" not in missing.stderr


def _read_until(fd: int, want: bytes, timeout: float = 60.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while want not in seen:
        assert time.monotonic() < deadline, seen
        waiting = select.poll()  # poll, not select: descriptors may be numbered past 1024
        waiting.register(fd, select.POLLIN)
        if waiting.poll(500):
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_progress_bar_on_a_terminal_and_ctrl_c_cancels(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, proxy: FaultProxy
) -> None:
    _put(s3_client, bucket, 12, 256 * 1024)
    proxy.delay(0.4)  # a slow store: the command is still running when we interrupt it
    env = _env(s3, tmp_path, endpoint=proxy.url)
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [*CLI, f"s3://{bucket}/train/", "--jobs", "1"],
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    try:
        seen = _read_until(leader, b"/12 objects")  # the bar: objects, bytes, rate, ETA
        seen += _read_until(leader, b"B/s")
        assert b"prefetch" in seen and b" of 3.0 MiB" in seen
        child.send_signal(signal.SIGINT)
        code = child.wait(60)
        seen += _read_until(leader, b"interrupted", timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
        os.close(leader)
    assert code == 130
    assert b"interrupted" in seen and b"Traceback" not in seen


def test_bad_tier_and_jobs_are_refused_without_a_traceback(
    s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiercache.cli import main

    for name, value in _env(s3, tmp_path).items():
        monkeypatch.setenv(name, value)
    assert main(["prefetch", "s3://bucket/x", "--tier", "shared"]) == 1
    assert "no shared tier configured" in capsys.readouterr().err
    assert main(["prefetch", "s3://bucket/x", "--jobs", "0"]) == 1
    assert "prefetch_workers must be between 1 and 64" in capsys.readouterr().err
