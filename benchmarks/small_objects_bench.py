"""Small-object benchmark: many loose objects read whole; boto3, s3fs, local files, tiercache."""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import common
import fsspec
import plot
import xxhash
from common import REPO, Endpoint, MiB, VerifyError

DEFAULT_JSON = REPO / "benchmarks" / "results" / "small_objects_bench.json"
WARM_COMMAND = "_warm"  # hidden sub-command: one warm mode in a process of its own
VERIFY_EXIT = 3  # a warm child's exit status when a byte differs
TTL_S = 1.0
POOL = 64
LOADER_WORKERS = 4
COLD_CONSISTENCY = "immutable"  # what the README asks of a dataset

BASELINES = ("boto3_pool64", "s3fs_cat", "local_files")
COLD = ("tiercache_read_ahead_cold", "tiercache_cat_cold", "tiercache_dataloader_cold")
WARM = tuple(f"tiercache_warm_{c}_{r}" for c in ("ttl", "immutable") for r in ("read_ahead", "cat"))
MODES = BASELINES + COLD + WARM
GROUPS = {"tiercache_warm_ttl": WARM[:2], "tiercache_warm_immutable": WARM[2:]}
# The emulator (scripts/remote_store.py) counts requests only in total, in its own process,
# and is not inserted at all on loopback: requests are counted on the client.
REQUEST_COUNTER = (
    "client side: boto3 and s3fs by a botocore before-send event hook (one per HTTP attempt); "
    "tiercache by fs.stats()['store_requests'] (warm: the child's; dataloader: the workers')"
)

NOTES = (
    "Every object is read whole; the timer covers the reads (and a DataLoader's worker "
    "start-up), not the check after it: each object's xxh3_128 against its upload digest.",
    "Uploaded once (boto3, 16 threads) and read once untimed, both straight to the server (not "
    "through the emulator), so every mode finds it in the same state. local_files: the same "
    "bytes in local files, page cache warm (read untimed first), read in a new process as "
    "the warm modes are.",
    f"Cold tiercache modes: a fresh local_dir each, consistency={COLD_CONSISTENCY!r}; every "
    "tier is kept until the run ends (files removed just before make new ones dearer on "
    "ext4, a cost the plain clients, which create none, would not pay). "
    "dataloader: a map-style Dataset whose workers open tiercache::s3:// paths through "
    f"fsspec; DataLoader(batch_size=None, num_workers={LOADER_WORKERS}), fork.",
    "Warm modes run each in a new process on the tier the first cold mode filled, timed once "
    "its filesystem is built (verify='first': each file's digest is checked at its first "
    f"open): ttl with ttl={TTL_S:g} s, started after it ran out; immutable. read_ahead = "
    "fs.read_ahead(paths) then open/read in its order; cat = fs.cat(paths).",
    "Ratios are of files/s (= of MiB/s: every mode reads the same bytes), without targets.",
)


@dataclass(frozen=True)
class Dataset:
    bucket: str
    keys: list[str]
    digests: list[str]
    size: int
    local_dir: str

    @property
    def paths(self) -> list[str]:
        return [f"{self.bucket}/{k}" for k in self.keys]

    @property
    def local_paths(self) -> list[Path]:
        return [Path(self.local_dir) / k.rsplit("/", 1)[-1] for k in self.keys]

    @property
    def total_bytes(self) -> int:
        return self.size * len(self.keys)


@dataclass
class Sample:
    seconds: float
    requests: dict[str, int]
    blobs: list[Any] = field(default_factory=list)  # dropped once verified
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    args: argparse.Namespace
    endpoint: Endpoint
    ds: Dataset
    tmp: Path
    filled_tier: Path | None = None


# -- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--objects", type=int, default=2000, help="number of objects (default 2000)")
    p.add_argument("--object-kib", type=int, default=128, help="object size in KiB (default 128)")
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated subset, run in the default order; also {', '.join(GROUPS)}",
    )
    p.add_argument("--quick", action="store_true", help="200 objects: a smoke run")
    common.add_run_args(p, DEFAULT_JSON)
    common.add_store_profile_arg(p)
    args = p.parse_args(argv)
    if args.quick:
        args.objects = 200
    if args.objects < 1 or args.object_kib < 1 or args.repeat < 1:
        p.error("--objects, --object-kib and --repeat must be positive")
    asked = {m for name in args.modes.split(",") if name for m in GROUPS.get(name, (name,))}
    if asked - set(MODES):
        p.error(f"unknown --modes {sorted(asked - set(MODES))}; choose from {', '.join(MODES)}")
    args.modes = [m for m in MODES if m in asked]
    return args


