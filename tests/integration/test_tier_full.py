"""A local tier on a tiny filesystem that fills up: reads bypass it, writes fail clearly."""

from __future__ import annotations

import errno
import os
import time
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


def _fill(directory: Path) -> Path:
    """Take every free byte of the filesystem of ``directory``; the file that holds them."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


def test_uploads_that_cannot_be_recorded_on_a_full_tier_are_not_sent_again(
    s3: Any, s3_client: Any, bucket: str, small_tier: Path, proxy: Any
) -> None:
    """The tier fills up while writes are pending: each reaches the store once, although
    the tier has no room to mark it uploaded; space returns, and nothing is resent."""
    fs = TierCacheFileSystem(
        target_options=dict(s3.target_options(), endpoint_url=proxy.url),
        local_dir=str(small_tier / "tier"),
        local_max_bytes="1GiB",
        skip_instance_cache=True,
    )
    payloads = {f"ckpt/{i}.bin": os.urandom(MiB) for i in range(3)}
    proxy.fail_next(10**6, status=503, method="PUT")  # pending until the disk is full
    for key, payload in payloads.items():
        with fs.open(f"{bucket}/{key}", "wb") as f:
            f.write(payload)
    filler = _fill(small_tier)
    proxy.clear()
    puts_before = proxy.count("PUT")
    fs.flush(timeout=30)
    time.sleep(2)  # a resend would come meanwhile
    assert proxy.count("PUT") - puts_before == len(payloads)
    for key, payload in payloads.items():
        assert s3_client.get_object(Bucket=bucket, Key=key)["Body"].read() == payload
    assert fs.pending() == []
    filler.unlink()
    for key, payload in payloads.items():  # dropped from the tier, fetched again
        assert fs.cat_file(f"{bucket}/{key}") == payload
    assert proxy.count("PUT") - puts_before == len(payloads)
