"""zarr v3 over the asyncio face on the real S3 server: chunks come through the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

zarr = pytest.importorskip("zarr", reason="zarr is not installed (the test extra installs it)")
np = pytest.importorskip("numpy")

from zarr.storage import FsspecStore  # noqa: E402

from tiercache import TierCacheFileSystem  # noqa: E402


def _store(s3: Any, bucket: str, local_dir: Path) -> FsspecStore:
    fs = TierCacheFileSystem(
        asynchronous=True,  # what zarr expects: it awaits the methods on its own loop
        target_options=s3.target_options(),
        local_dir=str(local_dir),
        consistency="immutable",
        skip_instance_cache=True,
    )
    return FsspecStore(fs, path=f"{bucket}/arr.zarr")


def test_zarr_reads_chunks_through_the_cache(s3: Any, bucket: str, tmp_path: Path) -> None:
    data = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    written = zarr.create_array(
        _store(s3, bucket, tmp_path / "w"), shape=data.shape, chunks=(16, 16), dtype="float32"
    )
    written[:] = data

    reader = _store(s3, bucket, tmp_path / "r")
    fs: TierCacheFileSystem = reader.fs
    opened = zarr.open_array(reader, mode="r")
    assert np.array_equal(opened[:], data)
    gets = fs.stats()["store_requests"]["GetObject"]
    assert gets >= 16  # 16 chunks (and the metadata) came from the store once
    assert np.array_equal(opened[:], data)
    assert fs.stats()["store_requests"]["GetObject"] == gets  # the second pass: all hits
    assert fs.stats()["hits"] >= 16
