"""polars through tiercache, on file objects: ``pl.read_parquet(fs.open(path))`` and the like.

This is the supported form. polars reads URL strings with its own object-store code (s3://,
gs://, az://, http(s)://, hf://), not through fsspec, and takes any other string for a local
path: ``"tiercache::s3://bucket/key"`` and ``"tiercache://bucket/key"`` are "no such file".
It also refuses storage options nested per protocol as fsspec wants them, and its error
message shows their values, credentials included. Hand polars a file object of the
filesystem instead, for reading (``read_*``, ``scan_*``) and for writing (``write_*``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from client_helpers import CONSISTENCY, assert_warm, filesystem, requests_during
from polars.testing import assert_frame_equal

FRAME = pl.DataFrame({"a": list(range(300)), "b": [f"row-{i}" for i in range(300)]})

# How each format is written to and read from a file object.
FORMATS: dict[str, tuple[Callable[[Any], None], Callable[[Any], pl.DataFrame]]] = {
    "parquet": (FRAME.write_parquet, pl.read_parquet),
    "csv": (FRAME.write_csv, pl.read_csv),
    "ndjson": (FRAME.write_ndjson, pl.read_ndjson),
    "ipc": (FRAME.write_ipc, pl.read_ipc),
}


@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_every_format_on_file_objects(
    s3: Any, s3_client: Any, proxy: Any, bucket: str, tmp_path: Path, consistency: str
) -> None:
    writer = filesystem(s3, proxy, tmp_path / "writer", write_mode="through")
    for fmt, (write, _) in FORMATS.items():
        with writer.open(f"{bucket}/frames/frame.{fmt}", "wb") as f:
            write(f)
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="frames/")["Contents"]
    assert len(listed) == len(FORMATS)

    fs = filesystem(s3, proxy, tmp_path / "tier", **CONSISTENCY[consistency])

    def read_all() -> dict[str, pl.DataFrame]:
        frames = {}
        for fmt, (_, read) in FORMATS.items():
            with fs.open(f"{bucket}/frames/frame.{fmt}") as f:
                frames[fmt] = read(f)
        with fs.open(f"{bucket}/frames/frame.parquet") as f:  # lazily, with a filter
            frames["scan"] = pl.scan_parquet(f).filter(pl.col("a") >= 250).collect()
        return frames

    def check(frames: dict[str, pl.DataFrame]) -> None:
        for fmt in FORMATS:
            assert_frame_equal(frames[fmt], FRAME)
        assert_frame_equal(frames["scan"], FRAME.filter(pl.col("a") >= 250))

    proxy.log.clear()  # the writer's requests went through the proxy too
    check(read_all())
    assert proxy.count("GET", "/frames/frame.") == len(FORMATS)  # each object fetched once
    fs.wait_fetches()
    frames, warm = requests_during(proxy, read_all)
    check(frames)
    assert_warm(warm, consistency)