# -- dataset -----------------------------------------------------------------------------------


def upload(client: Any, args: argparse.Namespace, tmp: Path) -> Dataset:
    """N random objects under one prefix, each also written to a local file."""
    bucket = f"tiercache-bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    local = tmp / "local"
    local.mkdir()
    size = args.object_kib * 1024

    def put(i: int) -> tuple[str, str]:
        data = os.urandom(size)
        key = f"small/obj-{i:06d}.bin"
        (local / f"obj-{i:06d}.bin").write_bytes(data)
        client.put_object(Bucket=bucket, Key=key, Body=data)
        return key, xxhash.xxh3_128_hexdigest(data)

    with ThreadPoolExecutor(16) as pool:
        keys, digests = zip(*pool.map(put, range(args.objects)), strict=True)
    return Dataset(bucket, list(keys), list(digests), size, str(local))


def read_all_once(client: Any, ds: Dataset) -> None:
    """Untimed: every object once, so that every mode finds the server in the same state."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.get_object(Bucket=ds.bucket, Key=k)["Body"].read(), ds.keys))


def delete_dataset(client: Any, ds: Dataset) -> None:
    for start in range(0, len(ds.keys), 1000):
        batch = [{"Key": k} for k in ds.keys[start : start + 1000]]
        client.delete_objects(Bucket=ds.bucket, Delete={"Objects": batch})
    client.delete_bucket(Bucket=ds.bucket)


def verify(mode: str, ds: Dataset, blobs: Sequence[Any]) -> None:
    if len(blobs) != len(ds.keys):
        raise VerifyError(f"{mode}: read {len(blobs)} objects, expected {len(ds.keys)}")
    for key, digest, data in zip(ds.keys, ds.digests, blobs, strict=True):
        if data is None or len(data) != ds.size or xxhash.xxh3_128_hexdigest(data) != digest:
            raise VerifyError(f"{mode}: {key}: the bytes read differ from the bytes stored")


# -- counting and timing -----------------------------------------------------------------------


def count_requests(client: Any) -> Counter[str]:
    """A Counter, kept up to date, of the HTTP attempts the (aio)botocore ``client`` sends."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def count(event_name: str, **kwargs: Any) -> None:
        with lock:
            counts[event_name.rsplit(".", 1)[-1]] += 1

    client.meta.events.register("before-send.s3", count)
    return counts


def timed(read: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = read()
    return time.perf_counter() - start, out


def store_requests(fs: Any) -> Counter[str]:
    return Counter(fs.stats()["store_requests"])


def read_whole(fs: Any, path: str) -> bytes:
    with fs.open(path, "rb") as f:
        data: bytes = f.read()
    return data


def cat_in_order(fs: Any, ds: Dataset) -> list[Any]:
    """``fs.cat`` of every path (one call), its answers in the dataset's order."""
    found = fs.cat(ds.paths)
    return [found.get(p) for p in ds.paths]


# -- baselines ---------------------------------------------------------------------------------


def boto3_pool64(ctx: Context) -> Sample:
    client = common.make_client(ctx.endpoint, pool=POOL)
    client.head_bucket(Bucket=ctx.ds.bucket)  # build and connect outside the timer
    counts = count_requests(client)

    def get(key: str) -> bytes:
        data: bytes = client.get_object(Bucket=ctx.ds.bucket, Key=key)["Body"].read()
        return data  # read to its end: the connection goes back to the pool

    with ThreadPoolExecutor(POOL) as pool:
        seconds, blobs = timed(lambda: list(pool.map(get, ctx.ds.keys)))
    return Sample(seconds, dict(counts), blobs)


def s3fs_cat(ctx: Context) -> Sample:
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **ctx.endpoint.target_options())
    fs.info(ctx.ds.paths[0])  # connect outside the timer
    counts = count_requests(fs.s3)
    seconds, blobs = timed(lambda: cat_in_order(fs, ctx.ds))
    return Sample(seconds, dict(counts), blobs)


def local_files(ctx: Context) -> Sample:
    for path in ctx.ds.local_paths:
        path.read_bytes()  # page cache warm
    # In a new process, as the warm tiercache modes are: in this one, the memory the last
    # mode freed served the reads in some runs (2x as fast) and fresh pages in others.
    return child_sample(ctx, {"dataset": asdict(ctx.ds), "reader": "local"}, "local_files")


# -- tiercache, cold ---------------------------------------------------------------------------


