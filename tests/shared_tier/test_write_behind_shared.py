"""Writes behind staged on the shared tier (``write_tier="shared"``): any host finishes them.

Hosts are processes with host identities of their own and local tiers of their own, sharing
one shared tier directory; the store is the session's real S3 server behind a proxy that can
refuse every upload, so that writes are still pending when their host goes.
"""

from __future__ import annotations

import glob
import hashlib
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import make_cli, server_env
from support.proxy import FaultProxy

from tiercache import ConfigError, TierCacheFileSystem
from tiercache.config import TierCacheConfig

pytestmark = [pytest.mark.integration, pytest.mark.multinode]

MiB = 1024 * 1024


def _host_fs(options: dict[str, Any], root: str, host: str, **extra: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=options,
        local_dir=os.path.join(root, f"{host}-local"),
        shared_dir=os.path.join(root, "shared"),
        host_id=host,
        write_tier="shared",
        skip_instance_cache=True,
        **extra,
    )


def _refuse_uploads(proxy: FaultProxy) -> None:
    for method in ("PUT", "POST"):
        proxy.fail_next(10**6, status=503, method=method)


def _writer(
    options: dict[str, Any], root: str, files: dict[str, int], done: Any, extra: dict[str, Any]
) -> None:
    """Host A: write every file behind, report their digests, then wait to be killed."""
    fs = _host_fs(options, root, "hostA", lease_stale_after=2.0, retries=1, **extra)
    digests = {}
    for path, size in files.items():
        data = os.urandom(size)
        with fs.open(path, "wb") as f:
            f.write(data)
        digests[path] = hashlib.sha256(data).hexdigest()
    done.put(digests)
    time.sleep(600)


def _write_then_die(
    options: dict[str, Any],
    root: str,
    files: dict[str, int],
    before_death: Callable[[], None] = lambda: None,
    **extra: Any,
) -> dict[str, str]:
    """Host A writes ``files`` behind; once its close() calls returned (and ``before_death``
    returned), it is killed with SIGKILL."""
    ctx = multiprocessing.get_context("spawn")
    done = ctx.Queue()
    writer = ctx.Process(target=_writer, args=(options, root, files, done, extra))
    writer.start()
    try:
        digests: dict[str, str] = done.get(timeout=120)
        before_death()
    finally:
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGKILL)  # the host is lost with its writes pending
        writer.join(30)
    return digests


def _store_digest(s3_client: Any, path: str) -> str:
    bucket, key = path.split("/", 1)
    body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return hashlib.sha256(body).hexdigest()


@pytest.fixture
def options(s3: Any, proxy: FaultProxy) -> dict[str, Any]:
    return {**s3.target_options(), "endpoint_url": proxy.url}


