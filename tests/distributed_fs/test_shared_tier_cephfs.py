"""The shared tier on a real distributed filesystem: CephFS mounted by two ceph-fuse clients.

Each "host" is a ceph-fuse mount of its own (its own client, caps and MDS session) and the
tiercache processes whose ``shared_dir`` lies on that mount, each with its host's hostname
(its default ``host_id``) and local tier. The store is the session's real S3 server; GETs are
counted by tiercache in every process and by a proxy in front of the server.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.cephfs_hosts import CephFS, Hosts, fill_quota, on_host, start_all
from support.proxy import FaultProxy

pytestmark = [pytest.mark.distributed_fs, pytest.mark.multinode, pytest.mark.integration]

MiB = 1024 * 1024


def _put(s3_client: Any, bucket: str, sizes: dict[str, int]) -> dict[str, str]:
    """Upload random objects; their paths and sha256."""
    expected = {}
    for key, size in sizes.items():
        data = os.urandom(size)
        s3_client.put_object(Bucket=bucket, Key=key, Body=data)
        expected[f"{bucket}/{key}"] = hashlib.sha256(data).hexdigest()
    return expected


def _files(shared: Path, pattern: str) -> list[str]:
    return glob.glob(str(shared / "objects" / "*" / pattern))


def test_processes_on_two_hosts_fetch_each_object_once(
    hosts: Hosts, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    expected = _put(s3_client, bucket, {f"shards/{i}.bin": MiB for i in range(8)})
    procs = [hosts.start(host) for host in ("hostA", "hostB") for _ in range(3)]
    start_all(procs)
    assert {p.ready()["host"] for p in procs} == {"hostA", "hostB"}
    for proc in procs:  # all at once: each waits on the others' leases
        proc.send("cat", paths=sorted(expected, reverse=procs.index(proc) % 2 == 1))
    for proc in procs:
        assert proc.receive()["sha256"] == expected
    stats = [proc.call("stats") for proc in procs]
    assert sum(s["fetches"] for s in stats) == len(expected)
    assert sum(s["gets"] for s in stats) == len(expected)
    for path in expected:
        assert proxy.count("GET", "/" + path.split("/", 1)[1]) == 1, path  # as the server saw
    for host in ("hostA", "hostB"):  # each host's processes fetched or read the shared copies
        assert len(_files(hosts.shared(host), "*.data")) == len(expected)
    assert _files(hosts.shared("hostA"), "*.lock") == []
    assert _files(hosts.shared("hostA"), "*.part*") == []


def test_a_dead_host_s_lease_is_taken_over_after_lease_stale_after(
    hosts: Hosts, cephfs: CephFS, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    expected = _put(s3_client, bucket, {"big.bin": 24 * MiB})
    (path,) = expected
    baseline = _put(s3_client, bucket, {"same-size.bin": 24 * MiB})
    # hostA's GET delivers 4 MiB, then stalls: the host dies in the middle of the fetch.
    proxy.truncate_next(1, after_bytes=4 * MiB, hold=60.0, method="GET")
    fetcher = hosts.start("hostA", lease_stale_after=2.0, fetch_concurrency=1)
    waiter = hosts.start("hostA", lease_stale_after=2.0)
    start_all([fetcher, waiter])
    fetcher.send("cat", paths=[path])
    shared_b = hosts.shared("hostB")
    deadline = time.monotonic() + 60
    lease = None
    while lease is None:  # the lease as the other host sees it
        assert time.monotonic() < deadline, "the fetch never took its lease"
        locks = _files(shared_b, "*.lock")
        lease = json.loads(Path(locks[0]).read_bytes() or b"null") if locks else None
        time.sleep(0.05)
    assert lease["host"] == "hostA"  # the default host_id: this host's hostname
    waiter.send("cat", paths=[path])  # another process of the host, waiting on the lease
    while proxy.count("GET") < 1:  # the fetcher is in the middle of its GET
        assert time.monotonic() < deadline, "the fetch never sent its GET"
        time.sleep(0.05)
    fetcher.kill()
    waiter.kill()
    cephfs.crash("hostA")  # its ceph-fuse dies; its MDS session (caps) is evicted
    try:
        assert "hostA" not in cephfs.client_hostnames()
        # A host that may only be slow is not robbed of its lease before lease_stale_after.
        patient = hosts.start("hostB", lease_stale_after=60.0, lock_timeout=1.0)
        refused = patient.call("cat", paths=[path])
        assert refused.get("error") == "CacheTimeoutError", refused
        assert patient.call("stats")["leases_broken"] == 0
        taker = hosts.start("hostB", lease_stale_after=2.0, lock_timeout=60.0)
        started = time.monotonic()
        assert taker.call("cat", paths=[path])["sha256"] == expected
        took_over_in = time.monotonic() - started
        stats = taker.call("stats")
        assert (stats["leases_broken"], stats["fetches"]) == (1, 1)
        assert stats["bytes_fetched"] == 24 * MiB  # one copy (in ranged GETs)
        assert proxy.count("GET", "/big.bin") == 1 + stats["gets"]  # the dead host's, then these
        assert len(_files(shared_b, "*.data")) == 1
        assert _files(shared_b, "*.part*") == []  # the dead fetcher's part file is gone
        assert _files(shared_b, "*.lock") == []
        # Taken over within lease_stale_after (+ 5 s) of the host's death, its session being
        # evicted at once: beyond the time an uncontended fetch of the same size takes.
        started = time.monotonic()
        assert taker.call("cat", paths=list(baseline))["sha256"] == baseline
        fetch_alone = time.monotonic() - started
        assert took_over_in - fetch_alone <= 2.0 + 5.0, (took_over_in, fetch_alone)
    finally:
        cephfs.remount("hostA")
    reborn = hosts.start("hostA")  # the host is back: it reads the published entry
    assert reborn.call("cat", paths=[path])["sha256"] == expected
    assert reborn.call("stats")["fetches"] == 0


def test_eviction_on_one_host_skips_what_the_other_host_reads(
    hosts: Hosts, s3_client: Any, bucket: str
) -> None:
    expected = _put(s3_client, bucket, {"open.bin": 4 * MiB, "idle.bin": MiB})
    open_path, idle_path = sorted(expected, key=lambda p: not p.endswith("open.bin"))
    evictor = hosts.start("hostA")
    reader = hosts.start("hostB", shared_policy="serve")
    start_all([evictor, reader])
    assert evictor.call("cat", paths=list(expected))["sha256"] == expected
    assert evictor.call("stats")["fetches"] == 2
    reader.call("open", path=open_path)  # in place on hostB: holds a shared flock on its data
    first = reader.call("read", path=open_path, size=MiB)
    assert first["n"] == MiB
    report = evictor.call("evict", tier="shared", target=0)
    assert report["kept_busy"] == 1  # hostB's flock is seen through the other ceph-fuse
    assert report["removed"] != []  # the entry nobody reads
    assert evictor.call("is_cached", path=open_path, tier="shared")["cached"]
    assert not evictor.call("is_cached", path=idle_path, tier="shared")["cached"]
    rest = reader.call("read", path=open_path, size=8 * MiB)
    assert first["n"] + rest["n"] == 4 * MiB
    reader.call("close", path=open_path)
    assert evictor.call("evict", tier="shared", target=0)["removed"] != []
    assert not evictor.call("is_cached", path=open_path, tier="shared")["cached"]


@pytest.mark.parametrize("policy", ["serve", "promote"])
def test_reads_racing_eviction_on_the_other_host_are_never_torn(
    hosts: Hosts, s3_client: Any, bucket: str, policy: str
) -> None:
    expected = _put(s3_client, bucket, {f"r/{i}.bin": 2 * MiB for i in range(6)})
    evictor = hosts.start("hostA")
    reader = hosts.start("hostB", shared_policy=policy, local_max_bytes=4 * MiB)
    start_all([evictor, reader])
    assert evictor.call("cat", paths=list(expected))["sha256"] == expected
    reader.send("read_loop", expected=expected, rounds=6)
    evictor.send("evict_loop", tier="shared", count=40, pause=0.02)
    loop = reader.receive(timeout=300)
    evicted = evictor.receive(timeout=300)
    assert loop["errors"] == [] and loop["bad"] == []  # every read whole and right
    assert loop["reads"] == 6 * len(expected)
    assert evicted["removed"] > 0
    # The reader did meet eviction: objects it had read were gone and fetched again.
    assert reader.call("stats")["fetches"] > 0


def test_serve_reads_in_place_and_promote_copies_to_the_local_tier(
    hosts: Hosts, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    expected = _put(s3_client, bucket, {"a.bin": 3 * MiB, "b.bin": MiB})
    filler = hosts.start("hostA", shared_policy="serve")
    serve = hosts.start("hostB", local="serve-local", shared_policy="serve")
    promote = hosts.start("hostB", local="promote-local", shared_policy="promote")
    start_all([filler, serve, promote])
    paths = sorted(expected)
    assert filler.call("cat", paths=paths)["sha256"] == expected
    for proc in (serve, promote):
        assert proc.call("cat", paths=paths)["sha256"] == expected
    served, promoted = serve.call("stats"), promote.call("stats")
    assert (served["fetches"], served["shared_hits"], served["promotions"]) == (0, 2, 0)
    assert (promoted["fetches"], promoted["promotions"]) == (0, 2)
    for path in paths:
        assert not serve.call("is_cached", path=path, tier="local")["cached"]
        assert promote.call("is_cached", path=path, tier="local")["cached"]
    # The shared copies go (evicted on hostA): promoted copies are still read locally,
    # while the serving process must go back to the store.
    assert len(filler.call("evict", tier="shared", target=0)["removed"]) == 2
    for proc in (serve, promote):
        assert proc.call("cat", paths=paths)["sha256"] == expected
    assert promote.call("stats")["fetches"] == 0
    assert serve.call("stats")["fetches"] == 2
    assert proxy.count("GET") == 4  # the fill, then the serving host's refetch


def test_a_full_shared_filesystem_quota_still_reads_correct_bytes(
    hosts: Hosts, s3_client: Any, bucket: str
) -> None:
    expected = _put(s3_client, bucket, {"a.bin": 2 * MiB, "b.bin": 3 * MiB})
    paths = sorted(expected)
    shared_a, shared_b = hosts.shared("hostA"), hosts.shared("hostB")
    shared_a.mkdir(parents=True)
    fill_quota(shared_a, [shared_a, shared_b])
    filler = hosts.start("hostA")
    reader = hosts.start("hostB", shared_policy="serve")
    start_all([filler, reader])
    # EDQUOT on the shared tier: the reads go on from the store, nothing is published and
    # nothing is left behind (no lease that would hold the other host's readers up).
    assert filler.call("cat", paths=paths)["sha256"] == expected
    assert filler.call("stats")["tier_full"] >= 1
    for pattern in ("*.data", "*.part*", "*.lock"):
        assert _files(shared_b, pattern) == [], pattern
    assert reader.call("cat", paths=paths)["sha256"] == expected
    assert reader.call("stats")["tier_full"] >= 1
    # Room again (ceph-fuse learns of the change lazily): reads fill the shared tier, and
    # the other host reads the objects there.
    os.setxattr(shared_a, "ceph.quota.max_bytes", b"0")
    deadline = time.monotonic() + 60
    while len(_files(shared_a, "*.data")) < 2:
        assert time.monotonic() < deadline, reader.call("stats")
        assert reader.call("cat", paths=paths)["sha256"] == expected
    assert filler.call("cat", paths=paths)["sha256"] == expected
    before = filler.call("stats")["fetches"]
    assert filler.call("cat", paths=paths)["sha256"] == expected
    assert filler.call("stats")["fetches"] == before


def test_a_reader_the_store_refuses_gets_no_bytes_from_the_other_host(
    hosts: Hosts, s3_client: Any, bucket: str
) -> None:
    expected = _put(s3_client, bucket, {"private.bin": MiB})
    (path,) = expected
    owner = hosts.start("hostA", shared_file_mode=0o660)  # group-readable: shared_auth=store
    wrong = {**hosts.options, "secret": "not-the-secret"}
    intruder = hosts.start("hostB", shared_file_mode=0o660, target_options=wrong)
    trusting = hosts.start("hostB", local="trusting", shared_auth="trust", target_options=wrong)
    start_all([owner, intruder, trusting])
    assert owner.call("cat", paths=[path])["sha256"] == expected
    assert owner.call("stats")["fetches"] == 1  # (stats waits for the fetch to publish)
    published = _files(hosts.shared("hostB"), "*.data")
    assert len(published) == 1
    assert os.stat(published[0]).st_mode & 0o777 == 0o660  # as hostB's mount sees it
    assert intruder.call("is_cached", path=path, tier="shared")["cached"]
    refused = intruder.call("cat", paths=[path])
    assert "PermissionError" in refused.get("mro", []), refused
    assert not intruder.call("is_cached", path=path, tier="local")["cached"]
    assert trusting.call("cat", paths=[path])["sha256"] == expected  # shared_auth=trust


def test_prefetch_tier_shared_on_one_host_is_read_by_the_other(
    hosts: Hosts, s3: Any, s3_client: Any, bucket: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    expected = _put(s3_client, bucket, {f"train/{i}.tar": MiB for i in range(5)})
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": proxy.url,
        "AWS_ACCESS_KEY_ID": s3.key,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_DEFAULT_REGION": s3.region,
        "TIERCACHE_LOCAL_DIR": str(tmp_path / "hostA-local"),
        "TIERCACHE_SHARED_DIR": str(hosts.shared("hostA")),
    }
    cli = [sys.executable, "-m", "tiercache.cli", "prefetch", f"s3://{bucket}/train/"]
    done = subprocess.run(
        on_host("hostA", [*cli, "--tier", "shared", "--json", "--jobs", "2"]),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fetched"] == len(expected)
    assert s3.secret not in done.stdout + done.stderr
    keys = ["/" + path.split("/", 1)[1] for path in expected]
    assert [proxy.count("GET", key) for key in keys] == [1] * len(keys)
    reader = hosts.start("hostB", shared_policy="serve")
    assert reader.call("cat", paths=sorted(expected))["sha256"] == expected
    stats = reader.call("stats")
    assert (stats["fetches"], stats["shared_hits"]) == (0, len(expected))
    assert [proxy.count("GET", key) for key in keys] == [1] * len(keys)  # all from CephFS
    # --tier shared copies nothing into the prefetching host's local tier
    assert glob.glob(str(tmp_path / "hostA-local" / "objects" / "*" / "*.data")) == []


def test_processes_on_two_hosts_listing_one_prefix_share_one_listing(
    hosts: Hosts, s3_client: Any, bucket: str, proxy: FaultProxy
) -> None:
    """Eight processes on two hosts, each with a local tier of its own, list one prefix of
    10 000 keys at once: the shared tier's listing makes it one LIST (10 pages), not eight."""
    keys = [f"big/{i:05d}" for i in range(10_000)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: s3_client.put_object(Bucket=bucket, Key=k, Body=b"x"), keys))
    procs = [
        hosts.start(host, local=f"{host}-{i}", consistency="ttl", ttl=300.0)
        for host in ("hostA", "hostB")
        for i in range(4)
    ]
    start_all(procs)
    for proc in procs:
        proc.ready()
    listed_before = proxy.count("GET", "list-type=2")
    for proc in procs:  # all at once
        proc.send("find", path=f"{bucket}/big")
    for proc in procs:
        assert proc.receive()["count"] == len(keys)
    pages = proxy.count("GET", "list-type=2") - listed_before
    one_listing = len(keys) // 1000  # ListObjectsV2 pages of 1000 keys
    assert pages <= 1.1 * one_listing, pages
    # A write on one host forgets the shared listing: a process of the other host that
    # lists next (with no listing of its own yet) sees the new key, not a ttl later.
    assert "error" not in procs[0].call("write", path=f"{bucket}/big/new", data="added")
    newcomer = hosts.start("hostB", local="hostB-new", consistency="ttl", ttl=300.0)
    start_all([newcomer])
    newcomer.ready()
    assert newcomer.call("find", path=f"{bucket}/big")["count"] == len(keys) + 1


def test_a_shared_tier_out_of_quota_refuses_the_write_and_keeps_the_previous_version(
    hosts: Hosts, bucket: str, s3_client: Any
) -> None:
    """write_tier="shared": EDQUOT while a write is staged makes it raise TierFullError."""
    path = f"{bucket}/ckpt/latest.pt"
    s3_client.put_object(Bucket=bucket, Key="ckpt/latest.pt", Body=b"previous")
    previous = hashlib.sha256(b"previous").hexdigest()
    shared = hosts.shared("hostA")
    writer = hosts.start("hostA", write_tier="shared")
    assert writer.call("cat", paths=[path])["sha256"][path] == previous
    fill_quota(shared, [shared])  # 4 MiB of other data, and a quota of 4 MiB
    refused = writer.call("write_behind", sizes={path: 64 * MiB}, timeout=600)
    assert "TierFullError" in refused.get("mro", []), refused
    assert writer.call("pending")["rows"] == []
    assert writer.call("cat", paths=[path])["sha256"][path] == previous
    stored = s3_client.get_object(Bucket=bucket, Key="ckpt/latest.pt")["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == previous
