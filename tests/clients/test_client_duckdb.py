"""DuckDB through tiercache: register_filesystem, read_parquet('tiercache://…'), COPY … TO.

DuckDB hands paths of a registered fsspec filesystem's protocol to it (``tiercache://bucket/
key``). A ``COPY … TO`` with ``PARTITION_BY`` lists its target directory first and fails while
that does not exist yet, as it does on s3fs: give it ``OVERWRITE_OR_IGNORE``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from client_helpers import CONSISTENCY, assert_warm, filesystem, requests_during

ROWS = "SELECT range AS id, range % 4 AS part, 'row-' || range AS name FROM range(1000)"


def _connect(fs: Any) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.register_filesystem(fs)
    return con


def _queries(bucket: str) -> list[str]:
    root = f"tiercache://{bucket}"
    return [
        f"SELECT count(*), sum(id), max(name) FROM read_parquet('{root}/one.parquet')",
        f"SELECT part, count(*), sum(id) FROM read_parquet('{root}/parts/*/*.parquet',"
        " hive_partitioning = true) WHERE part >= 2 GROUP BY part ORDER BY part",
        f"SELECT count(*), min(id) FROM read_csv('{root}/one.csv') WHERE id % 10 = 0",
    ]


EXPECTED = [
    [(1000, 499500, "row-999")],
    [(2, 250, sum(range(2, 1000, 4))), (3, 250, sum(range(3, 1000, 4)))],
    [(100, 0)],
]


@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_copy_to_then_queries_by_tiercache_url(
    s3: Any, s3_client: Any, proxy: Any, bucket: str, tmp_path: Path, consistency: str
) -> None:
    writer = _connect(filesystem(s3, proxy, tmp_path / "writer", write_mode="through"))
    root = f"tiercache://{bucket}"
    writer.execute(f"COPY ({ROWS}) TO '{root}/one.parquet' (FORMAT parquet)")
    writer.execute(f"COPY ({ROWS}) TO '{root}/one.csv' (FORMAT csv, HEADER)")
    writer.execute(
        f"COPY ({ROWS}) TO '{root}/parts' (FORMAT parquet, PARTITION_BY (part),"
        " OVERWRITE_OR_IGNORE)"
    )
    keys = {o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert {"one.parquet", "one.csv"} <= keys
    assert {k.split("/")[1] for k in keys if k.startswith("parts/")} == {
        f"part={i}" for i in range(4)
    }

    fs = filesystem(s3, proxy, tmp_path / "tier", **CONSISTENCY[consistency])
    con = _connect(fs)

    def run() -> list[list[tuple[Any, ...]]]:
        return [con.sql(query).fetchall() for query in _queries(bucket)]

    proxy.log.clear()  # the writer's requests went through the proxy too
    assert run() == EXPECTED
    assert proxy.count("GET", "/one.parquet") == 1 and proxy.count("GET", "/one.csv") == 1
    # Pruned by the filter, part=1 is never fetched (DuckDB reads the schema from part=0).
    assert proxy.count("GET", "/parts/part%3D1/") == 0
    fs.wait_fetches()
    results, warm = requests_during(proxy, run)
    assert results == EXPECTED
    assert_warm(warm, consistency)
