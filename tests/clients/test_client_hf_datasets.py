"""Hugging Face ``datasets`` through tiercache: ``load_dataset("parquet", data_files=…)``.

Two forms, as README shows them:
- ``data_files="tiercache::s3://bucket/train/*.parquet"`` with
  ``storage_options={"s3": {...}, "tiercache": {...}}`` (a chained URL) when the dataset is
  downloaded and prepared (``streaming=False``);
- ``data_files="tiercache://bucket/train/*.parquet"`` with
  ``storage_options={"tiercache": {..., "s3": {...}}}`` when streaming. ``datasets`` opens a
  streamed file by splitting its URL at ``::`` and takes a first part without ``://`` for a
  local path, so a chained URL streams nothing ("No such file or directory: 'tiercache'").

Nothing but the local S3 server is reached: the Hub client is offline and every cache is a
temporary directory. ``datasets``' own offline switch (``HF_DATASETS_OFFLINE``) refuses every
remote URL, the S3 server's included, so it is on for streaming only, which it does not stop.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from client_helpers import (
    CONSISTENCY,
    assert_warm,
    chained_options,
    requests_during,
    settle,
    store_options,
)

SHARDS = 3
ROWS = 40  # per shard


@pytest.fixture
def hub_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No request to the Hub, no file outside the test's directory (modules, datasets)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    yield


def _put_shards(s3_client: Any, bucket: str) -> None:
    for shard in range(SHARDS):
        ids = list(range(shard * ROWS, (shard + 1) * ROWS))
        table = pa.table({"id": ids, "text": [f"sample {i}" for i in ids]})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        s3_client.put_object(Bucket=bucket, Key=f"train/part-{shard}.parquet", Body=buf.getvalue())


def _check(rows: list[dict[str, Any]]) -> None:
    assert sorted(r["id"] for r in rows) == list(range(SHARDS * ROWS))
    assert all(r["text"] == f"sample {r['id']}" for r in rows)


@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_load_dataset_by_chained_url(
    s3: Any, s3_client: Any, proxy: Any, bucket: str, tmp_path: Path, consistency: str
) -> None:
    _put_shards(s3_client, bucket)
    url = f"tiercache::s3://{bucket}/train/*.parquet"
    options = chained_options(s3, proxy, tmp_path / "tier", **CONSISTENCY[consistency])

    def load(cache: str) -> list[dict[str, Any]]:
        # A fresh datasets cache each time, or datasets would answer from its own copy.
        split = datasets.load_dataset(
            "parquet",
            data_files=url,
            storage_options=options,
            split="train",
            cache_dir=str(tmp_path / cache),
        )
        return list(split)

    _check(load("hf-cold"))
    assert [proxy.count("GET", f"/train/part-{i}.parquet") for i in range(SHARDS)] == [1] * 3
    settle(url, options)
    rows, warm = requests_during(proxy, lambda: load("hf-warm"))
    _check(rows)
    assert_warm(warm, consistency)


@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_streaming_by_tiercache_url(
    s3: Any,
    s3_client: Any,
    proxy: Any,
    bucket: str,
    tmp_path: Path,
    consistency: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # streams from S3 regardless
    _put_shards(s3_client, bucket)
    url = f"tiercache://{bucket}/train/*.parquet"
    cache = {"local_dir": str(tmp_path / "tier"), **CONSISTENCY[consistency]}
    options = {"tiercache": {**cache, "s3": store_options(s3, proxy)}}

    def stream() -> list[dict[str, Any]]:
        split = datasets.load_dataset(
            "parquet",
            data_files=url,
            storage_options=options,
            split="train",
            streaming=True,
            cache_dir=str(tmp_path / "hf"),
        )
        assert isinstance(split, datasets.IterableDataset)
        return list(split)

    _check(stream())
    assert [proxy.count("GET", f"/train/part-{i}.parquet") for i in range(SHARDS)] == [1] * 3
    settle(url, options)
    rows, warm = requests_during(proxy, stream)
    _check(rows)
    assert_warm(warm, consistency)
