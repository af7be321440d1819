"""Hugging Face ``datasets`` through tiercache: ``load_dataset("parquet", data_files=…)``.

Two forms, as README shows them, each downloaded and prepared (``streaming=False``) and
streamed:
- ``data_files="tiercache::s3://bucket/train/*.parquet"`` with
  ``storage_options={"s3": {...}, "tiercache": {...}}`` (a chained URL);
- ``data_files="tiercache://bucket/train/*.parquet"`` with
  ``storage_options={"tiercache": {..., "s3": {...}}}``.
Each checks which tier was used: every filesystem ``datasets`` built has the ``local_dir`` and
``consistency`` given, the given tier holds the objects, and the default tier
(``$XDG_CACHE_HOME/tiercache``, pointed into the test's directory) holds nothing. ``datasets``
prepares a chained URL's hops itself (``tiercache.hf_datasets`` says how): without tiercache's
help the ``tiercache={...}`` options are dropped and a streamed chained URL opens a local file
named ``tiercache``.

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
import fsspec.core
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

from tiercache import TierCacheConfig, TierCacheFileSystem

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


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[TierCacheConfig]:
    """The config of every tiercache filesystem built during the test; the default tier moved."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("TIERCACHE_LOCAL_DIR", raising=False)
    monkeypatch.delenv("TIERCACHE_CONSISTENCY", raising=False)
    configs: list[TierCacheConfig] = []
    init = TierCacheFileSystem.__init__

    def recording_init(self: TierCacheFileSystem, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        configs.append(self.config)

    monkeypatch.setattr(TierCacheFileSystem, "__init__", recording_init)
    return configs


def _assert_tier_used(
    built: list[TierCacheConfig], tmp_path: Path, url: str, options: dict[str, Any], mode: str
) -> None:
    """Every filesystem built used the given tier and mode; the objects are there, not elsewhere."""
    tier = str(tmp_path / "tier")
    assert built, "datasets built no tiercache filesystem"
    assert {(c.local_dir, c.consistency) for c in built} == {(tier, mode)}
    fs, _ = fsspec.core.url_to_fs(url, **options)
    assert fs.config.local_dir == tier
    bucket = fs._strip_protocol(url).split("/")[0]
    assert all(fs.is_cached(f"{bucket}/train/part-{i}.parquet") for i in range(SHARDS))
    default = tmp_path / "xdg-cache" / "tiercache"
    assert not [p for p in default.rglob("*") if p.is_file()], "the default tier holds files"


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
@pytest.mark.parametrize("streaming", [False, True], ids=["prepared", "streaming"])
@pytest.mark.parametrize("consistency", sorted(CONSISTENCY))
def test_load_dataset_by_chained_url(
    s3: Any,
    s3_client: Any,
    proxy: Any,
    bucket: str,
    tmp_path: Path,
    consistency: str,
    streaming: bool,
    built: list[TierCacheConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if streaming:
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # streams from S3 regardless
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
            streaming=streaming,
            cache_dir=str(tmp_path / cache),
        )
        assert isinstance(split, datasets.IterableDataset) == streaming
        return list(split)

    _check(load("hf-cold"))
    assert [proxy.count("GET", f"/train/part-{i}.parquet") for i in range(SHARDS)] == [1] * 3
    settle(url, options)
    _assert_tier_used(built, tmp_path, url, options, consistency)
    rows, warm = requests_during(proxy, lambda: load("hf-warm"))
    _check(rows)
    assert_warm(warm, consistency)
    _assert_tier_used(built, tmp_path, url, options, consistency)


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
    built: list[TierCacheConfig],
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
    _assert_tier_used(built, tmp_path, url, options, consistency)
