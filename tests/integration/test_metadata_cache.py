"""Metadata from the cache, counted at the store (fault proxy): info, listings, misses, fills."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.proxy import FaultProxy
from support.servers_under_test import S3Endpoint

from tiercache import TierCacheFileSystem

Build = Callable[..., TierCacheFileSystem]
LIST = "list-type=2"  # ListObjectsV2 is a GET on the bucket with this query
# Long beside the ~15 ms the asks take, so that a stalled CI machine cannot outlast it (at
# 1 s, one clean-clone run saw the ttl pass between the fetch and the third round of asks).
TTL = 3.0


@pytest.fixture
def counted_fs(s3: S3Endpoint, proxy: FaultProxy, tmp_path: Path) -> Build:
    """A filesystem whose store requests all pass through the counting proxy."""

    def build(**options: Any) -> TierCacheFileSystem:
        options.setdefault("local_dir", str(tmp_path / "tier"))
        return TierCacheFileSystem(
            target_options={**s3.target_options(), "endpoint_url": proxy.url},
            skip_instance_cache=True,
            **options,
        )

    return build


def _ask_all(fs: TierCacheFileSystem, path: str) -> None:
    assert fs.info(path)["size"] == 5
    assert fs.exists(path)
    assert not fs.isdir(path)
    assert fs.size(path) == 5


def test_ttl_serves_info_of_a_cached_object_unasked_until_the_ttl_passes_then_lists(
    counted_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"hello")
    fs = counted_fs(consistency="ttl", ttl=TTL)
    assert fs.cat(f"{bucket}/k") == b"hello"
    fs.wait_fetches()
    for _ in range(3):
        _ask_all(fs, f"{bucket}/k")
    assert proxy.count("HEAD") == 0
    before = proxy.count()
    time.sleep(TTL + 0.1)
    _ask_all(fs, f"{bucket}/k")
    # Past the ttl: asked again, by one LIST of its prefix (which vouches for every cached
    # object below it), then kept again.
    assert proxy.count("HEAD") == 0
    assert proxy.count() - before == 1
    assert proxy.count("GET", path_contains="list-type=2") == 1


def test_ttl_keeps_the_head_of_an_object_not_in_the_tier(
    counted_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"hello")
    fs = counted_fs(consistency="ttl", ttl=TTL)
    for _ in range(3):
        _ask_all(fs, f"{bucket}/k")
    assert proxy.count("HEAD") == 1
    assert not fs.is_cached(f"{bucket}/k")
    time.sleep(TTL + 0.1)
    _ask_all(fs, f"{bucket}/k")
    assert proxy.count("HEAD") == 2


def test_immutable_never_asks_again(
    counted_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="read", Body=b"hello")
    s3_client.put_object(Bucket=bucket, Key="headed", Body=b"hello")
    fs = counted_fs(consistency="immutable")
    fs.cat(f"{bucket}/read")
    fs.wait_fetches()
    for _ in range(3):
        _ask_all(fs, f"{bucket}/read")
        _ask_all(fs, f"{bucket}/headed")
    assert proxy.count("HEAD") == 1  # "headed", once


def test_always_sends_a_head_on_every_call(
    counted_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"hello")
    fs = counted_fs(consistency="always")
    fs.cat(f"{bucket}/k")
    fs.wait_fetches()
    before = proxy.count("HEAD")
    for _ in range(3):
        assert fs.info(f"{bucket}/k")["size"] == 5
    assert proxy.count("HEAD") == before + 3
    for _ in range(2):
        fs.ls(bucket)
    assert proxy.count("GET", LIST) == 2


def test_ls_is_kept_and_this_hosts_writes_and_deletes_show_at_once(
    counted_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    for name in ("a", "b"):
        s3_client.put_object(Bucket=bucket, Key=f"d/{name}", Body=b"x")
    fs = counted_fs(consistency="ttl", ttl=600, write_mode="through")
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/a", f"{bucket}/d/b"]
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/a", f"{bucket}/d/b"]
    assert proxy.count("GET", LIST) == 1
    assert fs.info(f"{bucket}/d/a")["size"] == 1  # from the listing: no HEAD
    assert proxy.count("HEAD") == 0

    fs.pipe_file(f"{bucket}/d/c", b"new")
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/a", f"{bucket}/d/b", f"{bucket}/d/c"]
    fs.rm(f"{bucket}/d/a")
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/b", f"{bucket}/d/c"]
    assert not fs.exists(f"{bucket}/d/a")
    assert fs.find(f"{bucket}/d") == [f"{bucket}/d/b", f"{bucket}/d/c"]
    fs.mv(f"{bucket}/d/b", f"{bucket}/e/b")
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/c"]
    assert fs.isdir(f"{bucket}/e") and fs.find(f"{bucket}/e") == [f"{bucket}/e/b"]
    assert fs.find(f"{bucket}/d") == [f"{bucket}/d/c"]
    lists = proxy.count("GET", LIST)
    assert fs.find(f"{bucket}/d") == [f"{bucket}/d/c"]
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/c"]
    assert proxy.count("GET", LIST) == lists  # both kept again


def test_a_write_behind_is_listed_while_pending_and_after_its_upload(
    counted_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="ckpt/old", Body=b"x")
    fs = counted_fs(consistency="ttl", ttl=600, write_mode="behind")
    assert fs.ls(f"{bucket}/ckpt", detail=False) == [f"{bucket}/ckpt/old"]
    with fs.open(f"{bucket}/ckpt/new", "wb") as f:
        f.write(b"pending")
    rows = {r["name"]: r for r in fs.ls(f"{bucket}/ckpt")}
    assert rows[f"{bucket}/ckpt/new"]["size"] == 7
    assert fs.info(f"{bucket}/ckpt/new")["size"] == 7
    fs.flush(timeout=60)
    for _ in range(2):
        names = fs.ls(f"{bucket}/ckpt", detail=False)
        assert names == [f"{bucket}/ckpt/new", f"{bucket}/ckpt/old"]
        assert fs.find(f"{bucket}/ckpt") == names
    assert fs.cat(f"{bucket}/ckpt/new") == b"pending"


def test_a_miss_is_kept_until_this_host_writes_the_key(
    counted_fs: Build, proxy: FaultProxy, bucket: str
) -> None:
    fs = counted_fs(consistency="ttl", ttl=600, write_mode="through")
    path = f"{bucket}/store.zarr/.zmetadata"
    for _ in range(3):
        with pytest.raises(FileNotFoundError):
            fs.cat_file(path)
    assert proxy.count("GET", "/.zmetadata") == 1
    for _ in range(3):
        assert not fs.exists(path)
    assert proxy.count("HEAD") == 0  # the GET said there is no object: only the LIST asked
    assert proxy.count("GET", LIST) == 1
    fs.pipe_file(path, b"{}")
    assert fs.exists(path)
    assert fs.cat_file(path) == b"{}"
    assert proxy.count("GET", "/.zmetadata") == 1  # the write left it in the tier


def test_a_missing_key_becomes_a_directory_once_this_host_writes_below_it(
    counted_fs: Build, proxy: FaultProxy, bucket: str
) -> None:
    fs = counted_fs(consistency="immutable", write_mode="behind")
    for _ in range(2):
        assert not fs.exists(f"{bucket}/run")
    assert (proxy.count("HEAD"), proxy.count("GET", LIST)) == (1, 1)
    with fs.open(f"{bucket}/run/step-1", "wb") as f:
        f.write(b"w")
    assert fs.isdir(f"{bucket}/run")  # pending below it
    fs.flush(timeout=60)
    assert fs.isdir(f"{bucket}/run")  # uploaded: the store says so too


@pytest.mark.parametrize("write_mode", ["behind", "through"])
def test_pipe_and_put_leave_the_object_in_the_tier(
    counted_fs: Build, proxy: FaultProxy, bucket: str, tmp_path: Path, write_mode: str
) -> None:
    fs = counted_fs(consistency="ttl", ttl=600, write_mode=write_mode)
    local = tmp_path / "up.bin"
    local.write_bytes(b"put bytes" * 1000)
    fs.pipe_file(f"{bucket}/piped", b"piped bytes")
    fs.put_file(str(local), f"{bucket}/put.bin")
    assert proxy.count("PUT") == 2  # in the store when they return, as before
    assert fs.cat_file(f"{bucket}/piped") == b"piped bytes"
    assert fs.cat_file(f"{bucket}/put.bin") == local.read_bytes()
    assert fs.is_cached(f"{bucket}/piped") and fs.is_cached(f"{bucket}/put.bin")
    assert proxy.count("GET", "/piped") + proxy.count("GET", "/put.bin") == 0
    fs.pipe_file(f"{bucket}/piped", b"second")
    assert fs.cat_file(f"{bucket}/piped") == b"second"
    assert proxy.count("GET", "/piped") == 0


def _other_process(options: dict[str, Any], local_dir: str, bucket: str, out: Any) -> None:
    fs = TierCacheFileSystem(
        target_options=options, local_dir=local_dir, consistency="ttl", ttl=600
    )
    info = fs.info(f"{bucket}/k")
    names = fs.ls(bucket, detail=False)
    fs.pipe_file(f"{bucket}/from-child", b"child")
    out.put((info["size"], names, fs.stats()["store_requests"]))


def test_processes_on_one_local_dir_share_what_they_learnt(
    counted_fs: Build,
    s3: S3Endpoint,
    proxy: FaultProxy,
    s3_client: Any,
    bucket: str,
    tmp_path: Path,
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"hello")
    fs = counted_fs(consistency="ttl", ttl=600)
    assert fs.info(f"{bucket}/k")["size"] == 5
    assert fs.ls(bucket, detail=False) == [f"{bucket}/k"]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    options = {**s3.target_options(), "endpoint_url": proxy.url}
    child = ctx.Process(target=_other_process, args=(options, str(tmp_path / "tier"), bucket, out))
    child.start()
    size, names, requests = out.get(timeout=120)
    child.join(timeout=60)
    assert (size, names) == (5, [f"{bucket}/k"])
    assert "HeadObject" not in requests and "ListObjectsV2" not in requests
    assert (proxy.count("HEAD"), proxy.count("GET", LIST)) == (1, 1)
    # The child's write invalidated this process's kept listing too.
    assert fs.ls(bucket, detail=False) == [f"{bucket}/from-child", f"{bucket}/k"]
    assert proxy.count("GET", LIST) == 2
