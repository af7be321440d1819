"""A flush that cannot finish says why, and ``tiercache flush`` does not wait for ever.

Against a store that is gone (a port that refuses connections) ``tiercache flush`` without
``--timeout`` reports what it waits for and gives up with exit 1 after ``--give-up-after``;
a flush that times out while the store is frozen names what happened to the upload. The
frozen store is a SeaweedFS of this module's own (``own_server``), which it may pause.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tiercache import TierCacheFileSystem
from tiercache.errors import CacheTimeoutError

if TYPE_CHECKING:  # the fixture's class; imported for annotations only
    from support.servers_under_test import OwnServer

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _refusing_endpoint() -> str:
    """An address nothing listens on: connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _flush_cli(local_dir: str, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "nobody",
        "AWS_SECRET_ACCESS_KEY": "nothing-to-see",
        "AWS_DEFAULT_REGION": "us-east-1",
        "HOME": str(Path(local_dir).parent / "home"),
        "TIERCACHE_RETRIES": "2",
    }
    env.pop("TIERCACHE_CONFIG", None)
    argv = [sys.executable, "-m", "tiercache.cli", "flush", "--local-dir", local_dir]
    return subprocess.run(
        [*argv, "--endpoint-url", endpoint, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_flush_gives_up_on_a_store_that_is_gone_and_says_why(tmp_path: Path) -> None:
    endpoint = _refusing_endpoint()
    local_dir = str(tmp_path / "tier")
    fs = TierCacheFileSystem(
        target_options={"endpoint_url": endpoint, "key": "nobody", "secret": "nothing-to-see"},
        local_dir=local_dir,
        skip_instance_cache=True,
        retries=2,
        exit_flush_timeout=0,
        upload_deadline=0,  # this process never tries: the flush below is the only uploader
    )
    with fs.open("bucket/job/out.bin", "wb") as f:  # write-behind: the store is not needed
        f.write(os.urandom(MiB))
    started = time.monotonic()
    done = _flush_cli(local_dir, endpoint, "--give-up-after", "4")
    took = time.monotonic() - started
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert took < 60
    assert "waiting for 1 object(s)" in done.stderr  # said what it waited for, and why
    assert "gave up" in done.stderr and "connection refused" in done.stderr, done.stderr
    assert "bucket/job/out.bin" in done.stderr
    assert "nothing-to-see" not in done.stdout + done.stderr
    assert [p["name"] for p in fs.pending()] == ["bucket/job/out.bin"]  # kept for later


def test_flush_gives_up_by_default_and_says_when() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "tiercache.cli", "flush", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "--give-up-after" in shown.stdout and "default 300" in shown.stdout


@pytest.fixture
def frozen_fs(own_server: OwnServer, tmp_path: Path) -> Any:
    bucket = "tc-frozen"
    own_server.client().create_bucket(Bucket=bucket)
    fs = TierCacheFileSystem(
        target_options=own_server.endpoint.target_options(),
        local_dir=str(tmp_path / "tier"),
        skip_instance_cache=True,
        retries=2,
        connect_timeout=1,
        read_timeout=2,
    )
    return fs, bucket


def test_a_flush_timing_out_on_a_frozen_store_names_the_cause(
    own_server: OwnServer, frozen_fs: Any
) -> None:
    fs, bucket = frozen_fs
    own_server.pause()
    try:
        with fs.open(f"{bucket}/f05", "wb") as f:
            f.write(os.urandom(MiB))
        with pytest.raises(CacheTimeoutError) as early:
            fs.flush(timeout=1)  # the first attempt is still waiting for an answer
        assert "no answer from the store for" in str(early.value), str(early.value)
        with pytest.raises(CacheTimeoutError) as later:
            fs.flush(timeout=8)  # two attempts of 2 s each have timed out by now
        assert "read timeout after 2" in str(later.value), str(later.value)
        for message in (str(early.value), str(later.value)):
            assert not message.rstrip().endswith(":"), message
    finally:
        own_server.resume()
    fs.flush(timeout=60)
