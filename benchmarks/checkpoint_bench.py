"""Checkpoint-write benchmark: close() blocking and time-to-durable, tiercache vs local and S3."""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import common
import fsspec
import plot
import xxhash
from boto3.s3.transfer import TransferConfig
from common import REPO, Endpoint, MiB, VerifyError

DEFAULT_JSON = REPO / "benchmarks" / "results" / "checkpoint_bench.json"
CHUNK = 8 * MiB  # write size, as torch.save / DCP file writers issue them
FLUSH_TIMEOUT_S = 600.0
MODES = (
    "local_write_nofsync",
    "local_write_fsync",
    "tiercache",
    "tiercache_through",
    "fsspec_s3",
    "boto3_upload_fileobj",
    "boto3_upload_fileobj_parallel",
    "boto3_upload_fileobj_c32",
)
BOTO3_MODES = tuple(m for m in MODES if m.startswith("boto3"))
# With --shared-dir: a plain write + fsync into that filesystem, and tiercache staging its
# writes behind there (write_tier="shared").
SHARED_MODES = ("shared_write_fsync", "tiercache_shared")
HIGH_CONCURRENCY = 32  # boto3_upload_fileobj_c32: parts in flight per file

NOTES = (
    "With --shared-dir: shared_write_fsync = local_write_fsync into a fresh directory of that "
    "filesystem; tiercache_shared = tiercache with write_tier='shared', its shared tier a fresh "
    "directory there (close() returns once the bytes and the journal record are durable there). "
    "The two run after the other modes, in turns: each goes first every other repeat.",
    "A checkpoint = --files files of random bytes (generated once, kept in memory), each written "
    "sequentially in 8 MiB writes; every mode writes the same bytes.",
    "block_s = wall time from the first open to the last close() returning (the time a training "
    "step is stalled); durable_s = wall time from the first open until every file is durable: "
    "on local disk (fsync of files and directory) or in the object store.",
    "tiercache (write_mode='behind'): durable_s ends when fs.flush(prefix) returns; "
    "fs.flush polls the journal every 50 ms, so durable_s carries up to 50 ms of polling. "
    "Afterwards fs.pending() must be [] and every object is read back with plain boto3.",
    "tiercache_through, fsspec_s3 and the boto3 modes are synchronous: block_s = durable_s.",
    "write_s = seconds inside write() calls (tiercache hashes with xxh3 there); close_s = seconds "
    "inside close() (local_write_fsync: fsync + close of each file).",
    "boto3_upload_fileobj = client.upload_fileobj(io.BytesIO(data)) per file, default "
    "TransferConfig (8 MiB parts, 10 in flight); _parallel uploads all files at once, one "
    "thread each; _c32 also uploads all files at once, each with TransferConfig("
    "max_concurrency=32) through a client with a pool of 32 connections per file (the "
    "best-configured plain client). The durable target's baseline is the fastest boto3 mode.",
    "--store-profile runs every S3 mode through scripts/remote_store.py (the profile's numbers "
    "in params.store_profile; proxy_cpu_s = its CPU over the timed section); the untimed "
    "warm-up, the read-back verification and cleanup go straight to the server.",
    "boto3 baseline clients use request/response_checksum_calculation/validation="
    "'when_required', as tiercache's own client does, so neither side computes CRCs; "
    "fsspec_s3 (s3fs) runs with its defaults.",
    "Every S3 mode writes under a fresh prefix of one bucket (a new SeaweedFS bucket is a new "
    "collection whose first write allocates volumes); the bucket is warmed up untimed.",
    "local_write_nofsync is a calibration, not a target: the same writes with no fsync, i.e. "
    "the page-cache fill every mode pays. Page-cache fills on this VM are slow and variable "
    "(read_bench's local_write measured 0.2-2.7 CPU-s per GiB).",
    "Before every mode (untimed, unless --no-prime) the checkpoint's size plus 64 MiB is "
    "written to a scratch file and deleted: on this VM memory left free for a few seconds is "
    "taken back by the hypervisor and the first write into it costs several times a normal "
    "page-cache write, so whichever mode came first after a pause paid for it "
    "(common.prime_page_cache; prime_seconds in the JSON shows that cost).",
    "os.sync() runs (untimed) before every mode so that no mode pays another's writeback; "
    "objects and local files of a mode are deleted (untimed) after they were verified.",
    "cpu_s = CPU seconds of this process (all threads: uploaders included) and srv_cpu_s = CPU "
    "seconds of the S3 server it started, both over the timed section (to durable).",
    "Reported value per mode and column = median over --repeat samples (columns independently).",
)


