"""Consistency modes against the real server: an ETag change is seen in ttl and always modes."""

from __future__ import annotations

import time
from typing import Any

import pytest


def _put(client: Any, bucket: str, key: str, body: bytes) -> None:
    client.put_object(Bucket=bucket, Key=key, Body=body)


def test_immutable_never_revalidates(make_fs: Any, s3_client: Any, bucket: str) -> None:
    _put(s3_client, bucket, "k", b"version-1")
    fs = make_fs(consistency="immutable")
    assert fs.cat(f"{bucket}/k") == b"version-1"
    fs.wait_fetches()
    _put(s3_client, bucket, "k", b"version-2")
    assert fs.cat(f"{bucket}/k") == b"version-1"  # by contract: datasets never change
    assert fs.stats()["store_requests"].get("HeadObject", 0) == 0


def test_always_sees_a_change_on_next_open(make_fs: Any, s3_client: Any, bucket: str) -> None:
    _put(s3_client, bucket, "k", b"version-1")
    fs = make_fs(consistency="always")
    assert fs.cat(f"{bucket}/k") == b"version-1"
    fs.wait_fetches()
    assert fs.cat(f"{bucket}/k") == b"version-1"
    assert fs.stats()["revalidations"] == 1
    _put(s3_client, bucket, "k", b"version-2, longer")
    assert fs.cat(f"{bucket}/k") == b"version-2, longer"
    assert fs.stats()["invalidations"] == 1


def test_ttl_revalidates_after_expiry(make_fs: Any, s3_client: Any, bucket: str) -> None:
    _put(s3_client, bucket, "k", b"old")
    fs = make_fs(consistency="ttl", ttl=2.0)  # long beside a PUT: a stalled machine stays inside
    assert fs.cat(f"{bucket}/k") == b"old"
    fs.wait_fetches()
    _put(s3_client, bucket, "k", b"new")
    assert fs.cat(f"{bucket}/k") == b"old"  # still inside the TTL: no HEAD
    assert fs.stats()["store_requests"].get("HeadObject", 0) == 0
    time.sleep(2.1)
    assert fs.cat(f"{bucket}/k") == b"new"
    assert fs.stats()["invalidations"] == 1


def test_ttl_unchanged_object_is_revalidated_not_refetched(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    _put(s3_client, bucket, "k", b"same")
    fs = make_fs(consistency="ttl", ttl=0.2)
    fs.cat(f"{bucket}/k")
    fs.wait_fetches()
    time.sleep(0.3)
    assert fs.cat(f"{bucket}/k") == b"same"
    stats = fs.stats()
    assert stats["revalidations"] == 1
    assert stats["store_requests"]["GetObject"] == 1


def test_deleted_object_is_dropped_in_always_mode(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    _put(s3_client, bucket, "k", b"x")
    fs = make_fs(consistency="always")
    fs.cat(f"{bucket}/k")
    fs.wait_fetches()
    s3_client.delete_object(Bucket=bucket, Key="k")
    with pytest.raises(FileNotFoundError):
        fs.cat(f"{bucket}/k")
    assert not fs.is_cached(f"{bucket}/k")
