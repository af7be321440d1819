"""A shuffled ShardDataset over twice the tier, epoch after epoch: eviction by next use."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip(
    "torch", reason="PyTorch is not installed (the adapter needs the tiercache[torch] extra)"
)

from tiercache.adapters.torch_dataset import ShardDataset

from tiercache import MemoryStore

KiB = 1024
SHARDS = 24
SIZE = 32 * KiB


def test_set_epoch_orders_keep_the_next_epochs_first_shards(tmp_path: Path) -> None:
    # Each epoch's read-ahead also names the next epoch's order: the tier keeps the shards
    # that epoch reads first. LRU fetched about 2.7x the dataset here.
    store = MemoryStore(["b"])
    blobs = {f"train/shard-{i:02d}": os.urandom(SIZE) for i in range(SHARDS)}
    for key, blob in blobs.items():
        store.put_bytes("b", key, blob)
    dataset = SHARDS * SIZE
    options = {
        "tiercache": {
            "store": store,
            "local_dir": str(tmp_path / "tier"),
            "local_max_bytes": dataset // 2,
            "consistency": "immutable",
            "skip_instance_cache": True,
        }
    }
    ds = ShardDataset("tiercache::s3://b/train/", storage_options=options, shuffle=True, seed=3)
    orders = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        orders.append(ds.epoch_order())
        assert Counter(bytes(s) for s in ds) == Counter(blobs.values())
    assert len({tuple(order) for order in orders}) == 3  # a new shuffle each epoch
    stats = ds.filesystem().stats()
    assert stats["bytes_fetched"] <= 2.25 * dataset, stats["bytes_fetched"] / dataset
    assert stats["evictions_by_next_use"] > 0
