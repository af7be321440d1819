"""Many processes standing in for many hosts share one shared tier over the real S3 server.

Each process has its own host identity and its own local tier per host; all use one shared
tier directory. Requests are counted twice: by tiercache's own metrics in every process, and
by a proxy in front of the server (what the server saw).
"""

from __future__ import annotations

import glob
import hashlib
import multiprocessing
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.proxy import FaultProxy

from tiercache import TierCacheFileSystem

MiB = 1024 * 1024
HOSTS = 4
PROCESSES_PER_HOST = 4
SHARDS = 32


def _host_fs(options: dict[str, Any], root: str, host: int, **extra: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=options,
        local_dir=os.path.join(root, f"host{host}-local"),
        shared_dir=os.path.join(root, "shared"),
        host_id=f"host{host}",
        consistency="immutable",
        skip_instance_cache=True,
        **extra,
    )


def _reader(
    options: dict[str, Any], root: str, host: int, paths: list[str], start: Any, out: Any
) -> None:
    fs = _host_fs(options, root, host)
    order = list(paths)
    random.Random(os.getpid()).shuffle(order)
    start.wait()
    digests = {}
    for path in order:
        with fs.open(path) as f:
            digests[path] = hashlib.sha256(f.read()).hexdigest()
    fs.wait_fetches()
    stats = fs.stats()
    out.put((digests, stats["fetches"], stats["store_requests"].get("GetObject", 0)))


def test_sixteen_processes_as_four_hosts_fetch_each_shard_once(
    s3: Any, s3_client: Any, bucket: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    expected = {}
    for i in range(SHARDS):
        data = os.urandom(MiB)  # below the part size: one fetch is one GET
        s3_client.put_object(Bucket=bucket, Key=f"shards/{i:03d}.bin", Body=data)
        expected[f"{bucket}/shards/{i:03d}.bin"] = hashlib.sha256(data).hexdigest()
    options = {**s3.target_options(), "endpoint_url": proxy.url}
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_reader, args=(options, str(tmp_path), n % HOSTS, list(expected), start, out)
        )
        for n in range(HOSTS * PROCESSES_PER_HOST)
    ]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0

    for digests, _, _ in results:
        assert digests == expected  # every byte verified in every process
    assert sum(fetches for _, fetches, _ in results) == SHARDS
    assert sum(gets for _, _, gets in results) == SHARDS
    for path in expected:
        key = path.split("/", 1)[1]
        assert proxy.count("GET", f"/{key}") == 1, key  # as the server saw it


def _stalled_fetcher(options: dict[str, Any], root: str, host: int, path: str) -> None:
    fs = _host_fs(options, root, host, lease_stale_after=1.0, fetch_concurrency=1)
    with fs.open(path) as f:
        f.read()


def _part_bytes(root: Path) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(str(root / "shared/objects/*/*.part.*")))


def _published(root: Path) -> list[str]:
    return glob.glob(str(root / "shared/objects/*/*.data"))


@pytest.mark.parametrize("same_host", [True, False], ids=["same-host", "other-host"])
def test_kill_9_of_the_fetcher_serves_no_torn_file_and_another_finishes(
    s3: Any,
    s3_client: Any,
    bucket: str,
    proxy: FaultProxy,
    tmp_path: Path,
    same_host: bool,
) -> None:
    data = os.urandom(24 * MiB)
    s3_client.put_object(Bucket=bucket, Key="big.bin", Body=data)
    path = f"{bucket}/big.bin"
    # The fetcher's GET delivers 4 MiB and then stalls: it dies in the middle of the fetch.
    proxy.truncate_next(1, after_bytes=4 * MiB, hold=60.0, method="GET")
    options = {**s3.target_options(), "endpoint_url": proxy.url}
    ctx = multiprocessing.get_context("spawn")
    victim = ctx.Process(target=_stalled_fetcher, args=(options, str(tmp_path), 0, path))
    victim.start()
    deadline = time.monotonic() + 60
    while _part_bytes(tmp_path) < 4 * MiB:
        assert time.monotonic() < deadline, "the fetch never started"
        assert victim.is_alive()
        time.sleep(0.01)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=30)
    assert victim.exitcode == -signal.SIGKILL
    assert _published(tmp_path) == []  # the torn bytes were never published

    survivor = _host_fs(
        options, str(tmp_path), 0 if same_host else 1, lease_stale_after=1.0, lock_timeout=60.0
    )
    started = time.monotonic()
    with survivor.open(path) as f:
        assert f.read() == data
    survivor.wait_fetches()
    waited = time.monotonic() - started
    assert survivor.stats()["leases_broken"] == 1
    assert len(_published(tmp_path)) == 1
    assert _part_bytes(tmp_path) == 0  # the dead fetcher's part file is gone
    if not same_host:
        assert waited >= 0.5  # another host's lease is only broken once its heartbeat stops


def test_shared_entry_is_not_served_to_a_reader_the_store_refuses(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    data = os.urandom(MiB)
    s3_client.put_object(Bucket=bucket, Key="private.bin", Body=data)
    path = f"{bucket}/private.bin"
    # A group-readable shared tier: by default every reader is checked against the store.
    owner = _host_fs(s3.target_options(), str(tmp_path), 0, shared_file_mode=0o660)
    assert owner.config.shared_auth_mode == "store"
    assert owner.cat_file(path) == data
    owner.wait_fetches()
    (published,) = glob.glob(str(tmp_path / "shared/objects/*/*.data"))
    assert os.stat(published).st_mode & 0o777 == 0o660
    intruder_options = {**s3.target_options(), "secret": "not-the-secret"}
    intruder = _host_fs(intruder_options, str(tmp_path), 1, shared_file_mode=0o660)
    assert intruder.is_cached(path, tier="shared")
    with pytest.raises(PermissionError):
        intruder.cat_file(path)
    assert not intruder.is_cached(path, tier="local")
    trusting = _host_fs(intruder_options, str(tmp_path), 2, shared_auth="trust")
    assert trusting.cat_file(path) == data  # the documented cost of shared_auth=trust


def test_a_refused_reader_waiting_on_another_users_fetch_is_refused(
    s3: Any, s3_client: Any, bucket: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = os.urandom(8 * MiB)
    s3_client.put_object(Bucket=bucket, Key="slow.bin", Body=data)
    path = f"{bucket}/slow.bin"
    # The owner's GET stalls for a while mid-body, then resumes: the intruder arrives while
    # the owner holds the entry's lease, waits for it, and finds the entry published.
    proxy.truncate_next(1, after_bytes=MiB, hold=2.0, method="GET")
    owner_options = {**s3.target_options(), "endpoint_url": proxy.url}
    owner = _host_fs(owner_options, str(tmp_path), 0, shared_file_mode=0o660)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(bytes(owner.cat_file(path))))
    reader.start()
    deadline = time.monotonic() + 30
    while _part_bytes(tmp_path) < MiB:
        assert time.monotonic() < deadline, "the owner's fetch never started"
        time.sleep(0.01)
    # Same endpoint URL as the owner: entries are named by endpoint, bucket and key.
    intruder_options = {**owner_options, "secret": "not-the-secret"}
    intruder = _host_fs(intruder_options, str(tmp_path), 1, shared_file_mode=0o660)
    with pytest.raises(PermissionError):
        intruder.cat_file(path)
    reader.join(timeout=60)
    assert got == [data]
    assert intruder.stats()["fetches"] == 0  # it waited for the owner's fetch, then was refused
