"""N readers of one missing object, in threads or in separate processes, cause one GET."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

from tiercache import TierCacheFileSystem

MiB = 1024 * 1024


def test_eight_threads_one_get(make_fs: Any, s3_client: Any, bucket: str) -> None:
    data = os.urandom(4 * MiB)
    s3_client.put_object(Bucket=bucket, Key="hot.bin", Body=data)
    fs = make_fs()
    barrier = threading.Barrier(8)
    results: list[bytes] = []

    def reader() -> None:
        barrier.wait()
        with fs.open(f"{bucket}/hot.bin") as f:
            results.append(f.read())

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [data] * 8
    assert fs.stats()["store_requests"]["GetObject"] == 1
    assert fs.stats()["fetches"] + fs.stats()["fetch_errors"] <= 1


def _process_reader(
    options: dict[str, Any], local_dir: str, path: str, start: Any, out: Any
) -> None:
    fs = TierCacheFileSystem(target_options=options, local_dir=local_dir, skip_instance_cache=True)
    start.wait()
    with fs.open(path) as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    fs.wait_fetches()
    out.put((digest, fs.stats()["store_requests"].get("GetObject", 0), fs.stats()["fetches"]))


def test_eight_processes_one_get(s3: Any, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    data = os.urandom(8 * MiB)  # below the part size: a fetch is exactly one GET
    s3_client.put_object(Bucket=bucket, Key="shared.bin", Body=data)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    args = (s3.target_options(), str(tmp_path / "tier"), f"{bucket}/shared.bin", start, out)
    procs = [ctx.Process(target=_process_reader, args=args) for _ in range(8)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0

    expected = hashlib.sha256(data).hexdigest()
    assert [digest for digest, _, _ in results] == [expected] * 8
    assert sum(gets for _, gets, _ in results) == 1
    assert sum(fetches for _, _, fetches in results) == 1


def test_a_reader_whose_lookup_came_just_before_the_publish_joins_that_fetch(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    """The interleaving that made an asyncio test count 8 misses for 7 GETs: a reader looks
    in the tier just before a fetch publishes, and asks for the object after the fetch has
    finished but before it left the table of running fetches. It joins that fetch: no second
    fetch, no second miss."""
    data = os.urandom(MiB)
    s3_client.put_object(Bucket=bucket, Key="late.bin", Body=data)
    fs = make_fs(consistency="immutable")
    read_path = fs.read_path
    leave_table = threading.Event()
    landed = read_path._landed

    def landed_later(fetch: Any) -> None:  # the finished fetch stays in the table meanwhile
        leave_table.wait(30)
        landed(fetch)

    read_path._landed = landed_later  # taken by each fetch when it is made
    try:
        assert fs.cat_file(f"{bucket}/late.bin") == data
        (fetch,) = read_path._flights.values()
        fetch.wait_finished()
        hit = read_path._open_hit
        missed_once: list[bool] = []

        def lookup_before_the_publish(*args: Any) -> Any:
            if not missed_once:
                missed_once.append(True)
                return None  # what the lookup saw a moment before the publish
            return hit(*args)

        read_path._open_hit = lookup_before_the_publish
        assert fs.cat_file(f"{bucket}/late.bin") == data
        assert missed_once
    finally:
        leave_table.set()
    stats = fs.stats()
    assert stats["store_requests"]["GetObject"] == 1
    assert stats["misses"] == 1 and stats["fetches_joined"] == 1
