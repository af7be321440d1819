"""A host is lost with writes behind still pending on the shared tier (``write_tier="shared"``).

"Lost" means what happens when a node dies: its processes are killed with SIGKILL, its
ceph-fuse is killed and its MDS session evicted. The store refuses uploads (or stalls one)
until then, through the counting proxy, so that every write is still pending when the host
goes. The other host must then put every acknowledged byte in the store.
"""

from __future__ import annotations

import glob
import hashlib
import json
import select
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from support.cephfs_hosts import CephFS, Hosts, on_host
from support.proxy import FaultProxy

pytestmark = [
    pytest.mark.distributed_fs,
    pytest.mark.multinode,
    pytest.mark.integration,
    pytest.mark.node_loss,
]

MiB = 1024 * 1024
STALE = 3.0  # lease_stale_after of every process
RANK_SCRIPT = Path(__file__).resolve().parent / "dcp_host_rank.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class _Rank:
    """A DCP rank on one host (``dcp_host_rank.py``), its job sent on stdin."""

    def __init__(self, host: str, job: dict[str, Any]) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            on_host(host, [sys.executable, str(RANK_SCRIPT)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def outcome(self, timeout: float = 300) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            waiting = select.poll()  # poll, not select: descriptors may be numbered past 1024
            waiting.register(self.proc.stdout, select.POLLIN)
            if waiting.poll(1000):
                line = self.proc.stdout.readline()
                if not line:
                    return f"exited {self.proc.wait()}"
                if line.startswith("@@"):
                    return line[2:].strip()
        return "no answer"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def _save_on_two_hosts(
    hosts: Hosts, tmp_path: Path, bucket: str, durable: bool, level: str
) -> list[_Rank]:
    """Ranks 0 (the coordinator) and 1 on host A, rank 2 on host B; all saved."""
    port = _free_port()
    ranks = []
    for rank, host in enumerate(("hostA", "hostA", "hostB")):
        tiercache = {
            "local_dir": str(tmp_path / f"rank{rank}-local"),
            "shared_dir": str(hosts.shared(host)),
            "write_tier": "shared",
            "lease_stale_after": STALE,
            "retries": 1,
        }
        job = {
            "rank": rank,
            "world": 3,
            "port": port,
            "url": f"tiercache::s3://{bucket}/ckpt/step-3",
            "storage_options": {"s3": hosts.options, "tiercache": tiercache},
            "durable": durable,
            "level": level,
        }
        ranks.append(_Rank(host, job))
    outcomes = [rank.outcome() for rank in ranks]
    assert outcomes == ["saved"] * 3, outcomes
    return ranks


def _lose_ranks(ranks: list[_Rank], cephfs: CephFS, host: str) -> None:
    for rank in ranks:
        if rank.host == host:
            rank.kill()
    cephfs.crash(host)


def _stored_keys(s3_client: Any, bucket: str) -> list[str]:
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="ckpt/step-3/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


def _watch_marker(s3_client: Any, bucket: str, violations: list[list[str]]) -> Any:
    """A thread that records every listing showing .metadata without all three data files."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            keys = _stored_keys(s3_client, bucket)
            data = [k for k in keys if k.endswith(".distcp")]
            if "ckpt/step-3/.metadata" in keys and len(data) < 3:
                violations.append(keys)
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return done, thread


def _lose_host_a_then_flush_on_b(
    ranks: list[_Rank],
    hosts: Hosts,
    cephfs: CephFS,
    proxy: FaultProxy,
    s3_client: Any,
    bucket: str,
) -> tuple[dict[str, Any], list[list[str]]]:
    """Host A (ranks 0 and 1) is lost; the store takes uploads again; host B flushes while a
    watcher of the bucket looks for a .metadata without its data. The flush's reply, and
    what the watcher saw."""
    violations: list[list[str]] = []
    try:
        _lose_ranks(ranks, cephfs, "hostA")
        done, watcher = _watch_marker(s3_client, bucket, violations)
        proxy.clear()
        flusher = hosts.start("hostB", write_tier="shared", lease_stale_after=STALE)
        reply = flusher.call("flush", seconds=540, timeout=600)
        done.set()
        watcher.join()
    finally:
        for rank in ranks:
            rank.kill()
        cephfs.remount("hostA")
    return reply, violations


def test_a_checkpoint_saved_at_the_shared_level_is_completed_after_its_coordinator_s_host_is_lost(
    hosts: Hosts, cephfs: CephFS, proxy: FaultProxy, bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch", reason="the DCP adapter needs the tiercache[torch] extra")
    from dcp_host_rank import rank_state
    from tiercache.adapters.torch_checkpoint import dcp_load

    for method in ("PUT", "POST"):  # the ranks' uploads are refused while host A lives
        proxy.fail_next(10**6, status=503, method=method)
    ranks = _save_on_two_hosts(hosts, tmp_path, bucket, durable=True, level="shared")
    flushed, violations = _lose_host_a_then_flush_on_b(
        ranks, hosts, cephfs, proxy, s3_client, bucket
    )
    assert flushed == {}
    assert violations == []
    keys = _stored_keys(s3_client, bucket)
    assert "ckpt/step-3/.metadata" in keys and len(keys) == 4, keys
    want = {k: v for r in range(3) for k, v in rank_state(r).items()}
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    options = {"s3": hosts.options, "tiercache": {"local_dir": str(tmp_path / "load")}}
    with warnings.catch_warnings():  # torch: "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(got, f"tiercache::s3://{bucket}/ckpt/step-3", storage_options=options)
    assert all(got[k].equal(v) for k, v in want.items())


def test_a_coordinator_s_host_lost_before_the_commit_leaves_no_metadata_in_the_store(
    hosts: Hosts, cephfs: CephFS, proxy: FaultProxy, bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    for method in ("PUT", "POST"):
        proxy.fail_next(10**6, status=503, method=method)
    # durable=False: the coordinator holds .metadata back until a wait_durable that never comes.
    ranks = _save_on_two_hosts(hosts, tmp_path, bucket, durable=False, level="store")
    refused, violations = _lose_host_a_then_flush_on_b(
        ranks, hosts, cephfs, proxy, s3_client, bucket
    )
    assert "UploadFailedError" in refused.get("mro", []), refused
    assert violations == []
    keys = _stored_keys(s3_client, bucket)
    assert len([k for k in keys if k.endswith(".distcp")]) == 3, keys  # the data went
    assert "ckpt/step-3/.metadata" not in keys  # the commit never did
