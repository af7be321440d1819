"""Training-loop benchmark: time a model stalls on data, plain s3 / fsspec caches / tiercache."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common
import fsspec
import xxhash
from common import REPO, Endpoint, MiB, VerifyError

from tiercache import TierCacheFileSystem

DEFAULT_JSON = REPO / "benchmarks" / "results" / "train_loop_bench.json"

NOTES = (
    "The loop reads each shard in --chunk-mib readinto() calls into one reused buffer and, "
    "after each chunk, 'computes' for chunk/rate seconds (a sleep to a deadline, so hashing "
    "the chunk for verification is part of the compute time, never of the stall).",
    "stall = seconds spent in open() and readinto(), i.e. waiting for data; stall fraction = "
    "stall / wall time of the loop. 'excl. first' leaves out the first shard of the run, which "
    "every mode must fetch while the model waits.",
    "Modes run one after the other on the same shards and server, each with a fresh cache: "
    "s3fs = plain s3:// reads (s3fs defaults); simplecache = fsspec simplecache::s3:// "
    "(whole object downloaded at open); tiercache_no_prefetch = tiercache without read-ahead; "
    "tiercache = tiercache with fs.read_ahead(order) (k = --readahead).",
    "The over-budget run: a dataset of 3x local_max_bytes read for 2 epochs (a new shuffled "
    "order each epoch, both epochs in one read-ahead order); GETs and bytes are the store "
    "requests and bytes fetched during each epoch.",
    "Every shard's bytes are checked against the xxh3_128 digest taken when it was uploaded.",
)


@dataclass(frozen=True)
class Shard:
    key: str
    size: int
    digest: str


@dataclass
class Dataset:
    bucket: str
    shards: list[Shard]


# -- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shards", type=int, default=24, help="shards read per mode (default 24)")
    p.add_argument("--shard-mib", type=float, default=32, help="shard size in MiB (default 32)")
    p.add_argument("--rate-mib", type=float, default=64, help="'GPU' consumption, MiB/s")
    p.add_argument("--chunk-mib", type=float, default=4, help="read size in MiB (default 4)")
    p.add_argument("--readahead", type=int, default=4, help="tiercache read-ahead k")
    p.add_argument(
        "--over-shards", type=int, default=24, help="shards of the 3x-budget run (default 24)"
    )
    p.add_argument("--modes", default="s3fs,simplecache,tiercache_no_prefetch,tiercache")
    p.add_argument("--quick", action="store_true", help="small run, under a minute")
    common.add_run_args(p, DEFAULT_JSON)
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.shard_mib, args.over_shards = 8, 16, 12
    args.modes = [m for m in args.modes.split(",") if m]
    if min(args.shards, args.over_shards) < 2 or args.shard_mib <= 0 or args.rate_mib <= 0:
        p.error("--shards/--over-shards must be >= 2, sizes and rate positive")
    return args


# -- dataset -----------------------------------------------------------------------------------


def upload(client: Any, bucket: str, prefix: str, count: int, size: int) -> list[Shard]:
    def make(i: int) -> Shard:
        data = random.randbytes(size)
        key = f"{prefix}/shard-{i:05d}.bin"
        client.put_object(Bucket=bucket, Key=key, Body=data)
        return Shard(key, size, xxhash.xxh3_128_hexdigest(data))

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(make, range(count)))


# -- the loop ----------------------------------------------------------------------------------


@dataclass
class LoopResult:
    seconds: float = 0.0
    stall_s: float = 0.0
    first_stall_s: float = 0.0
    nbytes: int = 0

    def as_dict(self) -> dict[str, float]:
        rest = self.seconds - self.first_stall_s
        return {
            "seconds": round(self.seconds, 3),
            "stall_s": round(self.stall_s, 3),
            "stall_fraction": round(self.stall_s / self.seconds, 4),
            "stall_fraction_excl_first": round((self.stall_s - self.first_stall_s) / rest, 4),
            "mib": round(self.nbytes / MiB, 1),
        }


Opener = Callable[[str], Any]


def train_loop(
    opener: Opener, bucket: str, order: list[Shard], args: argparse.Namespace
) -> LoopResult:
    """Consume shards at --rate-mib; return the time spent waiting for data."""
    chunk = int(args.chunk_mib * MiB)
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    result = LoopResult()
    started = time.perf_counter()
    for n, shard in enumerate(order):
        hasher = xxhash.xxh3_128()
        stall = 0.0
        t = time.perf_counter()
        f = opener(f"{bucket}/{shard.key}")
        stall += time.perf_counter() - t
        with f:
            while True:
                t = time.perf_counter()
                got = f.readinto(view)
                now = time.perf_counter()
                stall += now - t
                if not got:
                    break
                hasher.update(view[:got])
                result.nbytes += got
                deadline = now + got / (args.rate_mib * MiB)
                time.sleep(max(0.0, deadline - time.perf_counter()))
        if hasher.hexdigest() != shard.digest:
            raise VerifyError(f"{shard.key}: the bytes read differ from the bytes stored")
        result.stall_s += stall
        if n == 0:
            result.first_stall_s = stall
    result.seconds = time.perf_counter() - started
    return result


def run_mode(mode: str, ds: Dataset, endpoint: Endpoint, args: argparse.Namespace, tmp: Path):
    """Run the loop once through ``mode`` with a fresh cache; returns (result, extras)."""
    cache = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=tmp))
    extras: dict[str, Any] = {}
    if mode == "s3fs":
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **endpoint.s3_options())
        result = train_loop(lambda p: fs.open(p, "rb"), ds.bucket, ds.shards, args)
    elif mode == "simplecache":
        fs = fsspec.filesystem(
            "simplecache",
            target_protocol="s3",
            target_options=endpoint.s3_options(),
            cache_storage=str(cache),
            skip_instance_cache=True,
        )
        result = train_loop(lambda p: fs.open(p, "rb"), ds.bucket, ds.shards, args)
    else:
        tc = tiercache_fs(endpoint, cache, consistency="immutable")
        paths = [f"{ds.bucket}/{s.key}" for s in ds.shards]
        ahead: AbstractContextManager[Any] = (
            tc.read_ahead(paths, k=args.readahead) if mode == "tiercache" else nullcontext()
        )
        with ahead:
            result = train_loop(lambda p: tc.open(p, "rb"), ds.bucket, ds.shards, args)
        extras = tier_counts(tc)
    return result, extras


def tiercache_fs(endpoint: Endpoint, cache: Path, **options: Any) -> TierCacheFileSystem:
    fs = TierCacheFileSystem(
        target_options=endpoint.s3_options(),
        local_dir=str(cache),
        skip_instance_cache=True,
        **options,
    )
    common.build_client_now(fs)
    return fs


def tier_counts(fs: TierCacheFileSystem) -> dict[str, Any]:
    s = fs.stats()
    keys = ("prefetched", "prefetch_used", "prefetch_wasted", "hits", "fetches_joined")
    out = {k: s[k] for k in keys}
    out["gets"] = s["store_requests"].get("GetObject", 0)
    out["bytes_fetched"] = s["bytes_fetched"]
    out["reader_wait_s"] = round(s["reader_wait_seconds"], 3)
    return out


def over_budget_run(client: Any, endpoint: Endpoint, args: argparse.Namespace, tmp: Path):
    """A dataset 3x the cache budget, 2 epochs (shuffled), one read-ahead order for both."""
    size = int(args.shard_mib * MiB)
    bucket = f"tiercache-bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    shards = upload(client, bucket, "over", args.over_shards, size)
    budget = args.over_shards * size // 3
    fs = tiercache_fs(endpoint, tmp / "over-tier", consistency="immutable", local_max_bytes=budget)
    rng = random.Random(0)
    epochs = [rng.sample(shards, len(shards)) for _ in range(2)]
    rows = []
    order = [f"{bucket}/{s.key}" for epoch in epochs for s in epoch]
    with fs.read_ahead(order, k=args.readahead):
        for epoch in epochs:
            before = fs.stats()
            result = train_loop(lambda p: fs.open(p, "rb"), bucket, epoch, args)
            after = fs.stats()
            gets = after["store_requests"].get("GetObject", 0)
            gets -= before["store_requests"].get("GetObject", 0)
            row = result.as_dict()
            row["gets"] = gets
            row["mib_fetched"] = round((after["bytes_fetched"] - before["bytes_fetched"]) / MiB, 1)
            row["prefetch_wasted"] = after["prefetch_wasted"] - before["prefetch_wasted"]
            rows.append(row)
    delete_bucket(client, bucket, [s.key for s in shards])
    return {"budget_mib": round(budget / MiB, 1), "shards": args.over_shards, "epochs": rows}


def delete_bucket(client: Any, bucket: str, keys: list[str]) -> None:
    for start in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[start : start + 1000]]
        client.delete_objects(Bucket=bucket, Delete={"Objects": batch})
    client.delete_bucket(Bucket=bucket)


def store_rate(client: Any, ds: Dataset) -> float:
    """MiB/s of one sequential get_object stream over the dataset (also warms the server)."""
    started = time.perf_counter()
    total = 0
    for shard in ds.shards:
        body = client.get_object(Bucket=ds.bucket, Key=shard.key)["Body"]
        while data := body.read(8 * MiB):
            total += len(data)
    return total / MiB / (time.perf_counter() - started)


def benchmark(args: argparse.Namespace, endpoint: Endpoint, tmp: Path) -> dict[str, Any]:
    client = common.make_client(endpoint)
    bucket = f"tiercache-bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    ds = Dataset(bucket, upload(client, bucket, "train", args.shards, int(args.shard_mib * MiB)))
    rate = store_rate(client, ds)
    fsspec.filesystem("s3", **endpoint.s3_options()).ls(bucket)  # connect outside the timers
    modes = {}
    for mode in args.modes:
        result, extras = run_mode(mode, ds, endpoint, args, tmp)
        modes[mode] = {**result.as_dict(), **extras}
        print(f"  {mode}: stall {modes[mode]['stall_fraction']:.1%}", file=sys.stderr)
    delete_bucket(client, bucket, [s.key for s in ds.shards])
    over = over_budget_run(client, endpoint, args, tmp)
    return {
        "params": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "store_single_stream_mib_s": round(rate, 1),
        "modes": modes,
        "over_budget": over,
        "machine": common.machine_info(endpoint),
        "notes": NOTES,
    }


def print_report(result: dict[str, Any]) -> None:
    p = result["params"]
    print(
        f"\ntiercache training-loop benchmark: {p['shards']} shards x {p['shard_mib']:g} MiB, "
        f"consumed at {p['rate_mib']:g} MiB/s (store, one stream: "
        f"{result['store_single_stream_mib_s']:.0f} MiB/s), read-ahead k={p['readahead']}\n"
    )
    print(f"{'mode':<24} {'seconds':>8} {'stall_s':>8} {'stall':>7} {'excl. first':>11}")
    base = result["modes"].get("tiercache", {}).get("stall_fraction_excl_first")
    for mode, row in result["modes"].items():
        print(
            f"{mode:<24} {row['seconds']:>8.2f} {row['stall_s']:>8.2f} "
            f"{row['stall_fraction']:>7.1%} {row['stall_fraction_excl_first']:>11.1%}"
        )
    if base:
        for mode, row in result["modes"].items():
            if mode != "tiercache":
                ratio = row["stall_fraction_excl_first"] / base
                print(f"  {mode} stalls {ratio:,.0f}x as much as tiercache (excl. first shard)")
    over = result["over_budget"]
    print(
        f"\nover budget: {over['shards']} shards = 3x local_max_bytes ({over['budget_mib']:g} "
        "MiB), 2 shuffled epochs"
    )
    print(f"{'epoch':<6} {'GETs':>5} {'MiB fetched':>12} {'stall':>7} {'excl. first':>11}")
    for n, row in enumerate(over["epochs"], 1):
        print(
            f"{n:<6} {row['gets']:>5} {row['mib_fetched']:>12.0f} {row['stall_fraction']:>7.1%} "
            f"{row['stall_fraction_excl_first']:>11.1%}"
        )
    common.print_notes(result["notes"])


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(parse_args(argv), "tiercache-train-", benchmark, print_report)


if __name__ == "__main__":
    sys.exit(main())
