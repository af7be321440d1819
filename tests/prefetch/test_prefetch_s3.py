"""Prefetch against the real S3 server: one GET per object with reads racing, read-ahead, stats."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

MiB = 1024 * 1024


def _put(s3_client: Any, bucket: str, prefix: str, count: int, size: int) -> dict[str, bytes]:
    blobs = {}
    for i in range(count):
        key = f"{prefix}/shard-{i:03d}"
        blobs[f"{bucket}/{key}"] = data = os.urandom(size)
        s3_client.put_object(Bucket=bucket, Key=key, Body=data)
    return blobs


def test_prefetch_and_reads_racing_make_one_get_per_object(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    blobs = _put(s3_client, bucket, "race", 8, 2 * MiB)  # below the part size: 1 GET each
    fs = make_fs(consistency="immutable", prefetch_workers=4)
    start = threading.Barrier(9)
    got: dict[str, bytes] = {}

    def reader(path: str) -> None:
        start.wait()
        with fs.open(path) as f:
            got[path] = f.read()

    threads = [threading.Thread(target=reader, args=(p,)) for p in reversed(blobs)]
    for t in threads:
        t.start()
    start.wait()
    handle = fs.prefetch(f"{bucket}/race/")
    for t in threads:
        t.join(60)
    assert handle.wait(60)
    fs.wait_fetches()
    assert got == blobs
    stats = fs.stats()
    assert stats["store_requests"]["GetObject"] == 8
    p = handle.progress()
    assert p.objects_done == 8 and p.failed == 0
    assert p.fetched + p.cached == 8  # each object either brought by it or joined/found


def test_read_ahead_keeps_the_next_shards_coming(make_fs: Any, s3_client: Any, bucket: str) -> None:
    blobs = _put(s3_client, bucket, "ra", 8, MiB)
    fs = make_fs(consistency="immutable", readahead=3)
    with fs.read_ahead(f"{bucket}/ra") as order:
        assert order.paths == list(blobs)
        for path in order.paths:
            time.sleep(0.05)  # the model's step: time for the next shards to arrive
            with fs.open(path) as f:
                assert f.read() == blobs[path]
    stats = fs.stats()
    assert stats["store_requests"]["GetObject"] == 8
    assert stats["prefetched"] >= 6  # all but the first, unless the reader outran a fetch
    assert stats["prefetch_used"] == stats["prefetched"]
    assert stats["prefetch_wasted"] == 0
    assert stats["hits"] >= 6


def test_prefetch_evicted_before_use_counts_as_wasted(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    blobs = _put(s3_client, bucket, "waste", 3, MiB)
    fs = make_fs(consistency="immutable")
    handle = fs.prefetch(f"{bucket}/waste/", pin=False)
    assert handle.wait(60) and handle.progress().fetched == 3
    fs.evict(0)
    first = next(iter(blobs))
    assert fs.cat_file(first) == blobs[first]
    stats = fs.stats()
    assert (stats["prefetched"], stats["prefetch_wasted"], stats["prefetch_used"]) == (3, 3, 0)
    assert stats["prefetch_wasted_bytes"] == 3 * MiB
