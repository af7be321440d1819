"""Messages name the store as the user does (its endpoint URL), and say what fits the failure:
``doctor`` with a tier it cannot use, ``discard`` of writes pending for another endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, requires_fuse

pytestmark = pytest.mark.integration

# No server listens there: a write recorded for it is one for "another endpoint".
OTHER_ENDPOINT = "http://127.0.0.1:9"


def _store_line(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if " store: " in line]
    return line


def test_doctor_names_the_store_by_its_endpoint(bucket: str, cli: Cli, s3: Any) -> None:
    done = cli("doctor", f"s3://{bucket}")
    line = _store_line(done.stdout)
    assert line == f"OK    store: bucket {bucket} reachable at {s3.endpoint}", done.stdout
    listed = _store_line(cli("doctor").stdout)
    assert listed.startswith("OK    store: ") and listed.endswith(f"listed at {s3.endpoint}")
    assert "S3Store(" not in done.stdout + done.stderr


@requires_fuse
def test_mount_of_a_missing_bucket_names_the_endpoint(cli: Cli, s3: Any, tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    done = cli("mount", "s3://tc-no-such-bucket-here", str(tmp_path / "mnt"))
    assert done.returncode == 1
    assert f"'tc-no-such-bucket-here' does not exist at {s3.endpoint}:" in done.stderr
    assert "S3Store(" not in done.stderr


def test_doctor_on_a_tier_it_cannot_use_checks_the_store_all_the_same(
    bucket: str, cli: Cli, s3: Any, tmp_path: Path
) -> None:
    tier = tmp_path / "odd-tier"
    tier.mkdir(mode=0o700)
    (tier / "objects").write_text("not the tier's directory")
    done = cli("doctor", f"s3://{bucket}", "--local-dir", str(tier))
    assert done.returncode == 1
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert failed == [
        f"FAIL  tier usable: {tier / 'objects'} is a file, not a directory; "
        f"fix: remove {tier / 'objects'}, or choose another --local-dir"
    ], done.stdout
    # The store is fine: no endpoint or credential advice under it.
    assert _store_line(done.stdout) == f"OK    store: bucket {bucket} reachable at {s3.endpoint}"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory")
def test_doctor_on_a_read_only_tier_gives_no_endpoint_advice(
    bucket: str, cli: Cli, tmp_path: Path
) -> None:
    tier = tmp_path / "ro-tier"
    tier.mkdir(mode=0o700)
    tier.chmod(0o500)
    try:
        done = cli("doctor", f"s3://{bucket}", "--local-dir", str(tier))
    finally:
        tier.chmod(0o700)
    assert done.returncode == 1
    assert any(line.startswith("FAIL  tier writable") for line in done.stdout.splitlines())
    assert _store_line(done.stdout).startswith("OK    store: ")
    assert "AWS_ENDPOINT_URL" not in done.stdout


def _write_for_another_endpoint(local_dir: str, path: str) -> None:
    """A process writes ``path`` behind for ``OTHER_ENDPOINT`` and dies before its upload."""
    script = f"""
import os, signal
from tiercache import TierCacheFileSystem
fs = TierCacheFileSystem(target_options={{"endpoint_url": {OTHER_ENDPOINT!r}}},
    local_dir={local_dir!r}, skip_instance_cache=True)
with fs.open({path!r}, "wb") as f:
    f.write(b"pending bytes")
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=60, check=False)
    assert done.returncode == -9


def test_discard_of_a_write_for_another_endpoint_says_why_and_how(
    bucket: str, cli: Cli, s3: Any
) -> None:
    path = f"{bucket}/ckpt/b.bin"
    _write_for_another_endpoint(cli.local_dir, path)

    done = cli("discard", path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"1 write(s) under {path} are pending for another endpoint ({OTHER_ENDPOINT})" in (
        done.stderr
    )
    assert f"than {s3.endpoint}" in done.stderr
    assert f"tiercache discard {path} --endpoint-url {OTHER_ENDPOINT}" in done.stderr
    as_json = cli("discard", f"s3://{bucket}/ckpt/", "--json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["discarded"] == [] and [r["name"] for r in report["elsewhere"]] == [path]
    assert report["elsewhere"][0]["endpoint"] == OTHER_ENDPOINT
    # flush names that endpoint as a URL too.
    flushed = cli("flush", "--timeout", "30")
    assert flushed.returncode == 1 and f"({OTHER_ENDPOINT}) than {s3.endpoint}" in flushed.stderr
    assert "s3:http" not in flushed.stderr

    dropped = cli("discard", path, "--endpoint-url", OTHER_ENDPOINT)
    assert dropped.returncode == 0 and dropped.stdout.splitlines() == [
        "discarded 1 write(s)",
        f"  {path}",
    ]
    again = cli("discard", path)
    assert again.returncode == 1 and f"nothing pending under {path} for {s3.endpoint}" in (
        again.stderr
    )
