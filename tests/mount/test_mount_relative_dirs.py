"""``tiercache mount`` given relative paths: the mount process serves from where it was asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, cleanup_mount, mount_counters, mounted, requires_fuse

pytestmark = [pytest.mark.integration, requires_fuse]


def test_a_relative_local_dir_and_mountpoint(
    bucket: str, s3_client: Any, cli: Cli, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="a.txt", Body=b"hello")
    (tmp_path / "mnt").mkdir()
    env = {k: v for k, v in cli.env.items() if k != "TIERCACHE_LOCAL_DIR"}
    command = ["mount", f"s3://{bucket}", "mnt", "--local-dir", "tier", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "tiercache.cli", *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    mnt = tmp_path / "mnt"
    try:
        assert mounted(str(mnt))
        assert (mnt / "a.txt").read_bytes() == b"hello"
        assert os.statvfs(mnt).f_bsize > 0
        for command in (["df", str(mnt)], ["stat", "-f", str(mnt)]):
            probe = subprocess.run(command, capture_output=True, text=True, check=False)
            assert probe.returncode == 0, (command, probe.stderr)
        # The counters file is written in the tier given (once a second), never elsewhere.
        assert report["local_dir"] == cli.local_dir == str(tmp_path / "tier")
        counters = mount_counters(cli, mnt, lambda c: c.get("bytes_read", 0) >= 5)
        assert counters["bytes_read"] >= 5
        time.sleep(1.5)  # a writer failing every second would have logged by now
        log = Path(report["log"]).read_text()
        assert "Traceback" not in log and "writing the mount's counters" not in log, log
    finally:
        cleanup_mount(cli, str(mnt), int(report["pid"]))