def tiercache_fs(endpoint: Endpoint, local_dir: Path, ds: Dataset, **options: Any) -> Any:
    fs = fsspec.filesystem(
        "tiercache",
        target_options=endpoint.target_options(),
        local_dir=str(local_dir),
        local_max_bytes=2 * ds.total_bytes + 64 * MiB,
        skip_instance_cache=True,
        **options,
    )
    common.build_client_now(fs)
    return fs


def read_ahead_then_open(fs: Any, ds: Dataset) -> list[Any]:
    with fs.read_ahead(ds.paths) as order:
        return [read_whole(fs, p) for p in order.paths]


READERS: dict[str, Callable[[Any, Dataset], list[Any]]] = {
    "read_ahead": read_ahead_then_open,
    "cat": cat_in_order,
}


def cold_pass(ctx: Context, reader: str) -> Sample:
    """One read on a fresh tier; the first tier filled is kept for the warm modes."""
    tier = Path(tempfile.mkdtemp(prefix=f"{reader}-", dir=ctx.tmp))
    fs = tiercache_fs(ctx.endpoint, tier, ctx.ds, consistency=COLD_CONSISTENCY)
    before = store_requests(fs)
    seconds, blobs = timed(lambda: READERS[reader](fs, ctx.ds))
    fs.wait_fetches()  # publishing may finish after the last read: untimed
    sample = Sample(seconds, dict(store_requests(fs) - before), blobs, tier_stats(fs))
    if ctx.filled_tier is None and all(fs.is_cached(p) for p in ctx.ds.paths):
        ctx.filled_tier = tier
    # Kept until the run ends, not removed now: ext4 skips recently freed inodes when it
    # allocates one (``recently_deleted``), so thousands of files removed just before made
    # every file the next sample creates cost 3-30 times as much, a cost only that sample's
    # client paid (the plain clients create no files), and more with every repeat.
    return sample


def tier_stats(fs: Any) -> dict[str, Any]:
    s = fs.stats()
    keys = ("hits", "misses", "prefetched", "prefetch_used", "readahead_deepened")
    return {"tier_stats": {k: s.get(k) for k in (*keys, "reader_wait_seconds")}}


class PathDataset:
    """Map-style: item i is object i, read whole through tiercache in the worker's process."""

    def __init__(self, paths: list[str], storage_options: dict[str, Any]) -> None:
        self.paths = paths
        self.storage_options = storage_options
        self._fs: Any = None
        self._pid = 0

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, bytes, int, dict[str, int]]:
        if self._pid != os.getpid():  # built in each worker, never inherited
            url = f"tiercache::s3://{self.paths[0]}"
            self._fs, _ = fsspec.core.url_to_fs(url, **self.storage_options)
            self._pid = os.getpid()
        data = read_whole(self._fs, self.paths[i])
        return i, data, self._pid, self._fs.store.request_counts()


def tiercache_dataloader_cold(ctx: Context) -> Sample:
    import torch.utils.data

    # More workers than cores is what this mode measures: the warning says only that.
    warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
    tier = Path(tempfile.mkdtemp(prefix="dataloader-", dir=ctx.tmp))
    options = {
        "s3": ctx.endpoint.target_options(),
        "tiercache": {"local_dir": str(tier), "consistency": COLD_CONSISTENCY},
    }
    dataset: Any = PathDataset(ctx.ds.paths, options)  # map-style: __getitem__ and __len__
    loader: Any = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=LOADER_WORKERS)
    blobs: list[Any] = [None] * len(ctx.ds.keys)
    per_worker: dict[int, dict[str, int]] = {}
    first: list[float] = []
    start = time.perf_counter()
    for i, data, pid, counts in loader:
        first = first or [time.perf_counter() - start]
        blobs[i], per_worker[pid] = data, counts
    seconds = time.perf_counter() - start
    requests = sum((Counter(c) for c in per_worker.values()), Counter())
    return Sample(seconds, dict(requests), blobs, {"first_item_s": round(first[0], 4)})


# -- tiercache, warm (each in a new process) ---------------------------------------------------


def ensure_filled(ctx: Context) -> Path:
    """The tier a cold mode filled, or one filled now (untimed) if no cold mode ran."""
    if ctx.filled_tier is None:
        cold_pass(ctx, "cat")
    if ctx.filled_tier is None:
        raise RuntimeError("could not fill a tier for the warm modes")
    return ctx.filled_tier


