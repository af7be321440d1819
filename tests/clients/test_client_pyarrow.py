"""pyarrow through tiercache: ``pyarrow.dataset`` on ``PyFileSystem(FSSpecHandler(fs))``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from client_helpers import CONSISTENCY, assert_warm, filesystem, requests_during

TABLE = pa.table(
    {
        "year": pa.array([2021, 2022, 2023, 2024] * 50, pa.int32()),
        "value": pa.array(range(200), pa.int64()),
        "name": [f"v{i}" for i in range(200)],
    }
)


def _arrow_fs(fs: Any) -> pafs.PyFileSystem:
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def _write(s3: Any, proxy: Any, tier: Path, root: str) -> None:
    """``write_dataset`` through tiercache, hive-partitioned by year, straight to the store."""
    writer = filesystem(s3, proxy, tier, write_mode="through")
    ds.write_dataset(
        TABLE,
        root,
        filesystem=_arrow_fs(writer),
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("year", pa.int32())]), flavor="hive"),
    )


def _expected(since: int) -> pa.Table:
    rows = [r for r in TABLE.to_pylist() if r["year"] >= since]
    return pa.Table.from_pylist(rows, schema=TABLE.schema).sort_by("value")


@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_write_dataset_then_a_filtered_partitioned_read(
    s3: Any, s3_client: Any, proxy: Any, bucket: str, tmp_path: Path, consistency: str
) -> None:
    root = f"{bucket}/events"
    _write(s3, proxy, tmp_path / "writer", root)
    keys = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == [f"events/year={y}/part-0.parquet" for y in (2021, 2022, 2023, 2024)]

    fs = filesystem(s3, proxy, tmp_path / "tier", **CONSISTENCY[consistency])

    def read() -> pa.Table:
        dataset = ds.dataset(root, filesystem=_arrow_fs(fs), format="parquet", partitioning="hive")
        table = dataset.to_table(columns=["year", "value", "name"], filter=ds.field("year") >= 2023)
        return table.sort_by("value")

    proxy.log.clear()  # the writer's requests went through the proxy too
    assert read().equals(_expected(2023))
    # Pruned by the filter, 2022's file is never fetched (pyarrow reads the schema from the
    # first file, 2021's); each file read is fetched once.
    fetched = {y: proxy.count("GET", f"/year%3D{y}/") for y in (2022, 2023, 2024)}
    assert fetched == {2022: 0, 2023: 1, 2024: 1}
    fs.wait_fetches()
    again, warm = requests_during(proxy, read)
    assert again.equals(_expected(2023))
    assert_warm(warm, consistency)


@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_a_parquet_file_read_by_pyarrow_parquet(
    s3: Any, proxy: Any, bucket: str, tmp_path: Path, consistency: str
) -> None:
    writer = filesystem(s3, proxy, tmp_path / "writer", write_mode="through")
    pq.write_table(TABLE, f"{bucket}/one.parquet", filesystem=_arrow_fs(writer))
    fs = filesystem(s3, proxy, tmp_path / "tier", **CONSISTENCY[consistency])
    arrow_fs = _arrow_fs(fs)
    proxy.log.clear()
    assert pq.read_table(f"{bucket}/one.parquet", filesystem=arrow_fs).equals(TABLE)
    assert proxy.count("GET", "/one.parquet") == 1
    fs.wait_fetches()
    again, warm = requests_during(
        proxy, lambda: pq.read_table(f"{bucket}/one.parquet", filesystem=arrow_fs)
    )
    assert again.equals(TABLE)
    assert_warm(warm, consistency)
