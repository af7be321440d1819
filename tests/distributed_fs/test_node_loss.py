"""A host is lost with writes behind still pending on the shared tier (``write_tier="shared"``).

"Lost" means what happens when a node dies: its processes are killed with SIGKILL, its
ceph-fuse is killed and its MDS session evicted. The store refuses uploads (or stalls one)
until then, through the counting proxy, so that every write is still pending when the host
goes. The other host must then put every acknowledged byte in the store.
"""

from __future__ import annotations

import glob
import hashlib
import time
from typing import Any

import pytest
from cephfs_hosts import CephFS, Hosts, fill_quota
from support.proxy import FaultProxy

pytestmark = [
    pytest.mark.distributed_fs,
    pytest.mark.multinode,
    pytest.mark.integration,
    pytest.mark.node_loss,
]

MiB = 1024 * 1024
STALE = 3.0  # lease_stale_after of every process


def _store_sha256(s3_client: Any, path: str) -> str:
    bucket, key = path.split("/", 1)
    sha = hashlib.sha256()
    for chunk in s3_client.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(8 << 20):
        sha.update(chunk)
    return sha.hexdigest()


def _journal(hosts: Hosts, host: str) -> list[str]:
    return sorted(glob.glob(str(hosts.shared(host) / "journal" / "*")))


def _lose(hosts: Hosts, cephfs: CephFS, host: str) -> None:
    for proc in hosts.procs:
        if proc.host == host:
            proc.kill()
    cephfs.crash(host)
    assert host not in cephfs.client_hostnames()


def test_a_lost_host_s_acknowledged_writes_reach_the_store_from_the_other_host(
    hosts: Hosts, cephfs: CephFS, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    files = {f"{bucket}/ckpt/step-1/rank-{i}.pt": 64 * MiB for i in range(4)}
    for method in ("PUT", "POST"):  # the store takes nothing from host A
        proxy.fail_next(10**6, status=503, method=method)
    writer = hosts.start("hostA", write_tier="shared", lease_stale_after=STALE, retries=1)
    expected = writer.call("write_behind", sizes=files, timeout=600)["sha256"]
    try:
        _lose(hosts, cephfs, "hostA")
        proxy.clear()
        survivor = hosts.start("hostB", write_tier="shared", lease_stale_after=STALE)
        rows = survivor.call("pending")["rows"]
        assert sorted(r["name"] for r in rows) == sorted(files)
        assert {(r["durability"], r["host"], r["state"]) for r in rows} == {
            ("shared", "hostA", "dirty")
        }
        assert survivor.call("flush", seconds=540, timeout=600) == {}
        for path in files:
            assert _store_sha256(s3_client, path) == expected[path], path
        assert survivor.call("pending")["rows"] == []
        assert _journal(hosts, "hostB") == []
    finally:
        cephfs.remount("hostA")


def test_a_lost_host_s_multipart_upload_is_taken_over_and_leaves_nothing_behind(
    hosts: Hosts, cephfs: CephFS, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    path = f"{bucket}/ckpt/step-2/model.pt"
    # Host A's second part is never answered: it dies holding the claim, its upload half sent.
    proxy.truncate_next(1, after_bytes=0, hold=600.0, method="PUT", path_contains="partNumber=2")
    writer = hosts.start(
        "hostA",
        write_tier="shared",
        lease_stale_after=STALE,
        upload_while_writing="off",
        part_size=8 * MiB,
    )
    expected = writer.call("write_behind", sizes={path: 64 * MiB}, timeout=600)["sha256"]
    journal_b = hosts.shared("hostB") / "journal"
    deadline = time.monotonic() + 120
    while proxy.count("PUT", "partNumber=2") == 0 or not glob.glob(str(journal_b / "*.mpu")):
        assert time.monotonic() < deadline, "host A never got to its second part"
        time.sleep(0.1)
    try:
        _lose(hosts, cephfs, "hostA")
        assert glob.glob(str(journal_b / "*.upload"))  # its claim outlives it
        proxy.clear()
        survivor = hosts.start("hostB", write_tier="shared", lease_stale_after=STALE)
        assert survivor.call("flush", seconds=540, timeout=600) == {}
        assert _store_sha256(s3_client, path) == expected[path]
        stats = survivor.call("stats")
        assert stats["leases_broken"] >= 1
        assert stats["multipart_aborted"] >= 1
        assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        assert _journal(hosts, "hostB") == []  # no record, bytes, claim, link or .mpu
        assert glob.glob(str(hosts.shared("hostB") / "objects" / "*" / "*.lock")) == []
    finally:
        cephfs.remount("hostA")


def test_a_shared_tier_out_of_quota_refuses_the_write_and_keeps_the_previous_version(
    hosts: Hosts, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    path = f"{bucket}/ckpt/latest.pt"
    s3_client.put_object(Bucket=bucket, Key="ckpt/latest.pt", Body=b"previous")
    shared = hosts.shared("hostA")
    writer = hosts.start("hostA", write_tier="shared")
    assert (
        writer.call("cat", paths=[path])["sha256"][path] == hashlib.sha256(b"previous").hexdigest()
    )
    fill_quota(shared, [shared])  # 4 MiB of other data, and a quota of 4 MiB
    refused = writer.call("write_behind", sizes={path: 64 * MiB}, timeout=600)
    assert "TierFullError" in refused.get("mro", []), refused
    assert writer.call("pending")["rows"] == []
    assert (
        writer.call("cat", paths=[path])["sha256"][path] == hashlib.sha256(b"previous").hexdigest()
    )
    assert _store_sha256(s3_client, path) == hashlib.sha256(b"previous").hexdigest()
