"""The operator commands against the real server: stats, ls, evict, doctor, config files."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, mount_entry, requires_fuse

from tiercache import TierCacheFileSystem

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _fill(bucket: str, s3_client: Any) -> dict[str, bytes]:
    objects = {
        "ds/a.bin": os.urandom(MiB),
        "ds/b.bin": os.urandom(2 * MiB),
        "ds/sub/c.bin": os.urandom(1000),
    }
    for key, body in objects.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    return objects


def test_ls_marks_cached_objects_and_evict_removes_them(
    bucket: str, s3_client: Any, cli: Cli, s3: Any
) -> None:
    objects = _fill(bucket, s3_client)
    listed = cli.json("ls", f"s3://{bucket}/ds")
    assert [(e["name"], e["type"], e["cached"]) for e in listed] == [
        (f"s3://{bucket}/ds/a.bin", "file", False),
        (f"s3://{bucket}/ds/b.bin", "file", False),
        (f"s3://{bucket}/ds/sub", "directory", False),
    ]
    # Read one object through the cache (a second process, as a job would).
    done = cli("ls", "-R", f"s3://{bucket}/ds")
    assert done.returncode == 0 and "ds/sub/c.bin" in done.stdout
    fs = TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=cli.local_dir,
        skip_instance_cache=True,
    )
    assert fs.cat_file(f"{bucket}/ds/b.bin") == objects["ds/b.bin"]
    fs.wait_fetches()
    listed = {e["name"]: e for e in cli.json("ls", f"s3://{bucket}/ds")}
    assert listed[f"s3://{bucket}/ds/b.bin"]["cached"] is True
    assert listed[f"s3://{bucket}/ds/a.bin"]["cached"] is False
    text = cli("ls", f"s3://{bucket}/ds").stdout.splitlines()
    assert any(line.startswith("C ") and line.endswith("ds/b.bin") for line in text)
    assert any(line.startswith("  ") and line.endswith("ds/sub/") for line in text)

    dry = cli.json("evict", "--dry-run", "--target", "0")
    assert dry["dry_run"] is True and dry["removed"] == [f"s3://{bucket}/ds/b.bin"]
    assert dry["removed_bytes"] == len(objects["ds/b.bin"])
    assert fs.is_cached(f"{bucket}/ds/b.bin")  # a dry run removes nothing
    real = cli.json("evict", "--target", "0")
    assert real["removed"] == [f"s3://{bucket}/ds/b.bin"] and real["usage_after"] == 0
    assert not fs.is_cached(f"{bucket}/ds/b.bin")
    bad = cli("evict", "--target", "lots")
    assert bad.returncode == 1 and "--target must be a byte count" in bad.stderr


def test_evict_of_the_shared_tier_keeps_pinned_objects(
    bucket: str, s3_client: Any, cli: Cli, s3: Any, tmp_path: Path
) -> None:
    objects = _fill(bucket, s3_client)
    shared = str(tmp_path / "shared")
    fs = TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=cli.local_dir,
        shared_dir=shared,
        skip_instance_cache=True,
    )
    fs.pin(f"{bucket}/ds/a.bin")
    assert fs.cat_file(f"{bucket}/ds/b.bin") == objects["ds/b.bin"]
    fs.wait_fetches()
    dry = cli.json(
        "evict", "--tier", "shared", "--shared-dir", shared, "--dry-run", "--target", "0"
    )
    assert dry["tier"] == "shared" and dry["kept_pinned"] == 1
    assert dry["removed"] == [f"s3://{bucket}/ds/b.bin"]
    real = cli.json("evict", "--tier", "shared", "--target", "0", TIERCACHE_SHARED_DIR=shared)
    assert real["removed"] == [f"s3://{bucket}/ds/b.bin"]
    assert fs.is_cached(f"{bucket}/ds/a.bin", tier="shared")
    assert not fs.is_cached(f"{bucket}/ds/b.bin", tier="shared")
    assert fs.is_cached(f"{bucket}/ds/b.bin", tier="local")  # the local tier is left alone
    status = cli.json("status", "--shared-dir", shared)
    assert status["shared_usage_bytes"] == len(objects["ds/a.bin"])  # the pinned one
    missing = cli("evict", "--tier", "shared")
    assert missing.returncode == 1 and "shared_dir" in missing.stderr


def test_ls_of_a_missing_bucket_fails(cli: Cli) -> None:
    done = cli("ls", "s3://tc-no-such-bucket-here")
    assert done.returncode == 1 and done.stderr.startswith("tiercache ls: ")


@requires_fuse
def test_stats_shows_a_mounts_counters_without_credentials(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path], s3: Any
) -> None:
    objects = _fill(bucket, s3_client)
    mnt = mount(f"s3://{bucket}/ds", "--read-only")
    assert (mnt / "b.bin").read_bytes() == objects["ds/b.bin"]
    deadline = time.monotonic() + 20
    while True:  # a mount publishes its counters about once a second
        stats = cli.json("stats")
        ours = mount_entry(stats, mnt)  # other tiercache mounts on the host are listed too
        counters = ours["stats"] if ours else None
        if counters and counters["bytes_read"] >= len(objects["ds/b.bin"]):
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
    assert counters["misses"] >= 1 and counters["bytes_fetched"] >= len(objects["ds/b.bin"])
    assert stats["local_usage_bytes"] >= len(objects["ds/b.bin"])
    assert stats["local_dir"] == cli.local_dir
    text = cli("stats").stdout
    assert str(mnt) in text and "bytes_read" in text
    raw = json.dumps(stats) + text
    assert s3.secret not in raw and s3.key not in raw


def test_doctor_passes_here_and_says_what_to_fix(
    bucket: str, cli: Cli, tmp_path: Path, s3: Any
) -> None:
    done = cli("doctor", f"s3://{bucket}", "--local-max-bytes", "64MiB")
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert all(line.startswith("OK  ") for line in lines), done.stdout
    report = cli.json("doctor", "--local-max-bytes", "64MiB")
    names = [c["name"] for c in report["checks"]]
    for name in ("config", "store", "fuse library", "fuse binding", "fusermount", "/dev/fuse"):
        assert name in names
    assert report["ok"] is True

    (tmp_path / "open-tier").mkdir(mode=0o777)
    os.chmod(tmp_path / "open-tier", 0o777)
    bad = cli(
        "doctor",
        f"s3://{bucket}",
        "--local-dir",
        str(tmp_path / "open-tier"),
        AWS_SECRET_ACCESS_KEY="wrong-secret",
    )
    assert bad.returncode == 1
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAIL")]
    assert any("tier private" in line and "chmod 700" in line for line in failed), bad.stdout
    assert any(line.startswith("FAIL  store:") and "fix:" in line for line in failed), bad.stdout
    assert "wrong-secret" not in bad.stdout + bad.stderr and s3.secret not in bad.stdout


def test_config_file_sits_below_environment_and_flags(cli: Cli, tmp_path: Path) -> None:
    config = tmp_path / "tiercache.toml"
    config.write_text(
        f'[tiercache]\nlocal_dir = "{tmp_path / "from-file"}"\nlocal_max_bytes = "3GiB"\n'
        '[s3]\nregion = "us-east-1"\n'
    )
    env_without_dir = {k: v for k, v in cli.env.items() if k != "TIERCACHE_LOCAL_DIR"}
    from_file = Cli(env_without_dir, "")("status", "--config", str(config), "--json")
    assert from_file.returncode == 0, from_file.stderr
    report = json.loads(from_file.stdout)
    assert report["local_dir"] == str(tmp_path / "from-file")
    assert report["local_max_bytes"] == 3 * 1024**3
    # The environment beats the file; a flag beats both. TIERCACHE_CONFIG names the file too.
    assert cli.json("status", "--config", str(config))["local_dir"] == cli.local_dir
    flagged = cli.json("status", "--local-max-bytes", "1GiB", TIERCACHE_CONFIG=str(config))
    assert flagged["local_max_bytes"] == 1024**3 and flagged["local_dir"] == cli.local_dir

    config.write_text('[tiercache]\nlocal_dri = "/tmp/x"\n')
    bad = cli("status", "--config", str(config))
    assert bad.returncode == 1
    assert "local_dri" in bad.stderr and str(config) in bad.stderr
    missing = cli("status", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_config_file_s3_table_names_the_store(
    bucket: str, s3_client: Any, cli: Cli, tmp_path: Path, s3: Any
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k.txt", Body=b"k")
    config = tmp_path / "store.toml"
    config.write_text(f'[s3]\nendpoint_url = "{s3.endpoint}"\nregion = "{s3.region}"\n')
    env = {k: v for k, v in cli.env.items() if k != "AWS_ENDPOINT_URL"}
    without = Cli(env, cli.local_dir)
    # Without the file nothing names the server: boto3 would go to AWS itself.
    listed = without("ls", f"s3://{bucket}", "--json", TIERCACHE_CONFIG=str(config))
    assert listed.returncode == 0, listed.stderr
    assert [e["name"] for e in json.loads(listed.stdout)] == [f"s3://{bucket}/k.txt"]
    config.write_text('[s3]\nendpoint = "http://x"\n')
    bad = without("ls", f"s3://{bucket}", TIERCACHE_CONFIG=str(config))
    assert bad.returncode == 1 and "'endpoint'" in bad.stderr and str(config) in bad.stderr