def warm_mode(ctx: Context, mode: str) -> Sample:
    spec = {
        "endpoint": ctx.endpoint.url,
        "dataset": asdict(ctx.ds),
        "local_dir": str(ensure_filled(ctx)),
        "consistency": "ttl" if "_ttl_" in mode else "immutable",
        "reader": "cat" if mode.endswith("_cat") else "read_ahead",
    }
    if spec["consistency"] == "ttl":
        time.sleep(TTL_S + 0.5)  # every entry's ttl has run out before the child starts
    return child_sample(ctx, spec, mode)


def child_sample(ctx: Context, spec: dict[str, Any], mode: str) -> Sample:
    """One read in a fresh process (``warm_child``)."""
    spec_path = ctx.tmp / f"{mode}.json"
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": ctx.endpoint.key,
        "AWS_SECRET_ACCESS_KEY": ctx.endpoint.secret,
        "AWS_DEFAULT_REGION": ctx.endpoint.region,
    }
    argv = [sys.executable, __file__, WARM_COMMAND, str(spec_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    if proc.returncode == VERIFY_EXIT:
        raise VerifyError(proc.stderr.strip())
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        last = proc.stderr.strip().splitlines()[-1:] or ["no message"]
        raise RuntimeError(f"warm child exited {proc.returncode}: {last[0]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return Sample(out["seconds"], out["requests"], extras=out["extras"])


def warm_child(spec_path: str) -> int:
    """The hidden sub-command: one warm read in this fresh process; one JSON line out."""
    spec = json.loads(Path(spec_path).read_text())
    ds = Dataset(**spec["dataset"])
    if spec["reader"] == "local":
        seconds, blobs = timed(lambda: [p.read_bytes() for p in ds.local_paths])
        try:
            verify("local files", ds, blobs)
        except VerifyError as exc:
            print(exc, file=sys.stderr)
            return VERIFY_EXIT
        print(json.dumps({"seconds": seconds, "requests": {}, "extras": {}}))
        return 0
    with common.s3_endpoint(spec["endpoint"], Path()) as endpoint:  # keys from AWS_* env vars
        fs = tiercache_fs(
            endpoint, Path(spec["local_dir"]), ds, consistency=spec["consistency"], ttl=TTL_S
        )
    before = store_requests(fs)
    seconds, blobs = timed(lambda: READERS[spec["reader"]](fs, ds))
    fs.wait_fetches()
    requests = dict(store_requests(fs) - before)
    try:
        verify(f"warm {spec['consistency']} {spec['reader']}", ds, blobs)
    except VerifyError as exc:
        print(exc, file=sys.stderr)
        return VERIFY_EXIT
    print(json.dumps({"seconds": seconds, "requests": requests, "extras": tier_stats(fs)}))
    return 0


# -- running the modes -------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[Context], Sample]] = {
    "boto3_pool64": boto3_pool64,
    "s3fs_cat": s3fs_cat,
    "local_files": local_files,
    "tiercache_read_ahead_cold": functools.partial(cold_pass, reader="read_ahead"),
    "tiercache_cat_cold": functools.partial(cold_pass, reader="cat"),
    "tiercache_dataloader_cold": tiercache_dataloader_cold,
}


def torch_missing() -> str | None:
    try:
        import torch.utils.data  # noqa: F401
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    return None


def run_mode(ctx: Context, mode: str) -> Sample:
    runner = RUNNERS.get(mode)
    sample = runner(ctx) if runner is not None else warm_mode(ctx, mode)
    if sample.blobs:
        verify(mode, ctx.ds, sample.blobs)
        sample.blobs = []
    return sample


def summarize(ds: Dataset, samples: list[Sample]) -> dict[str, Any]:
    seconds = statistics.median(s.seconds for s in samples)
    total = Counter[str]()
    for s in samples:
        total.update(s.requests)
    reads = len(ds.keys) * len(samples)
    return {
        "files": len(ds.keys),
        "bytes": ds.total_bytes,
        "seconds": round(seconds, 4),
        "files_s": round(len(ds.keys) / seconds, 1),
        "mib_s": round(ds.total_bytes / MiB / seconds, 1),
        "samples_s": [round(s.seconds, 4) for s in samples],
        "requests": dict(total),
        "requests_per_object": round(sum(total.values()) / reads, 3),
        "requests_per_object_by_op": {op: round(n / reads, 3) for op, n in sorted(total.items())},
        **samples[-1].extras,
    }


def ratio_rows(modes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """files/s of each cold mode over boto3_pool64's, of each warm mode over local_files'."""
    pairs = [(m, "boto3_pool64") for m in COLD] + [(m, "local_files") for m in WARM]
    rows = []
    for mode, ref in pairs:
        if "files_s" in modes.get(mode, {}) and "files_s" in modes.get(ref, {}):
            value = modes[mode]["files_s"] / modes[ref]["files_s"]
            rows.append({"name": f"{mode} / {ref}", "value": round(value, 3), "target": None})
    return rows


def benchmark(args: argparse.Namespace, endpoint: Endpoint, tmp: Path) -> dict[str, Any]:
    direct = common.make_client(endpoint, pool=16)
    ds = upload(direct, args, tmp)
    read_all_once(direct, ds)
    try:
        with common.remote_store(endpoint, args.store_profile, args.store_cores) as (
            store,
            profile,
        ):
            ctx = Context(args, store, ds, tmp)
            modes, skipped = run_modes(ctx)
    finally:
        if not endpoint.started_here:
            delete_dataset(direct, ds)
    skip = ("json", "plot", "store_profile", "endpoint")
    return {
        "params": {
            **{k: v for k, v in vars(args).items() if k not in skip},
            "ttl_s": TTL_S,
            "cold_consistency": COLD_CONSISTENCY,
            "dataloader_workers": LOADER_WORKERS,
            "statistic": "median",
            "store_profile": profile,
            "request_counter": REQUEST_COUNTER,
        },
        "machine": common.machine_info(endpoint),
        "modes": modes,
        "skipped": skipped,
        "ratios": ratio_rows(modes),
        "notes": list(NOTES),
    }


def run_modes(ctx: Context) -> tuple[dict[str, Any], dict[str, str]]:
    """Every mode asked for, --repeat times; a mode that fails is recorded and the run goes on
    (a byte that differs stops it)."""
    samples: dict[str, list[Sample]] = {}
    modes: dict[str, Any] = {}
    loader = "tiercache_dataloader_cold"
    skipped = {m: r for m in ctx.args.modes if m == loader and (r := torch_missing())}
    for mode, reason in skipped.items():
        print(f"  {mode}: skipped: {reason}", file=sys.stderr)
    for _ in range(ctx.args.repeat):
        for mode in (m for m in ctx.args.modes if m not in skipped and m not in modes):
            try:
                sample = run_mode(ctx, mode)
            except VerifyError:
                raise
            except Exception as exc:
                modes[mode] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  {mode}: ERROR {modes[mode]['error']}", file=sys.stderr)
                continue
            samples.setdefault(mode, []).append(sample)
            print(f"  {mode}: {len(ctx.ds.keys) / sample.seconds:,.1f} files/s", file=sys.stderr)
    for mode, taken in samples.items():
        modes[mode] = summarize(ctx.ds, taken)
    return {m: modes[m] for m in ctx.args.modes if m in modes}, skipped


# -- report ------------------------------------------------------------------------------------


def print_report(result: dict[str, Any]) -> None:
    p = result["params"]
    print(
        f"\ntiercache small-object benchmark: {p['objects']} objects x {p['object_kib']} KiB, "
        f"each read whole, median of {p['repeat']} repeat(s)"
    )
    print(common.describe_profile(p["store_profile"]) + "\n")
    print(f"{'mode':<36} {'seconds':>8} {'files/s':>9} {'MiB/s':>7} {'req/obj':>7}  by operation")
    for mode, row in result["modes"].items():
        if "error" in row:
            print(f"{mode:<36} ERROR {row['error']}")
            continue
        ops = ", ".join(f"{op} {n:g}" for op, n in row["requests_per_object_by_op"].items())
        print(
            f"{mode:<36} {row['seconds']:>8.3f} {row['files_s']:>9,.1f} {row['mib_s']:>7.1f} "
            f"{row['requests_per_object']:>7.3g}  {ops or '-'}"
        )
    for mode, reason in result["skipped"].items():
        print(f"{mode:<36} skipped: {reason}")
    common.print_ratio_rows(result["ratios"], 50)
    common.print_notes(result["notes"])


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [WARM_COMMAND]:
        return warm_child(argv[1])
    results: list[dict[str, Any]] = []

    def run(args: argparse.Namespace, endpoint: Endpoint, tmp: Path) -> dict[str, Any]:
        results.append(benchmark(args, endpoint, tmp))
        return results[-1]

    status = common.run_main(
        parse_args(argv), "tiercache-small-", run, print_report, chart=plot.small_objects_chart
    )
    failed = [m for r in results for m, row in r["modes"].items() if "error" in row]
    if status == 0 and failed:
        print(f"\nFAILED: mode(s) {', '.join(failed)} raised errors", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
