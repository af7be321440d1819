"""Training-loop benchmark: time a model stalls on data, plain s3 / fsspec caches / tiercache."""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common
import fsspec
import plot
import xxhash
from common import REPO, Endpoint, MiB, VerifyError

from tiercache import TierCacheFileSystem

DEFAULT_JSON = REPO / "benchmarks" / "results" / "train_loop_bench.json"
DEFAULT_RATE_MIB = 64.0
MODES = ("s3fs", "simplecache", "tiercache_no_prefetch", "tiercache")
RATE_PROBE_BYTES = 64 * MiB  # read through the store profile to measure one stream

NOTES = (
    "The loop reads each shard in --chunk-mib readinto() calls into one reused buffer and, "
    "after each chunk, 'computes' for chunk/rate seconds (a sleep to a deadline, so hashing "
    "the chunk for verification is part of the compute time, never of the stall).",
    "stall = seconds spent in open() and readinto(), i.e. waiting for data; stall fraction = "
    "stall / wall time of the loop. Per epoch, 'excl. first' leaves out that epoch's first "
    "shard (in epoch 1 every mode must fetch it while the model waits); in a mode's total row "
    "only the run's first shard is left out.",
    "Modes run one after the other on the same shards and server, each with a fresh cache "
    "kept for all --epochs epochs; every epoch reads the shards in the same order: "
    "s3fs = plain s3:// reads (s3fs defaults); simplecache = fsspec simplecache::s3:// "
    "(whole object downloaded at open); tiercache_no_prefetch = tiercache without read-ahead; "
    "tiercache = tiercache with fs.read_ahead(order of every epoch) (k = --readahead).",
    "A step = one readinto() of --chunk-mib; the open() of a shard counts in its first step. "
    "epochs[].step_stall_s has the stall of every step and step_end_s when it ended (seconds "
    "since the epoch began): what --plot draws.",
    "--store-profile runs every mode (and the single-stream measurement) through "
    "scripts/remote_store.py, the profile's numbers in params.store_profile; uploads, the "
    "untimed warm-up read and cleanup go straight to the server. --rate-fraction F sets the "
    "loop's rate to F x the profile's aggregate bandwidth (params.rate_source says which).",
    "The over-budget run: a dataset of 1/--tier-fraction x local_max_bytes read for "
    "--over-epochs epochs (a new shuffled order each epoch, all epochs in one read-ahead "
    "order); GETs and bytes are the store requests and bytes fetched during each epoch, "
    "'x data' their ratio to the dataset. 'best' is a lower bound: the dataset, then at least "
    "(dataset - local_max_bytes) per later epoch, since the tier holds at most its budget "
    "when an epoch begins (prefetch across an epoch's end may move bytes between epochs).",
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
    p.add_argument(
        "--rate-mib", type=float, help=f"'GPU' consumption, MiB/s (default {DEFAULT_RATE_MIB:g})"
    )
    p.add_argument(
        "--rate-fraction",
        type=float,
        metavar="F",
        help="consume at F x the store profile's aggregate bandwidth (needs a profile with "
        "one, e.g. s3-region; instead of --rate-mib)",
    )
    p.add_argument("--epochs", type=int, default=2, help="passes over the shards (default 2)")
    p.add_argument("--chunk-mib", type=float, default=4, help="read size in MiB (default 4)")
    p.add_argument("--readahead", type=int, default=4, help="tiercache read-ahead k")
    p.add_argument(
        "--over-shards", type=int, default=24, help="shards of the over-budget run (default 24)"
    )
    p.add_argument(
        "--tier-fraction",
        type=float,
        default=1 / 3,
        metavar="F",
        help="over-budget run: local_max_bytes = F x its dataset (default 1/3)",
    )
    p.add_argument(
        "--over-epochs", type=int, default=2, help="epochs of the over-budget run (default 2)"
    )
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, in run order")
    p.add_argument("--quick", action="store_true", help="small run, under a minute")
    common.add_run_args(p, DEFAULT_JSON)
    common.add_store_profile_arg(p)
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.shard_mib, args.over_shards = 8, 16, 12
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = set(args.modes) - set(MODES)
    if unknown:
        p.error(f"unknown --modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    args.rate_mib, args.rate_source = consumption_rate(p, args)
    if min(args.shards, args.over_shards) < 2 or args.shard_mib <= 0 or args.rate_mib <= 0:
        p.error("--shards/--over-shards must be >= 2, sizes and rate positive")
    if min(args.epochs, args.over_epochs) < 1:
        p.error("--epochs and --over-epochs must be >= 1")
    if not 0 < args.tier_fraction < 1:
        p.error("--tier-fraction must be in (0, 1): a dataset larger than the tier")
    return args


def consumption_rate(p: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[float, str]:
    """The loop's MiB/s and where it came from: --rate-mib, or --rate-fraction x the profile's
    aggregate bandwidth."""
    if args.rate_fraction is None:
        rate = DEFAULT_RATE_MIB if args.rate_mib is None else args.rate_mib
        return rate, f"--rate-mib {rate:g}"
    if args.rate_mib is not None:
        p.error("give --rate-mib or --rate-fraction, not both")
    if args.rate_fraction <= 0:
        p.error("--rate-fraction must be positive")
    total = common.store_profile(args.store_profile)["total_bps"] / MiB
    if not total:
        p.error(
            f"--rate-fraction needs a store profile with an aggregate bandwidth cap; "
            f"{args.store_profile} has none (use --rate-mib)"
        )
    source = f"{args.rate_fraction:g} x {args.store_profile}'s {total:g} MiB/s aggregate"
    return args.rate_fraction * total, source


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
    step_stall_s: list[float] = field(default_factory=list)
    step_end_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        rest = self.seconds - self.first_stall_s
        return {
            "seconds": round(self.seconds, 3),
            "stall_s": round(self.stall_s, 3),
            "stall_fraction": round(self.stall_s / self.seconds, 4),
            "stall_fraction_excl_first": round((self.stall_s - self.first_stall_s) / rest, 4),
            "mib": round(self.nbytes / MiB, 1),
            "mib_s": round(self.nbytes / MiB / self.seconds, 1),
        }

    def with_steps(self) -> dict[str, Any]:
        return {
            **self.as_dict(),
            "step_stall_s": [round(s, 5) for s in self.step_stall_s],
            "step_end_s": [round(t, 4) for t in self.step_end_s],
        }


def run_total(epochs: list[LoopResult]) -> dict[str, float]:
    """A mode's totals over its epochs; only the run's first shard is left out of excl_first."""
    total = LoopResult(
        seconds=sum(e.seconds for e in epochs),
        stall_s=sum(e.stall_s for e in epochs),
        first_stall_s=epochs[0].first_stall_s,
        nbytes=sum(e.nbytes for e in epochs),
    )
    return total.as_dict()


Opener = Callable[[str], Any]


def train_loop(
    opener: Opener, bucket: str, order: list[Shard], args: argparse.Namespace
) -> LoopResult:
    """Consume shards (one epoch) at args.rate_mib; return the time spent waiting for data."""
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
        step = time.perf_counter() - t  # the open counts in the shard's first step
        with f:
            while True:
                t = time.perf_counter()
                got = f.readinto(view)
                now = time.perf_counter()
                step += now - t
                if not got:
                    break
                stall += step
                result.step_stall_s.append(step)
                result.step_end_s.append(now - started)
                step = 0.0
                hasher.update(view[:got])
                result.nbytes += got
                deadline = now + got / (args.rate_mib * MiB)
                time.sleep(max(0.0, deadline - time.perf_counter()))
        stall += step  # the final empty read (end of file) waits too
        if result.step_stall_s:
            result.step_stall_s[-1] += step
        if hasher.hexdigest() != shard.digest:
            raise VerifyError(f"{shard.key}: the bytes read differ from the bytes stored")
        result.stall_s += stall
        if n == 0:
            result.first_stall_s = stall
    result.seconds = time.perf_counter() - started
    return result


def run_mode(
    mode: str, ds: Dataset, endpoint: Endpoint, args: argparse.Namespace, tmp: Path
) -> tuple[list[LoopResult], dict[str, Any]]:
    """Run --epochs epochs through ``mode`` with one fresh cache; returns (epochs, extras)."""
    cache = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=tmp))
    extras: dict[str, Any] = {}

    def epochs(fs: Any) -> list[LoopResult]:
        return [
            train_loop(lambda p: fs.open(p, "rb"), ds.bucket, ds.shards, args)
            for _ in range(args.epochs)
        ]

    if mode == "s3fs":
        results = epochs(
            fsspec.filesystem("s3", skip_instance_cache=True, **endpoint.target_options())
        )
    elif mode == "simplecache":
        fs = fsspec.filesystem(
            "simplecache",
            target_protocol="s3",
            target_options=endpoint.target_options(),
            cache_storage=str(cache),
            skip_instance_cache=True,
        )
        results = epochs(fs)
    else:
        tc = tiercache_fs(endpoint, cache, consistency="immutable")
        paths = [f"{ds.bucket}/{s.key}" for s in ds.shards] * args.epochs
        ahead: AbstractContextManager[Any] = (
            tc.read_ahead(paths, k=args.readahead) if mode == "tiercache" else nullcontext()
        )
        with ahead:
            results = epochs(tc)
        extras = tier_counts(tc)
    return results, extras


def tiercache_fs(endpoint: Endpoint, cache: Path, **options: Any) -> TierCacheFileSystem:
    fs = TierCacheFileSystem(
        target_options=endpoint.target_options(),
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


def over_budget_run(
    client: Any, endpoint: Endpoint, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """A dataset larger than the cache budget (--tier-fraction), --over-epochs shuffled epochs,
    one read-ahead order for all of them.

    ``client`` (straight to the server) uploads and deletes; the loop reads through ``endpoint``.
    """
    size = int(args.shard_mib * MiB)
    bucket = f"tiercache-bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    shards = upload(client, bucket, "over", args.over_shards, size)
    dataset = args.over_shards * size
    budget = int(dataset * args.tier_fraction)
    fs = tiercache_fs(endpoint, tmp / "over-tier", consistency="immutable", local_max_bytes=budget)
    rng = random.Random(0)
    epochs = [rng.sample(shards, len(shards)) for _ in range(args.over_epochs)]
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
            fetched = after["bytes_fetched"] - before["bytes_fetched"]
            row["mib_fetched"] = round(fetched / MiB, 1)
            row["fetched_x_dataset"] = round(fetched / dataset, 3)
            row["best_x_dataset"] = round((dataset - budget if rows else dataset) / dataset, 3)
            row["prefetch_wasted"] = after["prefetch_wasted"] - before["prefetch_wasted"]
            for name in ("evictions_by_next_use", "bytes_kept_by_next_use"):
                row[name] = after[name] - before[name]
            rows.append(row)
    delete_bucket(client, bucket, [s.key for s in shards])
    total = sum(r["mib_fetched"] for r in rows) * MiB
    best = dataset + (len(rows) - 1) * (dataset - budget)
    return {
        "budget_mib": round(budget / MiB, 1),
        "dataset_mib": round(dataset / MiB, 1),
        "tier_fraction": args.tier_fraction,
        "shards": args.over_shards,
        "fetched_x_dataset": round(total / dataset, 3),
        "fetched_x_best": round(total / best, 3),
        "epochs": rows,
    }


def delete_bucket(client: Any, bucket: str, keys: list[str]) -> None:
    for start in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[start : start + 1000]]
        client.delete_objects(Bucket=bucket, Delete={"Objects": batch})
    client.delete_bucket(Bucket=bucket)


def read_stream(client: Any, ds: Dataset, shards: list[Shard]) -> float:
    """MiB/s of one sequential get_object stream over ``shards``."""
    started = time.perf_counter()
    total = 0
    for shard in shards:
        body = client.get_object(Bucket=ds.bucket, Key=shard.key)["Body"]
        while data := body.read(8 * MiB):
            total += len(data)
        body.close()
    return total / MiB / (time.perf_counter() - started)


def rate_probe(ds: Dataset) -> list[Shard]:
    """The first shards, at least RATE_PROBE_BYTES of them (all of them if fewer)."""
    sizes = itertools.accumulate(s.size for s in ds.shards)
    count = next((n for n, total in enumerate(sizes, 1) if total >= RATE_PROBE_BYTES), None)
    return ds.shards[: count or len(ds.shards)]


def benchmark(args: argparse.Namespace, endpoint: Endpoint, tmp: Path) -> dict[str, Any]:
    direct = common.make_client(endpoint)
    bucket = f"tiercache-bench-{uuid.uuid4().hex[:12]}"
    direct.create_bucket(Bucket=bucket)
    ds = Dataset(bucket, upload(direct, bucket, "train", args.shards, int(args.shard_mib * MiB)))
    read_stream(direct, ds, ds.shards)  # untimed warm-up: every mode sees the same server state
    try:
        with common.remote_store(endpoint, args.store_profile, args.store_cores) as (
            store,
            profile,
        ):
            return benchmark_through(args, store, profile, ds, tmp, direct)
    finally:
        delete_bucket(direct, bucket, [s.key for s in ds.shards])


def benchmark_through(
    args: argparse.Namespace,
    endpoint: Endpoint,
    profile: dict[str, Any],
    ds: Dataset,
    tmp: Path,
    direct: Any,
) -> dict[str, Any]:
    """Every mode and the over-budget run through ``endpoint`` (the store the profile emulates)."""
    rate = read_stream(common.make_client(endpoint), ds, rate_probe(ds))
    fsspec.filesystem("s3", **endpoint.target_options()).ls(ds.bucket)  # connect outside the timers
    modes = {}
    for mode in args.modes:
        epochs, extras = run_mode(mode, ds, endpoint, args, tmp)
        modes[mode] = {**run_total(epochs), **extras, "epochs": [e.with_steps() for e in epochs]}
        per_epoch = ", ".join(f"{e.as_dict()['stall_fraction_excl_first']:.1%}" for e in epochs)
        print(f"  {mode}: stall excl. first per epoch {per_epoch}", file=sys.stderr)
    over = over_budget_run(direct, endpoint, args, tmp)
    skip = ("json", "plot", "store_profile", "rate_fraction")
    return {
        "params": {
            **{k: v for k, v in vars(args).items() if k not in skip},
            "rate_fraction": args.rate_fraction,
            "store_profile": profile,
        },
        "store_single_stream_mib_s": round(rate, 1),
        "modes": modes,
        "over_budget": over,
        "machine": common.machine_info(endpoint),
        "notes": NOTES,
    }


def print_report(result: dict[str, Any]) -> None:
    p = result["params"]
    print(
        f"\ntiercache training-loop benchmark: {p['epochs']} epoch(s) x {p['shards']} shards x "
        f"{p['shard_mib']:g} MiB in order, consumed at {p['rate_mib']:g} MiB/s "
        f"({p['rate_source']}; store, one stream: {result['store_single_stream_mib_s']:.0f} "
        f"MiB/s), read-ahead k={p['readahead']}"
    )
    print(common.describe_profile(p["store_profile"]) + "\n")
    head = f"{'mode':<24} {'epoch':>5} {'seconds':>8} {'MiB/s':>7} {'stall_s':>8} {'stall':>7}"
    print(f"{head} {'excl. first':>11}")
    for mode, row in result["modes"].items():
        for n, epoch in enumerate([*row["epochs"], row], 1):
            name = mode if n == 1 else ""
            label = str(n) if n <= len(row["epochs"]) else "all"
            print(
                f"{name:<24} {label:>5} {epoch['seconds']:>8.2f} {epoch['mib_s']:>7.1f} "
                f"{epoch['stall_s']:>8.2f} {epoch['stall_fraction']:>7.1%} "
                f"{epoch['stall_fraction_excl_first']:>11.1%}"
            )
    print_stall_ratios(result["modes"])
    print_over_budget(result["over_budget"])
    common.print_notes(result["notes"])


def print_over_budget(over: dict[str, Any]) -> None:
    """Bytes fetched per epoch against the dataset and against the best possible."""
    print(
        f"\nover budget: {over['shards']} shards ({over['dataset_mib']:g} MiB), local_max_bytes "
        f"{over['budget_mib']:g} MiB ({over['tier_fraction']:.2g} of it), "
        f"{len(over['epochs'])} shuffled epochs"
    )
    head = f"{'epoch':<6} {'GETs':>5} {'MiB fetched':>12} {'x data':>7} {'best':>6}"
    print(f"{head} {'stall':>7} {'excl. first':>11}")
    for n, row in enumerate(over["epochs"], 1):
        print(
            f"{n:<6} {row['gets']:>5} {row['mib_fetched']:>12.0f} "
            f"{row['fetched_x_dataset']:>7.2f} {row['best_x_dataset']:>6.2f} "
            f"{row['stall_fraction']:>7.1%} {row['stall_fraction_excl_first']:>11.1%}"
        )
    print(
        f"all epochs: {over['fetched_x_dataset']:.2f}x the dataset, "
        f"{over['fetched_x_best']:.2f}x the best possible"
    )


def print_stall_ratios(modes: dict[str, Any]) -> None:
    """How many times tiercache's stall (excl. first, per epoch) each other mode stalls."""
    if "tiercache" not in modes:
        return
    base = [e["stall_fraction_excl_first"] for e in modes["tiercache"]["epochs"]]
    for mode, row in modes.items():
        if mode == "tiercache":
            continue
        parts = []
        for n, (epoch, ref) in enumerate(zip(row["epochs"], base, strict=True), 1):
            value = epoch["stall_fraction_excl_first"]
            parts.append(f"epoch {n}: " + (f"{value / ref:,.1f}x" if ref else f"{value:.1%} vs 0"))
        print(f"  {mode} stalls, against tiercache (excl. first shard): {'; '.join(parts)}")


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(
        parse_args(argv), "tiercache-train-", benchmark, print_report, chart=plot.train_loop_chart
    )


if __name__ == "__main__":
    sys.exit(main())
