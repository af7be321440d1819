"""The PyTorch shard dataset on the real S3 server: every sample once per epoch, fork and spawn."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (the adapter needs the tiercache[torch] extra)"
)

from tiercache.adapters.torch_dataset import FixedRecords, ShardDataset  # noqa: E402

RECORD = 512
SHARDS = 6
RECORDS = 8


def _dataset(s3: Any, s3_client: Any, bucket: str, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    for shard in range(SHARDS):
        body = b"".join(
            f"shard={shard:02d} record={r:02d} ".encode().ljust(RECORD, b".")
            for r in range(RECORDS)
        )
        s3_client.put_object(Bucket=bucket, Key=f"train/shard-{shard:02d}", Body=body)
    options = {
        "s3": s3.target_options(),
        "tiercache": {"local_dir": str(tmp_path / "tier"), "consistency": "immutable"},
    }
    return f"tiercache::s3://{bucket}/train/", options


def _expected() -> Counter[bytes]:
    return Counter(
        f"shard={s:02d} record={r:02d} ".encode().ljust(RECORD, b".")
        for s in range(SHARDS)
        for r in range(RECORDS)
    )


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_two_workers_deliver_every_sample_once_per_epoch(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, start_method: str
) -> None:
    url, options = _dataset(s3, s3_client, bucket, tmp_path)
    ds = ShardDataset(
        url, storage_options=options, decode=FixedRecords(RECORD), shuffle=True, seed=7
    )
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=start_method
    )
    orders = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        orders.append(ds.epoch_order())
        samples = Counter(bytes(s) for s in loader)
        assert samples == _expected(), f"epoch {epoch}"
    assert orders[0] != orders[1]  # the seeded shuffle changes with the epoch
    assert sorted(orders[0]) == sorted(orders[1]) == ds.shards
    # The workers read through the tier this process shares: every shard is cached.
    fs = ds.filesystem()
    assert all(fs.is_cached(path) for path in ds.shards)


def test_ranks_and_workers_split_the_shards(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    url, options = _dataset(s3, s3_client, bucket, tmp_path)
    ranks = [
        ShardDataset(url, storage_options=options, shuffle=True, rank=r, world_size=2)
        for r in range(2)
    ]
    mine = [rank.worker_shards() for rank in ranks]
    assert not set(mine[0]) & set(mine[1])
    assert sorted(mine[0] + mine[1]) == ranks[0].shards
    whole = list(ranks[0])  # no DataLoader: a sample is a shard's bytes
    assert len(whole) == SHARDS // 2 and all(len(s) == RECORD * RECORDS for s in whole)
    with pytest.raises(ValueError, match="rank"):
        ShardDataset(url, storage_options=options, rank=2, world_size=2)


def test_a_list_of_urls_and_a_bad_url(s3: Any, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    url, options = _dataset(s3, s3_client, bucket, tmp_path)
    urls = [f"{url}shard-{i:02d}" for i in (3, 1)]
    ds = ShardDataset(urls, storage_options=options)
    assert ds.shards == [f"{bucket}/train/shard-03", f"{bucket}/train/shard-01"]
    assert [s[:8] for s in ds] == [b"shard=03", b"shard=01"]
    with pytest.raises(ValueError, match="not a tiercache URL"):
        ShardDataset([os.fspath(tmp_path)], storage_options={})
