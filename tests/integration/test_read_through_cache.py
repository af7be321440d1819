"""Reads through the local tier against the real S3 server: bytes, hits, ranges, fsspec URLs."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import fsspec
import pytest

from tiercache import TierCacheFileSystem

MiB = 1024 * 1024


def test_entry_point_registers_protocol() -> None:
    assert fsspec.get_filesystem_class("tiercache") is TierCacheFileSystem


def test_cold_then_warm_read_returns_same_bytes(make_fs: Any, s3_client: Any, bucket: str) -> None:
    data = os.urandom(3 * MiB + 17)
    s3_client.put_object(Bucket=bucket, Key="shards/000.bin", Body=data)
    fs = make_fs(consistency="immutable")

    with fs.open(f"{bucket}/shards/000.bin", "rb") as f:
        assert f.read() == data
    with fs.open(f"{bucket}/shards/000.bin", "rb") as f:
        assert f.read() == data

    stats = fs.stats()
    assert stats["misses"] == 1
    # The second open either hits the published entry or joins the fetch still publishing it.
    assert stats["hits"] + stats["fetches_joined"] == 1
    assert stats["store_requests"].get("GetObject") == 1
    fs.wait_fetches()
    assert fs.is_cached(f"{bucket}/shards/000.bin")


def test_multipart_parallel_fetch_is_byte_exact(make_fs: Any, s3_client: Any, bucket: str) -> None:
    data = os.urandom(23 * MiB + 5)
    s3_client.put_object(Bucket=bucket, Key="big.bin", Body=data)
    fs = make_fs(range_size=5 * MiB, fetch_concurrency=4)

    with fs.open(f"{bucket}/big.bin") as f:
        chunks = []
        while chunk := f.read(MiB + 3):
            chunks.append(chunk)
    assert b"".join(chunks) == data
    assert fs.stats()["store_requests"]["GetObject"] == 5  # ceil(23 MiB / 5 MiB) ranged GETs
    fs.wait_fetches()
    entry = fs.read_path.cached(bucket, "big.bin")
    assert entry is not None and entry.meta.size == len(data)


def test_cached_digest_matches_the_bytes(make_fs: Any, s3_client: Any, bucket: str) -> None:
    import xxhash

    data = os.urandom(12 * MiB + 1)
    s3_client.put_object(Bucket=bucket, Key="d.bin", Body=data)
    fs = make_fs(range_size=5 * MiB, fetch_concurrency=3)
    fs.cat_file(f"{bucket}/d.bin")
    fs.wait_fetches()
    entry = fs.read_path.cached(bucket, "d.bin")
    assert entry is not None
    assert entry.meta.digest == xxhash.xxh3_64(data).hexdigest()


def test_ranges_seek_and_readline(make_fs: Any, s3_client: Any, bucket: str) -> None:
    data = b"".join(f"line {i}\n".encode() for i in range(20000))
    s3_client.put_object(Bucket=bucket, Key="t.txt", Body=data)
    fs = make_fs()
    path = f"{bucket}/t.txt"

    assert fs.cat_file(path, start=10, end=50) == data[10:50]
    assert fs.cat_file(path, start=-30) == data[-30:]
    assert fs.cat_file(path, start=5, end=-5) == data[5:-5]
    with fs.open(path) as f:
        f.seek(len(data) - 8)
        assert f.read() == data[-8:]
        f.seek(0)
        assert f.readline() == b"line 0\n"
        assert f.tell() == 7
    with fs.open(path, "r") as text:
        assert text.readlines()[19999] == "line 19999\n"


def test_empty_object(make_fs: Any, s3_client: Any, bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="empty", Body=b"")
    fs = make_fs()
    assert fs.cat_file(f"{bucket}/empty") == b""
    assert fs.cat_file(f"{bucket}/empty") == b""
    stats = fs.stats()
    assert stats["hits"] + stats["fetches_joined"] == 1


def test_chained_url_with_s3_options(s3: Any, s3_client: Any, bucket: str, tmp_path: Any) -> None:
    data = os.urandom(MiB)
    s3_client.put_object(Bucket=bucket, Key="x/y.bin", Body=data)
    url = f"tiercache::s3://{bucket}/x/y.bin"
    options = {"s3": s3.target_options(), "tiercache": {"local_dir": str(tmp_path / "t")}}

    with fsspec.open(url, "rb", **options) as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    fs, path = fsspec.core.url_to_fs(url, **options)
    assert isinstance(fs, TierCacheFileSystem)
    assert path == f"{bucket}/x/y.bin"
    fs.wait_fetches()
    assert fs.is_cached(path)


def test_standalone_protocol_url(s3: Any, s3_client: Any, bucket: str, tmp_path: Any) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"payload")
    fs = fsspec.filesystem(
        "tiercache", local_dir=str(tmp_path / "t"), target_options=s3.target_options()
    )
    assert fs.cat(f"tiercache://{bucket}/k") == b"payload"
    assert fs.cat(f"s3://{bucket}/k") == b"payload"


def test_get_downloads_through_the_cache(
    make_fs: Any, s3_client: Any, bucket: str, tmp_path: Any
) -> None:
    data = os.urandom(2 * MiB)
    s3_client.put_object(Bucket=bucket, Key="g/a.bin", Body=data)
    s3_client.put_object(Bucket=bucket, Key="g/sub/b.bin", Body=b"b")
    fs = make_fs()
    dest = tmp_path / "out"
    fs.get(f"{bucket}/g/", str(dest), recursive=True)
    assert (dest / "a.bin").read_bytes() == data
    assert (dest / "sub" / "b.bin").read_bytes() == b"b"
    fs.wait_fetches()
    assert fs.is_cached(f"{bucket}/g/a.bin")


def test_listing_info_glob_exists(make_fs: Any, s3_client: Any, bucket: str) -> None:
    for key in ("a", "a/b", "a/c/d.bin", "e.txt"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    fs = make_fs()

    assert fs.ls(bucket, detail=False) == [f"{bucket}/a", f"{bucket}/a", f"{bucket}/e.txt"]
    assert fs.ls(f"{bucket}/a", detail=False) == [f"{bucket}/a/b", f"{bucket}/a/c"]
    assert fs.find(bucket) == [
        f"{bucket}/a",
        f"{bucket}/a/b",
        f"{bucket}/a/c/d.bin",
        f"{bucket}/e.txt",
    ]
    assert fs.glob(f"{bucket}/a/**/*.bin") == [f"{bucket}/a/c/d.bin"]
    assert fs.info(f"{bucket}/a")["type"] == "file"  # an object named "a" beside prefix "a/"
    assert fs.info(f"{bucket}/a/c")["type"] == "directory"
    assert fs.info(f"{bucket}/e.txt")["size"] == 5
    assert fs.exists(f"{bucket}/a/c/d.bin")
    assert not fs.exists(f"{bucket}/nope")
    assert fs.cat(f"{bucket}/a") == b"a"
    assert fs.cat(f"{bucket}/a/b") == b"a/b"


def test_missing_object_and_bucket_raise_file_not_found(make_fs: Any, bucket: str) -> None:
    fs = make_fs()
    with pytest.raises(FileNotFoundError):
        fs.open(f"{bucket}/missing")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("tc-no-such-bucket-4711/key")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{bucket}/missing")
    with pytest.raises(FileNotFoundError):
        fs.ls("tc-no-such-bucket-4711")
    assert fs.stats()["fetch_errors"] == 2


def test_fsspec_open_of_many_urls_shares_one_cache_runtime(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Any
) -> None:
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"s/{i}", Body=b"%d" % i)
    options = {"s3": s3.target_options(), "tiercache": {"local_dir": str(tmp_path / "t")}}
    urls = [f"tiercache::s3://{bucket}/s/{i}" for i in range(3)]
    for url in urls:
        with fsspec.open(url, "rb", **options) as f:
            f.read()
    first, _ = fsspec.core.url_to_fs(urls[0], **options)
    last, _ = fsspec.core.url_to_fs(urls[2], **options)
    assert first.read_path is last.read_path  # one single-flight table and one set of counters
    assert first.stats()["misses"] == 3


def test_forked_child_rebuilds_its_s3_client(make_fs: Any, s3_client: Any, bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="p", Body=b"parent")
    s3_client.put_object(Bucket=bucket, Key="c", Body=b"child")
    fs = make_fs()
    assert fs.cat(f"{bucket}/p") == b"parent"  # the parent's client now exists
    parent_client = fs.store.client()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            ok = fs.store.client() is not parent_client and fs.cat(f"{bucket}/c") == b"child"
            os.write(write_end, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    assert os.read(read_end, 1) == b"1"
    os.waitpid(pid, 0)
