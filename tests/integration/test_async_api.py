"""The asyncio face on the real S3 server: the same tier, flights and prefetcher as the sync one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import fsspec

from tiercache import TierCacheFileSystem
from tiercache.async_api import AsyncTierCacheFileSystem

MiB = 1024 * 1024


def test_an_asyncio_program_reads_through_the_cache(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    blobs = {f"data/k{i}": os.urandom(MiB + i) for i in range(4)}
    for key, blob in blobs.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=blob)
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"pre/p{i}", Body=os.urandom(MiB))
    options = {
        "target_options": s3.target_options(),
        "local_dir": str(tmp_path / "tier"),
        "consistency": "immutable",
        "skip_instance_cache": True,
    }

    async def program() -> dict[str, Any]:
        fs = TierCacheFileSystem(asynchronous=True, **options)
        paths = [f"{bucket}/{k}" for k in blobs]
        # Three concurrent readers per object: one GET each (the single-flight table).
        reads = await asyncio.gather(*(fs._cat_file(p) for p in paths for _ in range(3)))
        out: dict[str, Any] = {"reads": reads, "paths": paths}
        out["info"] = await fs._info(paths[0])
        out["ls"] = await fs._ls(f"{bucket}/data", detail=False)
        out["find"] = await fs._find(f"{bucket}/data")
        out["exists"] = await fs._exists(f"{bucket}/data/none")
        out["range"] = await fs._cat_file(paths[1], start=10, end=30)
        async with await fs.open_async(paths[2]) as f:
            head = await f.read(100)
            f.seek(MiB - 4)
            out["file"] = (head, await f.read())
        handle = await fs.prefetch_async(f"{bucket}/pre/")
        out["prefetched"] = await fs.wait_async(handle, 60)
        out["stats"] = fs.stats()
        out["fs"] = fs  # keeps the shared runtime alive for the sync face below
        return out

    out = asyncio.run(program())
    paths = out["paths"]
    assert out["reads"] == [blobs[p.split("/", 1)[1]] for p in paths for _ in range(3)]
    assert out["info"]["size"] == MiB and out["info"]["cached"] is True
    assert out["ls"] == paths == out["find"]
    assert out["exists"] is False
    assert out["range"] == blobs["data/k1"][10:30]
    k2 = blobs["data/k2"]
    assert out["file"] == (k2[:100], k2[MiB - 4 :])
    assert out["prefetched"] is True
    stats = out["stats"]
    assert stats["store_requests"]["GetObject"] == 4 + 3  # 4 read objects, 3 prefetched
    # Seven fetches in all: the other eight readers joined one, or came after it published.
    # A reader whose lookup missed just before a fetch published (and left the single-flight
    # table) counts a miss, then finds the entry under its lock and sends no GET.
    found_published = stats["fetches_joined_other_process"]
    assert stats["misses"] - found_published == 4 + 3 and stats["prefetched"] == 3
    assert stats["fetches_joined"] <= 8
    # The sync face on the same options shares the runtime: it sees what the async one cached.
    sync = TierCacheFileSystem(**options)
    sync.wait_fetches()
    assert all(sync.is_cached(p) for p in paths)
    assert sync.cat_file(f"{bucket}/pre/p0") and sync.stats()["prefetch_used"] == 1


def test_the_async_protocol_is_registered_and_works_synchronously(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="obj", Body=b"hello async")
    fs = fsspec.filesystem(
        "tiercache-async",
        target_options=s3.target_options(),
        local_dir=str(tmp_path / "tier"),
        skip_instance_cache=True,
    )
    # The former name is the one filesystem class under another protocol name.
    assert isinstance(fs, AsyncTierCacheFileSystem) and isinstance(fs, TierCacheFileSystem)
    assert fs.cat_file(f"tiercache-async://{bucket}/obj") == b"hello async"
    with fs.open(f"{bucket}/obj") as f:
        assert f.read() == b"hello async"
    assert fs.sync_fs is fs
    fs.wait_fetches()
    assert fs.is_cached(f"{bucket}/obj")


def test_async_rm_deletes_in_batches(s3: Any, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    for i in range(5):
        s3_client.put_object(Bucket=bucket, Key=f"gone/k{i}", Body=b"x")
    s3_client.put_object(Bucket=bucket, Key="kept", Body=b"x")

    async def program() -> dict[str, int]:
        fs = TierCacheFileSystem(
            asynchronous=True,
            target_options=s3.target_options(),
            local_dir=str(tmp_path / "tier"),
            skip_instance_cache=True,
        )
        await fs._rm(f"{bucket}/gone", recursive=True)
        counts: dict[str, int] = fs.stats()["store_requests"]
        return counts

    counts = asyncio.run(program())
    # One DeleteObjects for the five keys, as the blocking rm sends; no DeleteObject per key.
    assert counts.get("DeleteObjects") == 1 and not counts.get("DeleteObject")
    listed = s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert [o["Key"] for o in listed] == ["kept"]
