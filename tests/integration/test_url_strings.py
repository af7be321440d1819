"""Clients that know tiercache only by URL string (fsspec, zarr, xarray, HF-style rebuilds)."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import fsspec.core
import pytest

from tiercache import TierCacheFileSystem
from tiercache.async_api import AsyncTierCacheFileSystem


def _cache_options(tier: Path, **extra: Any) -> dict[str, Any]:
    return {"local_dir": str(tier), "skip_instance_cache": True, **extra}


def _storage_options(s3: Any, tier: Path, **extra: Any) -> dict[str, Any]:
    """Options of a chained URL, as a user hands them to zarr, xarray or fsspec.open."""
    return {"s3": s3.target_options(), "tiercache": _cache_options(tier, **extra)}


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_fsspec_open_reads_and_writes_by_chained_url(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    blob = os.urandom(100_000)
    s3_client.put_object(Bucket=bucket, Key="in/obj", Body=blob)
    options = _storage_options(s3, tmp_path / "tier", write_mode="through")
    opened = fsspec.open(f"tiercache::s3://{bucket}/in/obj", **options)
    with opened as f:
        assert f.read() == blob
    assert isinstance(opened.fs, TierCacheFileSystem)
    opened.fs.wait_fetches()
    assert opened.fs.is_cached(f"{bucket}/in/obj")
    with fsspec.open(f"tiercache::s3://{bucket}/out/obj", "wb", **options) as f:
        f.write(b"written by URL")
    assert s3_client.get_object(Bucket=bucket, Key="out/obj")["Body"].read() == b"written by URL"


def test_a_plain_tiercache_url_takes_the_store_options_as_s3(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="obj", Body=b"plain url")
    with fsspec.open(f"tiercache://{bucket}/obj", **_storage_options(s3, tmp_path)) as f:
        assert f.read() == b"plain url"


def test_the_async_face_inside_an_asyncio_loop(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    blob = os.urandom(300_000)
    s3_client.put_object(Bucket=bucket, Key="obj", Body=blob)

    async def program() -> tuple[bytes, bytes, dict[str, Any], dict[str, Any]]:
        fs = fsspec.filesystem(
            "tiercache",
            asynchronous=True,
            target_options=s3.target_options(),
            **_cache_options(tmp_path / "tier", consistency="immutable"),
        )
        first = await fs._cat_file(f"{bucket}/obj")
        await asyncio.to_thread(fs.wait_fetches)
        part = await fs._cat_file(f"s3://{bucket}/obj", start=10, end=20)
        return first, part, await fs._info(f"{bucket}/obj"), fs.stats()

    first, part, info, stats = asyncio.run(program())
    assert first == blob and part == blob[10:20]
    assert info["size"] == len(blob) and info["cached"] is True
    assert stats["store_requests"]["GetObject"] == 1 and stats["hits"] >= 1


def test_the_former_protocol_name_works_in_a_chained_url(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="obj", Body=b"alias")
    options = {"s3": s3.target_options(), "tiercache-async": _cache_options(tmp_path)}
    fs, path = fsspec.core.url_to_fs(f"tiercache-async::s3://{bucket}/obj", **options)
    assert isinstance(fs, AsyncTierCacheFileSystem) and path == f"{bucket}/obj"
    with fsspec.open(f"tiercache-async::s3://{bucket}/obj", **options) as f:
        assert f.read() == b"alias"


def test_foreign_keys_are_ignored_and_typos_are_named(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="obj", Body=b"tolerant")
    options = _storage_options(s3, tmp_path / "tier")
    # What HF datasets' DownloadConfig adds to the caller's storage options.
    options["hf"] = {"endpoint": "https://huggingface.co", "token": None}
    options["s3"] = {**options["s3"], "regoin_name": "eu-1"}
    with pytest.warns(UserWarning) as caught:
        opened = fsspec.open(f"tiercache::s3://{bucket}/obj", **options)
        with opened as f:
            assert f.read() == b"tolerant"
    messages = sorted(str(w.message) for w in caught)
    assert any("'regoin_name'" in m and "'region_name'" in m for m in messages), messages
    # A misspelt tiercache option would set nothing: it is an error naming the one meant.
    misspelt = _storage_options(s3, tmp_path / "tier", consistancy="immutable")
    with pytest.raises(TypeError, match=r"'consistancy'.*'consistency'"):
        fsspec.open(f"tiercache::s3://{bucket}/obj", **misspelt).open()


@pytest.mark.usefixtures("no_warnings")
@pytest.mark.parametrize("store_options_also_flat", [False, True])
def test_a_chained_url_rebuilt_with_the_filesystems_own_options(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, store_options_also_flat: bool
) -> None:
    # HF datasets builds the filesystem from the URL, then builds it again from the URL with
    # options in which the s3 level holds the tiercache filesystem's storage options: ``fo``,
    # ``target_protocol`` and ``target_options`` (where the store's options are).
    s3_client.put_object(Bucket=bucket, Key="data/train.parquet", Body=b"PAR1 rows PAR1")
    url = f"tiercache::s3://{bucket}/data/train.parquet"
    fs, path = fsspec.core.url_to_fs(url, **_storage_options(s3, tmp_path / "tier"))
    assert path == f"{bucket}/data/train.parquet"
    inner = dict(fs.storage_options)
    assert {"fo", "target_protocol", "target_options"} <= set(inner)
    if store_options_also_flat:
        inner.update(s3.target_options())
    hf = {"endpoint": "https://huggingface.co", "token": None}
    rebuilt = {"s3": {**inner, "hf": hf}, "tiercache": _cache_options(tmp_path / "t2"), "hf": hf}
    again, _, paths = fsspec.core.get_fs_token_paths(url, storage_options=rebuilt)
    assert paths == [path]
    with again.open(paths[0], "rb") as f:
        assert f.read() == b"PAR1 rows PAR1"
    fs3, path3 = fsspec.core.url_to_fs(url, **rebuilt)
    assert fs3.cat_file(path3) == b"PAR1 rows PAR1"


def test_zarr_group_written_and_read_back_by_url_string(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    zarr = pytest.importorskip("zarr", reason="zarr is not installed (the test extra has it)")
    np = pytest.importorskip("numpy", reason="numpy is not installed (zarr brings it)")
    data = np.arange(32 * 32, dtype="int32").reshape(32, 32)
    url = f"tiercache::s3://{bucket}/x.zarr"
    group = zarr.open_group(url, mode="w", storage_options=_storage_options(s3, tmp_path / "w"))
    group.create_array("a", shape=data.shape, chunks=(8, 8), dtype="int32")[:] = data
    written_fs = group.store.fs
    assert isinstance(written_fs, TierCacheFileSystem) and written_fs.asynchronous
    written_fs.flush(timeout=60)
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="x.zarr/").get("Contents", [])
    assert {"x.zarr/zarr.json", "x.zarr/a/zarr.json"} <= {o["Key"] for o in listed}

    # Read back through a fresh tier, by the URL and by the former protocol name.
    for name, scheme in (("r", "tiercache"), ("r2", "tiercache-async")):
        options = {"s3": s3.target_options(), scheme: _cache_options(tmp_path / name)}
        read = zarr.open_group(f"{scheme}::s3://{bucket}/x.zarr", mode="r", storage_options=options)
        assert np.array_equal(read["a"][:], data)
        assert read.store.fs.stats()["misses"] >= 16  # every chunk came through the cache


def test_xarray_to_zarr_and_open_zarr_by_url_string(s3: Any, bucket: str, tmp_path: Path) -> None:
    xr = pytest.importorskip("xarray", reason="xarray is not installed (the test extra has it)")
    pytest.importorskip("zarr", reason="zarr is not installed (the test extra has it)")
    np = pytest.importorskip("numpy", reason="numpy is not installed (xarray brings it)")
    dataset = xr.Dataset(
        {"temperature": (("time", "site"), np.linspace(0.0, 1.0, 24 * 5).reshape(24, 5))},
        coords={"time": np.arange(24), "site": np.arange(5) * 10},
    )
    url = f"tiercache::s3://{bucket}/weather.zarr"
    writer = _storage_options(s3, tmp_path / "w", write_mode="through")
    dataset.to_zarr(url, mode="w", storage_options=writer, consolidated=False)
    reader = _storage_options(s3, tmp_path / "r", consistency="immutable")
    opened = xr.open_zarr(url, storage_options=reader, consolidated=False)
    xr.testing.assert_identical(opened.load(), dataset)