@dataclass(frozen=True)
class CheckpointFile:
    name: str
    data: bytes
    digest: str


@dataclass(frozen=True)
class Timing:
    """One timed checkpoint write."""

    block_s: float
    durable_s: float
    write_s: float | None = None
    close_s: float | None = None
    per_file: tuple[tuple[float, float], ...] = ()  # (write_s, close_s) of each file


@dataclass(frozen=True)
class Sample:
    timing: Timing
    cpu_s: float
    srv_cpu_s: float
    proxy_cpu_s: float


@dataclass
class Context:
    """Everything a timed pass needs."""

    args: argparse.Namespace
    endpoint: Endpoint  # the store as the profile emulates it: every timed request goes here
    client: Any  # straight to the server: warm-up, verification and cleanup (untimed)
    store_client: Any  # through ``endpoint``: the boto3 modes
    bucket: str
    files: list[CheckpointFile]
    tmp: Path
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(len(f.data) for f in self.files)

    def fresh_dir(self, label: str, shared: bool = False) -> Path:
        """A new directory in the local temporary one, or (``shared``) in --shared-dir."""
        where = self.args.shared_dir if shared else self.tmp
        return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=where))

    def fresh_prefix(self, mode: str) -> str:
        return f"checkpoints/{mode}-{uuid.uuid4().hex[:8]}"


# -- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--files", type=int, default=4, help="files per checkpoint (default 4)")
    p.add_argument("--total-mib", type=float, default=1024, help="checkpoint MiB (default 1024)")
    common.add_run_args(p, DEFAULT_JSON)
    common.add_store_profile_arg(p)
    p.add_argument("--quick", action="store_true", help="4 files, 64 MiB in all: a smoke run")
    p.add_argument(
        "--no-prime",
        action="store_true",
        help="do not prime the page cache before each mode (see the notes printed)",
    )
    p.add_argument(
        "--shared-dir",
        metavar="DIR",
        help="also write plain files with fsync into DIR, a shared filesystem (a CephFS "
        "mount), and stage tiercache's writes there (write_tier='shared'): the blocking time "
        "of the one held against the other",
    )
    args = p.parse_args(argv)
    if args.shared_dir is not None and not os.path.isdir(args.shared_dir):
        p.error(f"--shared-dir {args.shared_dir} is not a directory")
    if args.quick:
        args.files, args.total_mib = 4, 64
    if args.files < 1 or args.total_mib <= 0 or args.repeat < 1:
        p.error("--files, --total-mib and --repeat must be positive")
    if int(args.total_mib * MiB) < args.files:
        p.error("--total-mib is too small for --files")
    return args


# -- server, client, data ----------------------------------------------------------------------


