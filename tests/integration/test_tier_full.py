"""A local tier on a tiny filesystem that fills up: reads bypass it, writes fail clearly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tiercache import TierCacheFileSystem, TierFullError

MiB = 1024 * 1024


def _fs(s3: Any, tier: Path, **options: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=str(tier / "tier"),
        local_max_bytes="1GiB",  # the budget says yes; the filesystem says no
        skip_instance_cache=True,
        **options,
    )


def test_reads_bypass_a_full_tier_with_correct_bytes(
    s3: Any, s3_client: Any, bucket: str, small_tier: Path
) -> None:
    big = os.urandom(12 * MiB)
    s3_client.put_object(Bucket=bucket, Key="big.bin", Body=big)
    fs = _fs(s3, small_tier, consistency="immutable", range_size=5 * MiB, fetch_concurrency=2)
    with fs.open(f"{bucket}/big.bin") as f:
        chunks = []
        while chunk := f.read(MiB + 1):
            chunks.append(chunk)
        f.seek(100)
        assert f.read(10) == big[100:110]
    assert b"".join(chunks) == big
    assert fs.cat_file(f"{bucket}/big.bin", start=7 * MiB, end=7 * MiB + 5) == big[7 * MiB :][:5]
    fs.wait_fetches()
    assert fs.stats()["tier_full"] >= 1
    assert not fs.is_cached(f"{bucket}/big.bin")
    leftovers = [p for p in (small_tier / "tier").rglob("*.part")]
    assert leftovers == []


def test_writes_fail_clearly_and_lose_nothing_already_closed(
    s3: Any, s3_client: Any, bucket: str, small_tier: Path
) -> None:
    fs = _fs(s3, small_tier)
    with fs.open(f"{bucket}/small.bin", "wb") as f:
        f.write(b"closed before the disk filled")
    with pytest.raises(TierFullError) as err, fs.open(f"{bucket}/huge.bin", "wb") as f:
        for _ in range(16):
            f.write(os.urandom(MiB))
    assert isinstance(err.value, OSError) and "no space left in the local tier" in str(err.value)
    fs.flush(timeout=60)
    stored = s3_client.get_object(Bucket=bucket, Key="small.bin")["Body"].read()
    assert stored == b"closed before the disk filled"
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == ["small.bin"]  # the half-written file never reached the store