def test_another_host_uploads_what_a_lost_host_wrote_behind(
    options: dict[str, Any], tmp_path: Path, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    files = {f"{bucket}/ckpt/part-{i}.bin": (3 * MiB if i % 2 else 200_000) for i in range(4)}
    _refuse_uploads(proxy)
    expected = _write_then_die(options, str(tmp_path), files)
    proxy.clear()
    journal = tmp_path / "shared" / "journal"
    assert len(glob.glob(str(journal / "*.json"))) == len(files)  # pending on the shared tier
    assert glob.glob(str(tmp_path / "hostA-local" / "journal" / "*")) == []  # none on its disk
    survivor = _host_fs(options, str(tmp_path), "hostB", lease_stale_after=2.0)
    rows = survivor.pending()
    assert sorted(r["name"] for r in rows) == sorted(files)
    assert {(r["durability"], r["host"]) for r in rows} == {("shared", "hostA")}
    # Readers on the other host are served the pending bytes before they reach the store.
    for path in files:
        assert hashlib.sha256(survivor.cat_file(path)).hexdigest() == expected[path]
    survivor.flush(timeout=120)
    for path in files:
        assert _store_digest(s3_client, path) == expected[path], path
    assert survivor.pending() == []
    assert glob.glob(str(journal / "*")) == []  # no record, bytes, claim or multipart left


def test_a_claim_of_a_lost_host_is_taken_over_after_lease_stale_after(
    options: dict[str, Any], tmp_path: Path, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    """Host A dies in the middle of a multipart upload it holds the claim of."""
    path = f"{bucket}/ckpt/big.bin"
    # The second part's answer never comes: host A holds the claim with a multipart open.
    proxy.truncate_next(1, after_bytes=0, hold=120.0, method="PUT", path_contains="partNumber=2")
    journal = tmp_path / "shared" / "journal"

    def upload_under_way() -> None:
        deadline = time.monotonic() + 60
        while not glob.glob(str(journal / "*.mpu")):
            assert time.monotonic() < deadline, "host A never began its multipart upload"
            time.sleep(0.05)
        while proxy.count("PUT", "partNumber=2") == 0:
            assert time.monotonic() < deadline, "host A never sent its second part"
            time.sleep(0.05)

    expected = _write_then_die(
        options,
        str(tmp_path),
        {path: 20 * MiB},
        upload_under_way,
        upload_while_writing="off",
        part_size=8 * MiB,
    )
    assert glob.glob(str(journal / "*.upload"))  # the dead host's claim is still there
    proxy.clear()
    survivor = _host_fs(options, str(tmp_path), "hostB", lease_stale_after=2.0)
    started = time.monotonic()
    survivor.flush(timeout=120)
    assert time.monotonic() - started >= 1.0  # the claim was not taken before it went stale
    assert _store_digest(s3_client, path) == expected[path]
    assert survivor.stats()["multipart_aborted"] >= 1
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert glob.glob(str(journal / "*")) == []


def test_close_returns_once_the_write_is_durable_on_the_shared_tier(
    options: dict[str, Any], tmp_path: Path, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    fs = _host_fs(options, str(tmp_path), "hostA")
    path = f"{bucket}/a.bin"
    fs.pipe_file(path, b"old")  # write-behind: a version in the store first
    fs.flush(path)
    assert fs.cat_file(path) == b"old"  # cached on this host
    _refuse_uploads(proxy)
    with fs.open(path, "wb") as f:
        f.write(b"new bytes")
    assert fs.cat_file(path) == b"new bytes"  # this host's old copy is not served
    assert fs.info(path)["size"] == len(b"new bytes")
    (row,) = fs.pending()
    assert (row["durability"], row["host"]) == ("shared", "hostA")
    other = _host_fs(options, str(tmp_path), "hostB")
    assert other.cat_file(path) == b"new bytes"
    proxy.clear()
    other.flush(timeout=60)
    assert s3_client.get_object(Bucket=bucket, Key="a.bin")["Body"].read() == b"new bytes"


def test_write_tier_shared_needs_a_shared_tier(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="shared_dir"):
        TierCacheConfig(local_dir=str(tmp_path), write_tier="shared")
    with pytest.raises(ConfigError, match="local or shared"):
        TierCacheConfig(local_dir=str(tmp_path), shared_dir=str(tmp_path), write_tier="nvme")


def test_tiercache_flush_on_another_host_finishes_the_shared_tier_s_writes(
    s3: Any, options: dict[str, Any], tmp_path: Path, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    """The operator's `tiercache flush --shared-dir` on a host whose own configuration keeps
    its writes local (the default write_tier) still finishes what the lost host staged."""
    files = {f"{bucket}/ckpt/cli-{i}.bin": 100_000 * (i + 1) for i in range(3)}
    _refuse_uploads(proxy)
    expected = _write_then_die(options, str(tmp_path), files)
    proxy.clear()
    cli = make_cli(tmp_path, server_env(proxy.url, s3.key, s3.secret, s3.region))
    done = cli(
        "flush",
        "--json",
        "--timeout",
        "120",
        "--local-dir",
        str(tmp_path / "hostB-local"),
        "--shared-dir",
        str(tmp_path / "shared"),
        timeout=180,
        TIERCACHE_HOST_ID="hostB",
        TIERCACHE_LEASE_STALE_AFTER="2",
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert json.loads(done.stdout)["uploaded"] == len(files)
    for path in files:
        assert _store_digest(s3_client, path) == expected[path], path


def test_eviction_of_the_shared_tier_keeps_pending_writes_and_counts_them(
    options: dict[str, Any], tmp_path: Path, proxy: FaultProxy, bucket: str
) -> None:
    fs = _host_fs(options, str(tmp_path), "hostA")
    _refuse_uploads(proxy)
    data = os.urandom(2 * MiB)
    with fs.open(f"{bucket}/pending.bin", "wb") as f:
        f.write(data)
    report = fs.evict(0, tier="shared")  # everything evictable goes
    assert report.removed == []
    assert fs.stats()["shared_usage_bytes"] >= len(data)  # the budget counts it
    other = _host_fs(options, str(tmp_path), "hostB")
    assert other.cat_file(f"{bucket}/pending.bin") == data
    proxy.clear()
    other.flush(timeout=60)