def make_files(args: argparse.Namespace) -> list[CheckpointFile]:
    """K files of random bytes (the first takes the remainder) and their xxh3_128 digests."""
    total = int(args.total_mib * MiB)
    sizes = [total // args.files] * args.files
    sizes[0] += total - sum(sizes)
    files = []
    for i, size in enumerate(sizes):
        data = os.urandom(size)
        files.append(CheckpointFile(f"__{i}_0.distcp", data, xxhash.xxh3_128_hexdigest(data)))
    return files


def warm_up(ctx: Context) -> None:
    """Untimed: a multipart upload, so the bucket's volumes exist before any timed write."""
    data = ctx.files[0].data[: 4 * CHUNK]
    ctx.client.upload_fileobj(io.BytesIO(data), ctx.bucket, "warmup/boto3.bin")
    delete_prefix(ctx, "warmup/")


def delete_prefix(ctx: Context, prefix: str) -> None:
    delete_keys(ctx.client, ctx.bucket, prefix)


def delete_keys(client: Any, bucket: str, prefix: str) -> None:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def delete_bucket(client: Any, bucket: str) -> None:
    delete_keys(client, bucket, "")
    client.delete_bucket(Bucket=bucket)


# -- verification ------------------------------------------------------------------------------


def chunks_of(read: Callable[[int], bytes]) -> Iterator[bytes]:
    while data := read(CHUNK):
        yield data


def check_bytes(mode: str, where: str, f: CheckpointFile, chunks: Iterator[bytes]) -> None:
    count, digest = common.count_and_digest(chunks)
    if count != len(f.data):
        raise VerifyError(f"{mode}: {where}: {count} bytes stored, expected {len(f.data)}")
    if digest != f.digest:
        raise VerifyError(f"{mode}: {where}: digest mismatch, the stored bytes are wrong")


def verify_store(ctx: Context, mode: str, prefix: str) -> None:
    """Read every object back with plain boto3 and compare its digest."""
    for f in ctx.files:
        key = f"{prefix}/{f.name}"
        try:
            body = ctx.client.get_object(Bucket=ctx.bucket, Key=key)["Body"]
        except ctx.client.exceptions.NoSuchKey:
            raise VerifyError(f"{mode}: s3://{ctx.bucket}/{key} is not in the store") from None
        try:
            check_bytes(mode, f"s3://{ctx.bucket}/{key}", f, chunks_of(body.read))
        finally:
            body.close()


def verify_local(mode: str, files: list[CheckpointFile], out_dir: Path) -> None:
    for f in files:
        with open(out_dir / f.name, "rb") as fh:
            check_bytes(mode, str(out_dir / f.name), f, chunks_of(fh.read))


# -- timing ------------------------------------------------------------------------------------


def measure(ctx: Context, mode: str, run: Callable[[], Timing]) -> Timing:
    """Run one timed checkpoint write after an untimed os.sync() and page-cache priming;
    record it with its CPU time."""
    if not ctx.args.no_prime:
        primed = common.prime_page_cache(ctx.tmp, ctx.total_bytes + 64 * MiB)
        ctx.extras.setdefault("prime_seconds", {}).setdefault(mode, []).append(round(primed, 3))
    os.sync()
    pid, proxy_pid = ctx.endpoint.server_pid, ctx.endpoint.proxy_pid
    cpu0, srv0 = time.process_time(), common.server_cpu_seconds(pid)
    proxy0 = common.server_cpu_seconds(proxy_pid)
    timing = run()
    sample = Sample(
        timing,
        time.process_time() - cpu0,
        common.server_cpu_seconds(pid) - srv0,
        common.server_cpu_seconds(proxy_pid) - proxy0,
    )
    ctx.samples.setdefault(mode, []).append(sample)
    return timing


def write_all(
    ctx: Context, open_file: Callable[[str], Any], close_file: Callable[[Any], None]
) -> Timing:
    """Open, write in 8 MiB chunks and close every file in turn; block_s covers all of it."""
    start = time.perf_counter()
    per_file = []
    for f in ctx.files:
        handle = open_file(f.name)
        view = memoryview(f.data)
        t0 = time.perf_counter()
        for offset in range(0, len(view), CHUNK):
            handle.write(view[offset : offset + CHUNK])
        t1 = time.perf_counter()
        close_file(handle)
        per_file.append((t1 - t0, time.perf_counter() - t1))
    block = time.perf_counter() - start
    write_s, close_s = sum(w for w, _ in per_file), sum(c for _, c in per_file)
    return Timing(block, block, write_s, close_s, tuple(per_file))


# -- modes -------------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_local(ctx: Context, mode: str, fsync: bool, shared: bool = False) -> None:
    """Write into a fresh directory next to the tiers (``shared``: in --shared-dir); fsync
    each file and the directory."""
    out_dir = ctx.fresh_dir(mode, shared)

    def close(handle: Any) -> None:
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
        handle.close()

    def open_new(name: str) -> Any:
        return open(out_dir / name, "xb")  # write_all closes it (timed)

    def run() -> Timing:
        start = time.perf_counter()
        timing = write_all(ctx, open_new, close)
        if fsync:
            fsync_dir(out_dir)
        total = time.perf_counter() - start
        return dataclasses.replace(timing, block_s=total, durable_s=total)

    try:
        measure(ctx, mode, run)
        verify_local(mode, ctx.files, out_dir)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def make_tiercache_fs(
    ctx: Context, local_dir: Path, write_mode: str, shared_dir: Path | None = None
) -> Any:
    budget = 4 * ctx.total_bytes + 64 * MiB  # the dirty budget (half of it) never throttles
    staging: dict[str, Any] = {}
    if shared_dir is not None:
        staging = {"shared_dir": str(shared_dir), "shared_max_bytes": budget}
        staging["write_tier"] = "shared"
    fs = fsspec.filesystem(
        "tiercache",
        local_dir=str(local_dir),
        target_options=ctx.endpoint.target_options(),
        skip_instance_cache=True,
        local_max_bytes=budget,
        write_mode=write_mode,
        **staging,
    )
    common.build_client_now(fs)
    return fs


def check_nothing_pending(mode: str, fs: Any) -> None:
    pending = fs.pending()
    if pending:
        raise VerifyError(f"{mode}: fs.pending() is not empty after flush: {pending}")


def run_tiercache(ctx: Context, mode: str, write_mode: str, shared: bool = False) -> None:
    """Write through a fresh tier (``shared``: staged on a fresh shared tier in --shared-dir);
    time until the last close() and until fs.flush returns."""
    tier_dir = ctx.fresh_dir(mode)
    shared_dir = ctx.fresh_dir(mode, shared=True) if shared else None
    fs = make_tiercache_fs(ctx, tier_dir, write_mode, shared_dir)
    prefix = ctx.fresh_prefix(mode)
    root = f"{ctx.bucket}/{prefix}"

    def run() -> Timing:
        start = time.perf_counter()
        timing = write_all(ctx, lambda name: fs.open(f"{root}/{name}", "wb"), lambda h: h.close())
        fs.flush(root, timeout=FLUSH_TIMEOUT_S)
        return dataclasses.replace(timing, durable_s=time.perf_counter() - start)

    try:
        measure(ctx, mode, run)
        check_nothing_pending(mode, fs)
        verify_store(ctx, mode, prefix)
        ctx.extras.setdefault("tiercache_stats", {})[mode] = fs.stats()
    finally:
        delete_prefix(ctx, prefix)
        shutil.rmtree(tier_dir, ignore_errors=True)
        if shared_dir is not None:
            shutil.rmtree(shared_dir, ignore_errors=True)


def run_fsspec_s3(ctx: Context, mode: str, s3: Any) -> None:
    prefix = ctx.fresh_prefix(mode)
    root = f"{ctx.bucket}/{prefix}"
    try:
        measure(
            ctx,
            mode,
            lambda: write_all(
                ctx, lambda name: s3.open(f"{root}/{name}", "wb"), lambda h: h.close()
            ),
        )
        verify_store(ctx, mode, prefix)
    finally:
        delete_prefix(ctx, prefix)


def run_boto3(ctx: Context, mode: str, parallel: bool, client: Any, config: TransferConfig) -> None:
    """upload_fileobj of each file through ``client``: one after another, or all at once."""
    prefix = ctx.fresh_prefix(mode)

    def upload(f: CheckpointFile) -> None:
        key = f"{prefix}/{f.name}"
        client.upload_fileobj(io.BytesIO(f.data), ctx.bucket, key, Config=config)

    def run() -> Timing:
        start = time.perf_counter()
        if parallel:
            with ThreadPoolExecutor(len(ctx.files)) as pool:
                list(pool.map(upload, ctx.files))
        else:
            for f in ctx.files:
                upload(f)
        total = time.perf_counter() - start
        return Timing(total, total)

    try:
        measure(ctx, mode, run)
        verify_store(ctx, mode, prefix)
    finally:
        delete_prefix(ctx, prefix)


def run_repeat(ctx: Context, s3: Any, c32_client: Any) -> None:
    run_local(ctx, "local_write_nofsync", fsync=False)
    run_local(ctx, "local_write_fsync", fsync=True)
    run_tiercache(ctx, "tiercache", "behind")
    run_tiercache(ctx, "tiercache_through", "through")
    run_fsspec_s3(ctx, "fsspec_s3", s3)
    default = TransferConfig()
    run_boto3(ctx, "boto3_upload_fileobj", False, ctx.store_client, default)
    run_boto3(ctx, "boto3_upload_fileobj_parallel", True, ctx.store_client, default)
    high = TransferConfig(max_concurrency=HIGH_CONCURRENCY)
    run_boto3(ctx, "boto3_upload_fileobj_c32", True, c32_client, high)
    if ctx.args.shared_dir is not None:
        shared = [
            lambda: run_local(ctx, "shared_write_fsync", fsync=True, shared=True),
            lambda: run_tiercache(ctx, "tiercache_shared", "behind", shared=True),
        ]
        if len(ctx.samples.get("tiercache_shared", ())) % 2:
            shared.reverse()  # each goes first every other repeat: neither always follows S3
        for run in shared:
            run()


# -- results -----------------------------------------------------------------------------------


def median_of(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def sample_dict(sample: Sample) -> dict[str, Any]:
    raw = asdict(sample.timing) | {
        "cpu_s": sample.cpu_s,
        "srv_cpu_s": sample.srv_cpu_s,
        "proxy_cpu_s": sample.proxy_cpu_s,
    }
    return {name: rounded(value) for name, value in raw.items()}


def summarize(ctx: Context) -> dict[str, dict[str, Any]]:
    total = ctx.total_bytes
    modes = {}
    for mode in (*MODES, *SHARED_MODES):
        if mode not in ctx.samples:
            continue  # a shared mode without --shared-dir
        samples = ctx.samples[mode]
        durable = statistics.median(s.timing.durable_s for s in samples)
        modes[mode] = {
            "bytes": total,
            "block_s": median_of([s.timing.block_s for s in samples]),
            "durable_s": round(durable, 4),
            "durable_mib_s": round(total / MiB / durable, 1),
            "write_s": median_of([s.timing.write_s for s in samples]),
            "close_s": median_of([s.timing.close_s for s in samples]),
            "cpu_s": median_of([s.cpu_s for s in samples]),
            "srv_cpu_s": median_of([s.srv_cpu_s for s in samples])
            if ctx.endpoint.started_here
            else None,
            "proxy_cpu_s": median_of([s.proxy_cpu_s for s in samples])
            if ctx.endpoint.proxy_pid is not None
            else None,
            "samples": [sample_dict(s) for s in samples],
        }
    return modes


@dataclass(frozen=True)
class Ratio:
    """``numerator``'s ``column`` over the same column of the fastest of ``baselines``."""

    name: str
    numerator: str
    column: str
    baselines: tuple[str, ...]
    target: float | None = None  # met when the ratio is at most this


RATIOS = (
    Ratio(
        "tiercache block / local_write_fsync", "tiercache", "block_s", ("local_write_fsync",), 1.2
    ),
    Ratio("tiercache durable / fastest boto3", "tiercache", "durable_s", BOTO3_MODES, 1.2),
    *(Ratio(f"tiercache durable / {m}", "tiercache", "durable_s", (m,)) for m in BOTO3_MODES),
    Ratio("tiercache durable / fsspec_s3", "tiercache", "durable_s", ("fsspec_s3",)),
    Ratio("tiercache block / fsspec_s3", "tiercache", "block_s", ("fsspec_s3",)),
    Ratio("tiercache_through / fastest boto3", "tiercache_through", "durable_s", BOTO3_MODES),
    Ratio(
        "local_write_fsync / local_write_nofsync",
        "local_write_fsync",
        "durable_s",
        ("local_write_nofsync",),
    ),
    Ratio(
        "tiercache_shared block / shared_write_fsync",
        "tiercache_shared",
        "block_s",
        ("shared_write_fsync",),
        1.2,
    ),
    Ratio("tiercache_shared durable / fastest boto3", "tiercache_shared", "durable_s", BOTO3_MODES),
)


def ratios(modes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Time ratios (lower is better); the baseline is the fastest of the ratio's baselines."""
    rows = []
    for ratio in RATIOS:
        if ratio.numerator not in modes:
            continue  # the shared modes run only with --shared-dir
        baseline = min(ratio.baselines, key=lambda m: modes[m][ratio.column])
        value = modes[ratio.numerator][ratio.column] / modes[baseline][ratio.column]
        row: dict[str, Any] = {"name": ratio.name, "value": round(value, 3)}
        row |= {"target": ratio.target, "baseline": baseline}
        if ratio.target is not None:
            row["result"] = "PASS" if value <= ratio.target else "MISS"
        rows.append(row)
    return rows


def machine_note(endpoint: Endpoint) -> str:
    cores = len(os.sched_getaffinity(0))
    if endpoint.started_here:
        return (
            f"This machine has {cores} usable core(s) and shares them with the S3 server started "
            "here: uploads, verification and the server's own disk writes compete for them."
        )
    return f"This machine has {cores} usable core(s); the S3 server runs at {endpoint.url}."


def fmt(value: float | None, width: int, digits: int = 3) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def print_report(result: dict[str, Any]) -> None:
    params = result["params"]
    print(
        f"\ntiercache checkpoint benchmark: {params['files']} files, {params['total_mib']:g} MiB "
        f"in all, 8 MiB writes, median of {params['repeat']} repeat(s)"
    )
    print(common.describe_profile(params["store_profile"]) + "\n")
    head = (
        f"{'mode':<30} {'block_s':>8} {'durable_s':>9} {'MiB/s':>7} {'write_s':>7} {'close_s':>7}"
    )
    print(f"{head} {'cpu_s':>6} {'srv_cpu_s':>9} {'proxy_cpu_s':>11}")
    for mode, row in result["modes"].items():
        print(
            f"{mode:<30} {fmt(row['block_s'], 8)} {fmt(row['durable_s'], 9)} "
            f"{row['durable_mib_s']:>7.1f} {fmt(row['write_s'], 7)} {fmt(row['close_s'], 7)} "
            f"{fmt(row['cpu_s'], 6, 2)} {fmt(row['srv_cpu_s'], 9, 2)} "
            f"{fmt(row.get('proxy_cpu_s'), 11, 2)}"
        )
    print(f"\n{'ratio (seconds / seconds)':<52} {'value':>6} {'target':>7}  result  baseline")
    for row in result["ratios"]:
        target = f"<={row['target']:g}" if row["target"] is not None else ""
        result_text = row.get("result", "")
        print(
            f"{row['name']:<52} {row['value']:>6.3f} {target:>7}  {result_text:<6}  "
            f"{row['baseline']}"
        )
    common.print_notes(result["notes"])


# -- main --------------------------------------------------------------------------------------


def benchmark(args: argparse.Namespace, endpoint: Endpoint, tmp: Path) -> dict[str, Any]:
    files = make_files(args)
    pool = max(16, 10 * args.files)
    direct = common.make_client(endpoint, pool=pool)
    bucket = f"tiercache-ckpt-{uuid.uuid4().hex[:12]}"
    direct.create_bucket(Bucket=bucket)
    try:
        with common.remote_store(endpoint, args.store_profile, args.store_cores) as (
            store,
            profile,
        ):
            store_client = common.make_client(store, pool=pool)
            ctx = Context(args, store, direct, store_client, bucket, files, tmp)
            return benchmark_through(ctx, profile)
    finally:
        delete_bucket(direct, bucket)


def benchmark_through(ctx: Context, profile: dict[str, Any]) -> dict[str, Any]:
    """Every mode, its timed requests through ctx.endpoint (the store the profile emulates)."""
    args = ctx.args
    warm_up(ctx)
    s3 = fsspec.filesystem("s3", **ctx.endpoint.s3fs_options())
    s3.ls(ctx.bucket)  # instantiate and connect s3fs outside the timer
    c32 = common.make_client(ctx.endpoint, pool=HIGH_CONCURRENCY * len(ctx.files))
    for _ in range(args.repeat):
        run_repeat(ctx, s3, c32)
    modes = summarize(ctx)
    return {
        "params": {
            "files": args.files,
            "total_mib": args.total_mib,
            "chunk_mib": CHUNK // MiB,
            "repeat": args.repeat,
            "statistic": "median",
            "store_profile": profile,
            "shared_dir": args.shared_dir,
            "shared_filesystem": common.filesystem_type(args.shared_dir)
            if args.shared_dir
            else None,
        },
        "machine": common.machine_info(ctx.endpoint),
        "modes": modes,
        "ratios": ratios(modes),
        **ctx.extras,
        "notes": [machine_note(ctx.endpoint), *NOTES],
    }


def silence_removed_tier_scans(tmp: Path) -> None:
    """Hide one known traceback: a tiercache scan thread whose tier this script removed.

    tiercache's uploader threads outlive their filesystem (it has no close()), and the scan
    thread dies with FileNotFoundError once its journal directory is gone. Only that failure,
    for a directory under ``tmp``, is silenced; every other thread error is still printed.
    """
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        exc = args.exc_value
        if (
            args.thread is not None
            and args.thread.name == "tiercache-upload-scan"
            and isinstance(exc, FileNotFoundError)
            and str(exc.filename or "").startswith(str(tmp))
        ):
            return
        previous(args)

    threading.excepthook = hook


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return common.run_main(
        args,
        "tiercache-ckpt-bench-",
        benchmark,
        print_report,
        silence_removed_tier_scans,
        chart=plot.checkpoint_chart,
    )


if __name__ == "__main__":
    sys.exit(main())
