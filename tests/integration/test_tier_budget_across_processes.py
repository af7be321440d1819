"""One budget per tier: four processes reading through one 32 MiB local tier keep it within
its budget plus the objects open at that moment, in every sample of what the disk holds.

Each process used to count only its own fetches in flight, and saw the others' publications
up to a second late: four readers took a 32 MiB tier to 76-90 MiB (a third of the samples
above the budget plus one object), a 4-worker DataLoader to 50-80 MiB. A thread of the test
sums the sizes of every file under the tier directory (what ``du --apparent-size -b``
counts) every 20 ms, and apart the objects' bytes in it (data and part files).

What is open is known two ways. The readers of the first test say it: each adds an object's
size to its ``opened`` counter before it opens the object and to its ``closed`` counter once it
closed it, so ``opened`` read after a sample less ``closed`` read before it is at least the
bytes of the objects open at any moment of the sample; and a reader holds one object open at
a time. A DataLoader worker of ``ShardDataset`` holds one shard open at a time: at most
``WORKERS`` objects of ``SIZE``. Objects the prefetcher holds (pinned) are not counted as
open: the node's prefetch window is part of the budget.

Asserted: the objects' bytes at most the budget plus the bytes open during the sample
(readers); every file of the tier at most the budget plus one object per process (both).
Entries' metadata files and the tier's own files (``ledger``, ``hints``) are outside the
budget, and within that second bound.

Object choice and orders are random; ``TIERCACHE_TEST_SEED`` repeats a run (it is printed).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import xxhash

from tiercache import TierCacheFileSystem

pytestmark = pytest.mark.partition

MiB = 1024 * 1024
BUDGET = 32 * MiB
SIZE = 2 * MiB
PROCESSES = 4
WORKERS = 4
POOL = 64  # objects in the bucket; each reader reads READS of them
READS = 40
SHARDS = 40
SAMPLE_EVERY = 0.02
_OBJECT_FILES = (".data", ".part", ".blk")  # an object's bytes; the rest is bookkeeping


@pytest.fixture
def seed() -> int:
    seed = int(os.environ.get("TIERCACHE_TEST_SEED") or random.randrange(1 << 32))
    print(f"TIERCACHE_TEST_SEED={seed}")
    return seed


@dataclass(frozen=True)
class Sample:
    total: int  # every file of the tier
    objects: int  # object bytes: entries' data and fetches' part files
    open_bytes: int  # objects open at some moment of the sample (-1: not known)


@dataclass
class Sampler:
    root: Path
    open_bytes: Callable[[], tuple[int, int]] | None = None  # (opened, closed) so far
    samples: list[Sample] = field(default_factory=list)

    def once(self) -> None:
        closed = self.open_bytes()[1] if self.open_bytes is not None else None
        total = objects = 0
        for path in _files(self.root):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
                if path.endswith(_OBJECT_FILES) or ".part." in os.path.basename(path):
                    objects += st.st_size
        opened = self.open_bytes()[0] if self.open_bytes is not None else None
        known = opened is not None and closed is not None
        self.samples.append(Sample(total, objects, opened - closed if known else -1))

    def peak(self) -> Sample:
        return max(self.samples, key=lambda s: s.total)


def _files(root: Path) -> Iterator[str]:
    for dirpath, _, names in os.walk(root):
        for name in names:
            yield os.path.join(dirpath, name)


@contextmanager
def sampling(sampler: Sampler) -> Iterator[Sampler]:
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            sampler.once()
            stop.wait(SAMPLE_EVERY)

    thread = threading.Thread(target=run, name="du", daemon=True)
    thread.start()
    try:
        yield sampler
    finally:
        stop.set()
        thread.join()
        sampler.once()


def _report(name: str, sampler: Sampler) -> None:
    peak, samples = sampler.peak(), sampler.samples
    over = sum(s.total > BUDGET for s in samples)
    over_one = sum(s.total > BUDGET + SIZE for s in samples)
    opened = "" if peak.open_bytes < 0 else f", {peak.open_bytes / MiB:.0f} MiB open then"
    print(
        f"{name}: peak {peak.total / MiB:.2f} MiB (objects {peak.objects / MiB:.2f} MiB"
        f"{opened}); of {len(samples)} samples {over} above the {BUDGET // MiB} MiB budget, "
        f"{over_one} ({100 * over_one / len(samples):.0f} %) above it plus one object"
    )


def _put(s3_client: Any, bucket: str, prefix: str, count: int, seed: int) -> dict[str, str]:
    """``count`` objects of ``SIZE`` random bytes; their digests by key."""
    rng = random.Random(seed)
    digests = {}
    for i in range(count):
        body = rng.randbytes(SIZE)
        key = f"{prefix}/obj-{i:03d}"
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
        digests[key] = xxhash.xxh3_64_hexdigest(body)
    return digests


def _reader(
    s3: dict[str, Any],
    tier: str,
    paths: list[str],
    me: int,
    opened: Any,
    closed: Any,
    out: Any,
) -> None:
    fs = TierCacheFileSystem(
        target_options=s3,
        local_dir=tier,
        local_max_bytes=BUDGET,
        consistency="immutable",
        skip_instance_cache=True,
    )
    digests = {}
    for path in paths:
        with opened.get_lock():
            opened[me] += SIZE  # before the open: the sampler counts it open from here
        with fs.open(path, "rb") as f:
            digests[path] = xxhash.xxh3_64_hexdigest(f.read())
        with closed.get_lock():
            closed[me] += SIZE
    fs.wait_fetches()
    out.put(digests)


def test_four_readers_keep_one_tier_within_its_budget(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, seed: int
) -> None:
    digests = _put(s3_client, bucket, "pool", POOL, seed)
    rng = random.Random(seed)
    keys = sorted(digests)
    plans = [[f"{bucket}/{k}" for k in rng.sample(keys, READS)] for _ in range(PROCESSES)]
    tier = tmp_path / "tier"
    ctx = multiprocessing.get_context("fork")
    opened = ctx.Array("q", PROCESSES)
    closed = ctx.Array("q", PROCESSES)
    out = ctx.Queue()

    def open_now() -> tuple[int, int]:
        return sum(opened[:]), sum(closed[:])

    procs = [
        ctx.Process(
            target=_reader,
            args=(s3.target_options(), str(tier), plan, me, opened, closed, out),
        )
        for me, plan in enumerate(plans)
    ]
    with sampling(Sampler(tier, open_now)) as sampler:
        for p in procs:
            p.start()
        results = [out.get(timeout=240) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    _report("4 readers", sampler)

    assert sorted(sorted(got) for got in results) == sorted(sorted(plan) for plan in plans)
    for got in results:
        assert got == {p: digests[p.split("/", 1)[1]] for p in got}
    # The objects' bytes never pass the budget by more than the objects open then; the
    # entries' metadata files (a few hundred bytes each) and the tier's bookkeeping come on top.
    worst = [s for s in sampler.samples if s.objects > BUDGET + s.open_bytes]
    assert worst == [], f"seed {seed}: {worst[:5]}"
    # And all of it, every file of the tier, within the budget plus one object per reader.
    assert sampler.peak().total <= BUDGET + PROCESSES * SIZE, f"seed {seed}"


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 2-core CI
def test_a_four_worker_data_loader_keeps_the_tier_within_its_budget(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, seed: int
) -> None:
    torch = pytest.importorskip(
        "torch", reason="PyTorch is not installed (the adapter needs the tiercache[torch] extra)"
    )
    from tiercache.adapters.torch_dataset import ShardDataset

    digests = _put(s3_client, bucket, "train", SHARDS, seed)
    tier = tmp_path / "tier"
    options = {
        "s3": s3.target_options(),
        "tiercache": {
            "local_dir": str(tier),
            "local_max_bytes": BUDGET,
            "consistency": "immutable",
        },
    }
    ds = ShardDataset(
        f"tiercache::s3://{bucket}/train/", storage_options=options, shuffle=True, seed=seed
    )
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=WORKERS, multiprocessing_context="fork"
    )
    seen: list[str] = []
    with sampling(Sampler(tier)) as sampler:
        for epoch in range(2):
            ds.set_epoch(epoch)
            seen += [xxhash.xxh3_64_hexdigest(bytes(shard)) for shard in loader]
    _report(f"{WORKERS}-worker DataLoader", sampler)

    assert sorted(seen) == sorted(list(digests.values()) * 2)
    # A worker holds one shard open at a time: at most WORKERS objects open at any moment.
    over = [s for s in sampler.samples if s.total > BUDGET + WORKERS * SIZE]
    assert over == [], f"seed {seed}: {len(over)} of {len(sampler.samples)} samples, {over[:5]}"
