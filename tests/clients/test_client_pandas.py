"""pandas through tiercache: by ``tiercache::s3://`` URL string and by filesystem object."""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from client_helpers import (
    CONSISTENCY,
    assert_warm,
    chained_options,
    filesystem,
    requests_during,
    settle,
    writer_options,
)

FRAME = pd.DataFrame({"a": range(200), "b": [f"row-{i}" for i in range(200)]})

# How pandas users write and read each format by URL: (writer, reader) taking (url, options).
Io = Callable[[str, dict[str, Any]], Any]
FORMATS: dict[str, tuple[Io, Io]] = {
    "parquet": (
        lambda url, so: FRAME.to_parquet(url, storage_options=so),
        lambda url, so: pd.read_parquet(url, storage_options=so),
    ),
    "csv": (
        lambda url, so: FRAME.to_csv(url, index=False, storage_options=so),
        lambda url, so: pd.read_csv(url, storage_options=so),
    ),
    "json": (
        lambda url, so: FRAME.to_json(url, orient="records", lines=True, storage_options=so),
        lambda url, so: pd.read_json(url, orient="records", lines=True, storage_options=so),
    ),
}


def _partitioned() -> pd.DataFrame:
    return FRAME.assign(part=FRAME["a"] % 4)


def _check_partitioned(read: pd.DataFrame) -> None:
    got = read.assign(part=read["part"].astype("int64")).sort_values("a", ignore_index=True)
    pd.testing.assert_frame_equal(got[["a", "b", "part"]], _partitioned())


@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_format_by_chained_url(
    s3: Any, s3_client: Any, proxy: Any, bucket: str, tmp_path: Path, fmt: str, consistency: str
) -> None:
    write, read = FORMATS[fmt]
    url = f"tiercache::s3://{bucket}/tables/frame.{fmt}"
    write(url, writer_options(s3, tmp_path / "writer"))
    assert s3_client.head_object(Bucket=bucket, Key=f"tables/frame.{fmt}")["ContentLength"] > 0
    options = chained_options(s3, proxy, tmp_path / "tier", **CONSISTENCY[consistency])
    pd.testing.assert_frame_equal(read(url, options), FRAME)
    assert proxy.count("GET", f"/tables/frame.{fmt}") == 1  # the cold read came from the store
    settle(url, options)
    again, warm = requests_during(proxy, lambda: read(url, options))
    pd.testing.assert_frame_equal(again, FRAME)
    assert_warm(warm, consistency)


@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_a_partitioned_parquet_dataset_by_chained_url(
    s3: Any, s3_client: Any, proxy: Any, bucket: str, tmp_path: Path, consistency: str
) -> None:
    url = f"tiercache::s3://{bucket}/dataset"
    _partitioned().to_parquet(
        url, partition_cols=["part"], storage_options=writer_options(s3, tmp_path / "writer")
    )
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="dataset/")["Contents"]
    assert {o["Key"].split("/")[1] for o in listed} == {f"part={i}" for i in range(4)}
    options = chained_options(s3, proxy, tmp_path / "tier", **CONSISTENCY[consistency])
    _check_partitioned(pd.read_parquet(url, storage_options=options))
    settle(url, options)
    again, warm = requests_during(proxy, lambda: pd.read_parquet(url, storage_options=options))
    _check_partitioned(again)
    assert_warm(warm, consistency)


@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_every_format_by_filesystem_object(
    s3: Any, proxy: Any, bucket: str, tmp_path: Path, consistency: str
) -> None:
    writer = filesystem(s3, proxy, tmp_path / "writer", write_mode="through")
    FRAME.to_parquet(f"{bucket}/fs/frame.parquet", filesystem=writer)
    with writer.open(f"{bucket}/fs/frame.csv", "wb") as f:
        FRAME.to_csv(f, index=False)
    with writer.open(f"{bucket}/fs/frame.json", "wb") as f:
        FRAME.to_json(f, orient="records", lines=True)
    _partitioned().to_parquet(f"{bucket}/fs/dataset", partition_cols=["part"], filesystem=writer)

    fs = filesystem(s3, proxy, tmp_path / "tier", **CONSISTENCY[consistency])

    def read_all() -> list[pd.DataFrame]:
        frames = [pd.read_parquet(f"{bucket}/fs/frame.parquet", filesystem=fs)]
        with fs.open(f"{bucket}/fs/frame.csv") as f:
            frames.append(pd.read_csv(f))
        with fs.open(f"{bucket}/fs/frame.json") as f:
            frames.append(pd.read_json(f, orient="records", lines=True))
        frames.append(pd.read_parquet(f"{bucket}/fs/dataset", filesystem=fs))
        return frames

    def check(frames: list[pd.DataFrame]) -> None:
        for frame in frames[:3]:
            pd.testing.assert_frame_equal(frame, FRAME)
        _check_partitioned(frames[3])

    proxy.log.clear()  # the writer's requests went through the proxy too
    check(read_all())
    assert proxy.count("GET", "/fs/frame.") == 3
    fs.wait_fetches()
    frames, warm = requests_during(proxy, read_all)
    check(frames)
    assert_warm(warm, consistency)


def test_to_csv_gz_takes_an_explicit_compression(
    s3: Any, s3_client: Any, proxy: Any, bucket: str, tmp_path: Path
) -> None:
    # pandas infers compression from the chained URL's first part ("tiercache"), so the
    # extension ".gz" alone writes plain text: compression must be given (README, pandas).
    url = f"tiercache::s3://{bucket}/out/frame.csv.gz"
    FRAME.to_csv(
        url, index=False, compression="gzip", storage_options=writer_options(s3, tmp_path / "w")
    )
    body = s3_client.get_object(Bucket=bucket, Key="out/frame.csv.gz")["Body"].read()
    assert body[:2] == b"\x1f\x8b"  # the gzip magic
    pd.testing.assert_frame_equal(pd.read_csv(io.BytesIO(gzip.decompress(body))), FRAME)
    options = chained_options(s3, proxy, tmp_path / "tier", consistency="immutable")
    read = pd.read_csv(url, compression={"method": "gzip"}, storage_options=options)
    pd.testing.assert_frame_equal(read, FRAME)
