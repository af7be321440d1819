"""A PyTorch ``IterableDataset`` over shards in object storage, read through tiercache."""

# Usage:
#
#     opts = {"s3": {"endpoint_url": ...}, "tiercache": {"local_dir": "/nvme/tiercache"}}
#     ds = ShardDataset("tiercache::s3://bucket/train/", storage_options=opts,
#                       decode=FixedRecords(4096), shuffle=True, seed=0)
#     loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4)
#     for epoch in range(epochs):
#         ds.set_epoch(epoch)
#         for sample in loader: ...
#
# Shards are split between ranks, then between the DataLoader workers of a rank, so every
# shard is read by exactly one worker per epoch. Each worker hands its own order to the
# prefetcher (``fs.read_ahead``): opening shard i brings shards i+1..i+k into the local tier
# while the model computes. The filesystem is never pickled: each worker process builds its
# own from the URL and options (fork and spawn alike; tiercache's state is fork-safe). The
# next epoch's order is known too (a seeded shuffle), so each worker also tells the tier's
# eviction which shards it reads first after this epoch: with a dataset larger than the tier,
# it keeps those and lets go of the ones read furthest ahead (``ReadAhead.expect_after``).

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import fsspec.core

from tiercache import TierCacheFileSystem

_EXTRA_HINT = "pip install 'tiercache[torch]' (or torch for your platform from pytorch.org)"

try:
    import torch.utils.data
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(f"tiercache.adapters.torch_dataset needs PyTorch: {_EXTRA_HINT}") from exc

__all__ = ["FixedRecords", "ShardDataset"]

Decode = Callable[[bytes], Iterable[Any]]


class FixedRecords:
    """A decode function: a shard's bytes split into records of ``size`` bytes (picklable)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"record size must be positive, got {size}")
        self.size = size

    def __call__(self, data: bytes) -> Iterator[bytes]:
        for start in range(0, len(data), self.size):
            yield data[start : start + self.size]


class ShardDataset(torch.utils.data.IterableDataset[Any]):
    """Samples from shards read through tiercache: each shard's bytes, or ``decode``'s output.

    ``shards`` is a list of URLs (``tiercache::s3://bucket/key``) or one prefix URL whose
    objects (listed once, here) are the shards. ``decode(bytes)`` returns the samples of a
    shard (e.g. its records); without it a sample is the shard's bytes. ``shuffle`` orders the
    shards by a seeded shuffle that changes with ``set_epoch``. ``rank``/``world_size`` split
    the shards between data-parallel ranks; ``readahead`` is how many shards each worker
    keeps coming (default: the ``readahead`` option).
    """

    def __init__(
        self,
        shards: str | Sequence[str],
        storage_options: dict[str, Any] | None = None,
        decode: Decode | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        readahead: int | None = None,
    ) -> None:
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got {rank} of {world_size}")
        self._storage_options = dict(storage_options or {})
        urls = [shards] if isinstance(shards, str) else list(shards)
        if not urls:
            raise ValueError("no shards given")
        self._url = urls[0]
        self._fs: TierCacheFileSystem | None = None
        fs = self.filesystem()
        if isinstance(shards, str):
            self.shards = sorted(fs.find(fs._strip_protocol(shards)))
            if not self.shards:
                raise FileNotFoundError(2, "no shards under the prefix", shards)
        else:
            self.shards = [fs._strip_protocol(u) for u in urls]
        self.decode = decode
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.readahead = readahead
        self.epoch = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None  # rebuilt in the worker process
        return state

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch; with ``shuffle`` each epoch has its own shard order."""
        self.epoch = epoch

    def filesystem(self) -> TierCacheFileSystem:
        """This process's tiercache filesystem (fsspec rebuilds it after a fork)."""
        fs, _ = fsspec.core.url_to_fs(self._url, **self._storage_options)
        if not isinstance(fs, TierCacheFileSystem):
            raise ValueError(f"{self._url!r} is not a tiercache URL (tiercache::s3://bucket/key)")
        self._fs = fs
        return fs

    def epoch_order(self, epoch: int | None = None) -> list[str]:
        """Every shard of this epoch (or ``epoch``), in the order the ranks and workers split it."""
        order = list(self.shards)
        if self.shuffle:
            seed = self.seed * 1_000_003 + (self.epoch if epoch is None else epoch)
            random.Random(seed).shuffle(order)
        return order

    def worker_shards(self, epoch: int | None = None) -> list[str]:
        """The shards this rank's current DataLoader worker reads this epoch (or ``epoch``)."""
        mine = self.epoch_order(epoch)[self.rank :: self.world_size]
        info = torch.utils.data.get_worker_info()
        if info is None:
            return mine
        return mine[info.id :: info.num_workers]

    def __iter__(self) -> Iterator[Any]:
        fs = self._fs if self._fs is not None else self.filesystem()
        info = torch.utils.data.get_worker_info()
        workers = 1 if info is None else info.num_workers
        shards = self.worker_shards()
        # Workers share the node's tier: each keeps its part of the window ahead of itself.
        window = max(1, fs.config.prefetch_window // workers)
        with fs.read_ahead(shards, k=self.readahead, window_bytes=window) as ahead:
            ahead.expect_after(self.worker_shards(self.epoch + 1))
            for path in shards:
                with fs.open(path, "rb") as f:
                    data = f.read()
                if self.decode is None:
                    yield data
                else:
                    yield from self.decode(data)
        # A DataLoader worker exits after its last sample: let its fetches publish first, or
        # the next epoch's worker would fetch those shards again.
        fs.wait_fetches()
