"""Sequential-read benchmark: tiercache cold/warm vs local files, boto3, s3fs and simplecache."""

from __future__ import annotations

import argparse
import functools
import io
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common
import fsspec
import plot
import xxhash
from boto3.s3.transfer import TransferConfig
from common import REPO, Endpoint, MiB, VerifyError

DEFAULT_JSON = REPO / "benchmarks" / "results" / "read_bench.json"
PUBLISH_TIMEOUT_S = 120.0

NOTES = (
    "Every shard is read sequentially in --chunk-mib chunks; the timer covers open + reads + "
    "close of each shard, verification (xxh3_128 of every byte) runs after the timer stops.",
    "The page cache is NOT dropped: local_raw reads page-cache-warm files, as tiercache_warm "
    "reads a page-cache-warm tier. local_raw is the ceiling for a warm cache hit.",
    "Before any timed pass every object is read once from S3 (untimed), so all S3 modes see the "
    "same warm server state.",
    "boto3_transfer_manager = client.download_fileobj into an io.BytesIO, default "
    "TransferConfig; the buffer is then verified (no chunked read of it is timed).",
    "boto3_transfer_manager_c32 = the same with TransferConfig(max_concurrency=32, "
    "multipart_chunksize=8 MiB) and a 32-connection pool. s3fs = a plain s3:// file of s3fs "
    "(its default block size and readahead cache), read in --chunk-mib chunks.",
    "The TransferManager clients keep response_checksum_validation='when_supported' when an "
    "object is read in several parts: with 'when_required' s3transfer skips its HEAD but asks "
    "for the first part alone and for the others only once it has arrived (8 x 32 MiB on "
    "s3-region: 45 MiB/s instead of 80). Ranged GETs carry no checksum, so no CRC is computed "
    "(common.make_transfer_client).",
    "--store-profile runs every mode through scripts/remote_store.py (a pacing proxy in its "
    "own process: latency per request, a rate per connection and one for all connections; "
    "params.store_profile has its numbers). Setup (upload, the untimed warm-up read, cleanup) "
    "goes straight to the server. proxy_cpu_s = CPU seconds of the proxy over the timed "
    "sections.",
    "The other boto3 baseline clients use request/response_checksum_calculation/validation="
    "'when_required', as tiercache's own client does, so neither side pays CRC checks.",
    "baseline_checks: transfer_manager_plain = boto3's defaults (client, TransferConfig) "
    "downloading every shard into memory in a new process (benchmarks/transfer_plain.py, which "
    "reads the first shard once untimed before) once per repeat, right before "
    "boto3_transfer_manager (right after it every other repeat) so that both see the same load; "
    "boto3_transfer_manager should be within 15% of it. link = N parallel ranged GETs of the "
    "first shard (plain get_object, one thread each, N = 1, 2, 4, 8, best of 3), held against "
    "min(N x the per-connection rate, the aggregate rate); its MiB/s run from the first "
    "response head to the last byte. A FAIL is reported, not fatal.",
    "threads_at_start = live threads of this process when each pass starts.",
    "Cold modes use a fresh, empty cache directory per repeat; tiercache_warm is the second "
    "pass over the tiercache_cold filesystem, after every entry was published.",
    "tiercache_warm trusts the files its own process fetched (no digest check, verify='first'). "
    "tiercache_warm_checked reads the same tier with this process's trust forgotten before "
    "each shard (untimed), as a new process would: every shard is checked against its xxh3 "
    "digest (a worker hashes it ahead of the reader; the read of its last bytes waits for the "
    "verdict); verify_checks in stats_after_warm_checked proves it. tiercache_warm_reboot "
    "reads it through a filesystem with verify='reboot' (no check: the old default). The two "
    "run in alternating order.",
    "Reported value per mode = median seconds over --repeat samples. The S3 modes run in a "
    "rotated order (each repeat starts one mode further on), so that no mode always follows "
    "the same one: the machine still settles what an earlier pass left (deleted files, freed "
    "memory) during the next.",
    "local_write is a calibration, not a read: each shard written into a new local file in 1 MiB "
    "pwrites (no fsync), i.e. the page-cache fill that every cold cache mode must also do.",
    "os.sync() runs (untimed) before every pass so that no pass pays another's writeback.",
    "Before each shard (untimed, unless --no-prime) twice its size is written to a scratch file "
    "that is deleted at once: on a VM that reports free memory to its host, memory left free a few "
    "seconds is taken back and the first write into it costs ~7x a page-cache write (1.6 s vs "
    "0.2 s per GiB measured here). Every mode gets the same freshly used pages, so cold cache "
    "modes are not charged for the hypervisor. prime_seconds in the JSON shows that cost.",
    "cpu_s = CPU seconds of this process (all threads, fetch threads included) and srv_cpu_s = "
    "CPU seconds of the S3 server it started, both summed over the timed sections.",
)


@dataclass(frozen=True)
class Shard:
    key: str
    path: str
    size: int
    digest: str


@dataclass
class Dataset:
    bucket: str
    shards: list[Shard]

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)


@dataclass
class Context:
    """Everything a timed pass needs."""

    args: argparse.Namespace
    endpoint: Endpoint
    client: Any
    dataset: Dataset
    tmp: Path
    samples: dict[str, list[float]] = field(default_factory=dict)
    plain: list[tuple[float, float]] = field(default_factory=list)  # (seconds, cpu_s)
    cpu: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def chunk(self) -> int:
        return int(self.args.chunk_mib * MiB)

    def fresh_dir(self, label: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=self.tmp))


Reader = Callable[[Shard], list[Any]]

# -- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shards", type=int, default=16, help="number of objects (default 16)")
    p.add_argument("--shard-mib", type=float, default=64, help="object size in MiB (default 64)")
    p.add_argument("--chunk-mib", type=float, default=8, help="read size in MiB (default 8)")
    common.add_run_args(p, DEFAULT_JSON)
    common.add_store_profile_arg(p)
    p.add_argument(
        "--concurrency",
        default="1,8",
        help="extra tiercache_cold_cN modes with fetch_concurrency=N ('' for none)",
    )
    p.add_argument("--quick", action="store_true", help="4 shards x 16 MiB smoke run")
    p.add_argument(
        "--no-prime",
        action="store_true",
        help="do not prime the page cache before each pass (see the notes printed)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.shard_mib = 4, 16
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if args.shards < 1 or args.shard_mib <= 0 or args.chunk_mib <= 0 or args.repeat < 1:
        p.error("--shards, --shard-mib, --chunk-mib and --repeat must be positive")
    return args


# -- server, client, dataset -------------------------------------------------------------------


def build_dataset(client: Any, args: argparse.Namespace, tmp: Path) -> Dataset:
    """Upload N random shards and keep a local copy and an xxh3_128 digest of each."""
    bucket = f"tiercache-bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    local = tmp / "local"
    local.mkdir()
    size = int(args.shard_mib * MiB)

    def make(i: int) -> Shard:
        data = os.urandom(size)
        key = f"shards/shard-{i:05d}.bin"
        path = local / f"shard-{i:05d}.bin"
        path.write_bytes(data)
        client.put_object(Bucket=bucket, Key=key, Body=data)
        return Shard(key, str(path), size, xxhash.xxh3_128_hexdigest(data))

    with ThreadPoolExecutor(4) as pool:
        shards = list(pool.map(make, range(args.shards)))
    return Dataset(bucket, shards)


def delete_dataset(client: Any, dataset: Dataset) -> None:
    keys = [{"Key": s.key} for s in dataset.shards]
    for start in range(0, len(keys), 1000):
        client.delete_objects(Bucket=dataset.bucket, Delete={"Objects": keys[start : start + 1000]})
    client.delete_bucket(Bucket=dataset.bucket)


def warm_up_s3(ctx: Context, client: Any) -> None:
    """Read every object once (untimed, with ``client``: straight to the server) so that all S3
    modes see the same server state."""
    for shard in ctx.dataset.shards:
        body = client.get_object(Bucket=ctx.dataset.bucket, Key=shard.key)["Body"]
        while body.read(ctx.chunk):
            pass
        body.close()
    # Instantiate (and connect) the s3fs filesystem that simplecache reuses from fsspec's cache.
    fsspec.filesystem("s3", **ctx.endpoint.target_options()).ls(ctx.dataset.bucket)


# -- readers (one per mode) --------------------------------------------------------------------


def drain(f: Any, chunk: int) -> list[Any]:
    chunks = []
    while data := f.read(chunk):
        chunks.append(data)
    return chunks


def local_reader(ctx: Context) -> Reader:
    def read(shard: Shard) -> list[Any]:
        with open(shard.path, "rb") as f:
            return drain(f, ctx.chunk)

    return read


def get_object_reader(ctx: Context) -> Reader:
    def read(shard: Shard) -> list[Any]:
        body = ctx.client.get_object(Bucket=ctx.dataset.bucket, Key=shard.key)["Body"]
        try:
            return drain(body, ctx.chunk)
        finally:
            body.close()

    return read


def transfer_manager_reader(ctx: Context, config: TransferConfig, client: Any) -> Reader:
    def read(shard: Shard) -> list[Any]:
        buf = io.BytesIO()
        client.download_fileobj(ctx.dataset.bucket, shard.key, buf, Config=config)
        return [buf.getbuffer()]

    return read


def s3fs_reader(ctx: Context) -> Reader:
    fs = fsspec.filesystem("s3", **ctx.endpoint.target_options())

    def read(shard: Shard) -> list[Any]:
        with fs.open(f"{ctx.dataset.bucket}/{shard.key}", "rb") as f:
            return drain(f, ctx.chunk)

    return read


def simplecache_reader(ctx: Context, cache_dir: Path) -> Reader:
    def read(shard: Shard) -> list[Any]:
        url = f"simplecache::s3://{ctx.dataset.bucket}/{shard.key}"
        opts = {
            "s3": ctx.endpoint.target_options(),
            "simplecache": {"cache_storage": str(cache_dir)},
        }
        with fsspec.open(url, "rb", **opts) as f:
            return drain(f, ctx.chunk)

    return read


def tiercache_reader(ctx: Context, fs: Any) -> Reader:
    def read(shard: Shard) -> list[Any]:
        with fs.open(f"{ctx.dataset.bucket}/{shard.key}", "rb") as f:
            return drain(f, ctx.chunk)

    return read


# -- timing and verification -------------------------------------------------------------------


def verify(mode: str, shard: Shard, chunks: list[Any]) -> None:
    count, digest = common.count_and_digest(chunks)
    if count != shard.size:
        raise VerifyError(f"{mode}: {shard.key}: read {count} bytes, expected {shard.size}")
    if digest != shard.digest:
        raise VerifyError(f"{mode}: {shard.key}: digest mismatch, the bytes read are wrong")


def timed_pass(
    ctx: Context, mode: str, reader: Reader, stage: Callable[[Shard], None] | None = None
) -> float:
    """Read every shard; return the summed per-shard seconds (verification excluded).

    Dirty pages of earlier phases are flushed first (``os.sync``, untimed) so that no pass pays
    for another's writeback. Before each shard's timer starts, untimed, the page cache is primed
    (``common.prime_page_cache``) and ``stage`` runs. Also sums the CPU seconds of this
    process (all threads) and of the S3 server over the timed sections.
    """
    os.sync()
    ctx.extras.setdefault("threads_at_start", {}).setdefault(mode, []).append(
        threading.active_count()
    )
    total = client_cpu = server_cpu = proxy_cpu = primed = 0.0
    pid, proxy_pid = ctx.endpoint.server_pid, ctx.endpoint.proxy_pid
    for shard in ctx.dataset.shards:
        if not ctx.args.no_prime:
            primed += common.prime_page_cache(ctx.tmp, 2 * shard.size + 16 * MiB)
        if stage is not None:
            stage(shard)
        cpu0, srv0 = time.process_time(), common.server_cpu_seconds(pid)
        proxy0 = common.server_cpu_seconds(proxy_pid)
        start = time.perf_counter()
        chunks = reader(shard)
        total += time.perf_counter() - start
        client_cpu += time.process_time() - cpu0
        server_cpu += common.server_cpu_seconds(pid) - srv0
        proxy_cpu += common.server_cpu_seconds(proxy_pid) - proxy0
        verify(mode, shard, chunks)
        del chunks
    ctx.samples.setdefault(mode, []).append(total)
    ctx.extras.setdefault("prime_seconds", {}).setdefault(mode, []).append(round(primed, 3))
    ctx.cpu.setdefault(mode, []).append((client_cpu, server_cpu, proxy_cpu))
    return total


def local_write_pass(ctx: Context) -> None:
    """Calibration: write each shard into a new local file in 1 MiB pwrites, as a tier fill does.

    No network and no fsync: it shows what filling the page cache costs on this machine, a cost
    that every cold cache mode (simplecache, tiercache) pays and boto3 into memory does not.
    """
    out_dir = ctx.fresh_dir("local-write")
    staged: dict[str, bytes] = {}

    def stage(shard: Shard) -> None:
        staged["data"] = Path(shard.path).read_bytes()

    def write(shard: Shard) -> list[Any]:
        data = staged.pop("data")
        view = memoryview(data)
        fd = os.open(out_dir / Path(shard.path).name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for offset in range(0, len(data), MiB):
                os.pwrite(fd, view[offset : offset + MiB], offset)
        finally:
            os.close(fd)
        return [data]

    timed_pass(ctx, "local_write", write, stage)
    shutil.rmtree(out_dir)


def transfer_plain_pass(ctx: Context) -> None:
    """The reference of boto3_transfer_manager: boto3's defaults in a process of their own."""
    os.sync()
    rows = common.run_transfer_plain(
        ctx.endpoint, ctx.dataset.bucket, [s.key for s in ctx.dataset.shards]
    )
    for shard, row in zip(ctx.dataset.shards, rows, strict=True):
        if row["bytes"] != shard.size or row["digest"] != shard.digest:
            raise VerifyError(f"transfer_manager_plain: {shard.key}: bytes differ")
    ctx.plain.append((sum(r["seconds"] for r in rows), sum(r["cpu_s"] for r in rows)))


# -- tiercache ---------------------------------------------------------------------------------


def make_tiercache_fs(
    ctx: Context, local_dir: Path, concurrency: int | None, verify: str | None = None
) -> Any:
    options: dict[str, Any] = {
        "local_dir": str(local_dir),
        "consistency": "immutable",
        "local_max_bytes": 2 * ctx.dataset.total_bytes + 64 * MiB,
    }
    if concurrency is not None:
        options["fetch_concurrency"] = concurrency
    if verify is not None:
        options["verify"] = verify
    fs = fsspec.filesystem(
        "tiercache",
        target_options=ctx.endpoint.target_options(),
        skip_instance_cache=True,
        **options,
    )
    common.build_client_now(fs)
    return fs


def wait_published(ctx: Context, fs: Any) -> float:
    """Seconds until every shard is published in the tier (fetch threads finish after reads)."""
    start = time.perf_counter()
    paths = [f"{ctx.dataset.bucket}/{s.key}" for s in ctx.dataset.shards]
    while not all(fs.is_cached(p) for p in paths):
        if time.perf_counter() - start > PUBLISH_TIMEOUT_S:
            raise RuntimeError("tiercache did not publish every shard within the timeout")
        time.sleep(0.005)
    return time.perf_counter() - start


def tiercache_cold(ctx: Context, mode: str, concurrency: int | None) -> tuple[Any, Path]:
    """A cold pass on a fresh tier; returns the filesystem (now warm) and its directory."""
    local_dir = ctx.fresh_dir(mode)
    fs = make_tiercache_fs(ctx, local_dir, concurrency)
    timed_pass(ctx, mode, tiercache_reader(ctx, fs))
    lag = wait_published(ctx, fs)
    ctx.extras.setdefault("publish_lag_s", {}).setdefault(mode, []).append(round(lag, 4))
    ctx.extras.setdefault("stats_after_cold", {})[mode] = fs.stats()
    return fs, local_dir


def check_chained_url(ctx: Context) -> dict[str, Any]:
    """Untimed: read one shard through ``tiercache::s3://`` and verify it."""
    shard = ctx.dataset.shards[0]
    opened = fsspec.open(
        f"tiercache::s3://{ctx.dataset.bucket}/{shard.key}",
        "rb",
        s3=ctx.endpoint.target_options(),
        tiercache={"local_dir": str(ctx.fresh_dir("chained")), "consistency": "immutable"},
    )
    with opened as f:
        verify("chained_url", shard, drain(f, ctx.chunk))
    fs_class = type(opened.fs).__name__
    if fs_class != "TierCacheFileSystem":
        raise VerifyError(f"chained_url: opened through {fs_class}, not TierCacheFileSystem")
    return {"url": f"tiercache::s3://{ctx.dataset.bucket}/{shard.key}", "fs": fs_class, "ok": True}


def warm_checked_pass(ctx: Context, fs: Any) -> None:
    """Warm, with every shard's digest checked: this process's trust is forgotten (untimed)
    before each shard, as if a new process read it."""
    before = fs.stats()["verify_checks"]

    def forget(shard: Shard) -> None:
        fs.read_path.verifier.forget_all()

    timed_pass(ctx, "tiercache_warm_checked", tiercache_reader(ctx, fs), forget)
    stats = fs.stats()
    if stats["verify_checks"] - before != len(ctx.dataset.shards) or stats["verify_failures"]:
        raise VerifyError(f"tiercache_warm_checked: not one check per shard: {stats}")
    ctx.extras["stats_after_warm_checked"] = stats


def warm_reboot_pass(ctx: Context, tier_dir: Path) -> None:
    """Warm through a filesystem with ``verify="reboot"`` (no digest check) on the same tier."""
    fs = make_tiercache_fs(ctx, tier_dir, None, verify="reboot")
    timed_pass(ctx, "tiercache_warm_reboot", tiercache_reader(ctx, fs))
    stats = fs.stats()
    if stats["verify_checks"] or stats["misses"]:
        raise VerifyError(f"tiercache_warm_reboot: checked or fetched: {stats}")
    ctx.extras["stats_after_warm_reboot"] = stats


# -- one repeat of every mode ------------------------------------------------------------------


def run_repeat(ctx: Context, index: int) -> None:
    """One sample of every mode; the S3 modes start one place further on each repeat."""
    timed_pass(ctx, "local_raw", local_reader(ctx))
    local_write_pass(ctx)
    s3_modes = s3_passes(ctx)
    shift = index % len(s3_modes)
    for run_pass in s3_modes[shift:] + s3_modes[:shift]:
        run_pass()


def s3_passes(ctx: Context) -> list[Callable[[], object]]:
    """The S3 modes, each a callable that runs its pass(es) and removes what it cached."""

    def simplecache_pass() -> None:
        cache_dir = ctx.fresh_dir("simplecache")
        timed_pass(ctx, "fsspec_simplecache_cold", simplecache_reader(ctx, cache_dir))
        shutil.rmtree(cache_dir)

    def tiercache_concurrency_pass(n: int) -> None:
        _fs, tier_dir = tiercache_cold(ctx, f"tiercache_cold_c{n}", n)
        shutil.rmtree(tier_dir)

    def tiercache_pass() -> None:  # cold, then warm on the same (now full) tier
        fs, tier_dir = tiercache_cold(ctx, "tiercache_cold", None)
        timed_pass(ctx, "tiercache_warm", tiercache_reader(ctx, fs))
        ctx.extras["stats_after_warm"] = fs.stats()
        warm_passes = [
            functools.partial(warm_checked_pass, ctx, fs),
            functools.partial(warm_reboot_pass, ctx, tier_dir),
        ]
        if len(ctx.samples["local_raw"]) % 2 == 0:  # every other repeat: the other one first
            warm_passes.reverse()
        for run_pass in warm_passes:
            run_pass()
        shutil.rmtree(tier_dir)

    default, tuned = (
        TransferConfig(),
        TransferConfig(max_concurrency=32, multipart_chunksize=8 * MiB),
    )
    size = ctx.dataset.shards[0].size  # every shard has the same size

    def transfer_manager_pass() -> None:  # beside its plain reference, so both see the same load
        client = common.make_transfer_client(ctx.endpoint, default, size)
        passes: list[Callable[[], object]] = [
            functools.partial(transfer_plain_pass, ctx),
            lambda: timed_pass(
                ctx, "boto3_transfer_manager", transfer_manager_reader(ctx, default, client)
            ),
        ]
        if len(ctx.samples["local_raw"]) % 2 == 0:  # every other repeat: the other one first
            passes.reverse()
        for run_pass in passes:
            run_pass()

    return [
        lambda: timed_pass(ctx, "boto3_get_object", get_object_reader(ctx)),
        transfer_manager_pass,
        lambda: timed_pass(
            ctx,
            "boto3_transfer_manager_c32",
            transfer_manager_reader(
                ctx, tuned, common.make_transfer_client(ctx.endpoint, tuned, size, pool=32)
            ),
        ),
        lambda: timed_pass(ctx, "s3fs", s3fs_reader(ctx)),
        simplecache_pass,
        *(functools.partial(tiercache_concurrency_pass, n) for n in ctx.args.concurrency),
        tiercache_pass,
    ]


# -- results -----------------------------------------------------------------------------------

RATIOS: tuple[common.RatioSpec, ...] = (
    ("tiercache_warm / local_raw", "tiercache_warm", ("local_raw",), 0.9),
    ("tiercache_warm_checked / local_raw", "tiercache_warm_checked", ("local_raw",), 0.9),
    ("tiercache_warm_reboot / local_raw", "tiercache_warm_reboot", ("local_raw",), None),
    (
        "tiercache_cold / fsspec_simplecache_cold",
        "tiercache_cold",
        ("fsspec_simplecache_cold",),
        2.0,
    ),
    (
        "tiercache_cold / max(boto3_get_object, boto3_transfer_manager)",
        "tiercache_cold",
        ("boto3_get_object", "boto3_transfer_manager"),
        0.9,
    ),
    ("tiercache_cold / boto3_get_object", "tiercache_cold", ("boto3_get_object",), None),
    (
        "tiercache_cold / boto3_transfer_manager",
        "tiercache_cold",
        ("boto3_transfer_manager",),
        None,
    ),
    (
        "tiercache_cold / boto3_transfer_manager_c32",
        "tiercache_cold",
        ("boto3_transfer_manager_c32",),
        None,
    ),
)


def summarize(ctx: Context) -> dict[str, dict[str, Any]]:
    total = ctx.dataset.total_bytes
    modes = {}
    for mode, samples in ctx.samples.items():
        seconds = statistics.median(samples)
        cpu = ctx.cpu[mode]
        modes[mode] = {
            "bytes": total,
            "seconds": round(seconds, 4),
            "mib_s": round(total / MiB / seconds, 1),
            "samples_s": [round(s, 4) for s in samples],
            "client_cpu_s": round(statistics.median(c for c, _, _ in cpu), 3),
            "server_cpu_s": round(statistics.median(s for _, s, _ in cpu), 3)
            if ctx.endpoint.started_here
            else None,
            "proxy_cpu_s": round(statistics.median(p for _, _, p in cpu), 3)
            if ctx.endpoint.proxy_pid is not None
            else None,
        }
    return modes


def transfer_plain_check(ctx: Context, modes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """boto3_transfer_manager (and _c32) against the plain script's TransferManager."""
    seconds = statistics.median(s for s, _ in ctx.plain)
    mib_s = ctx.dataset.total_bytes / MiB / seconds
    in_benchmark = modes["boto3_transfer_manager"]["mib_s"]
    return {
        "mib_s": round(mib_s, 1),
        "seconds": round(seconds, 4),
        "samples_s": [round(s, 4) for s, _ in ctx.plain],
        "client_cpu_s": round(statistics.median(c for _, c in ctx.plain), 3),
        "in_benchmark_mib_s": in_benchmark,
        "ratio": round(in_benchmark / mib_s, 3),
        "ratio_c32": round(modes["boto3_transfer_manager_c32"]["mib_s"] / mib_s, 3),
        "tolerance": common.CHECK_TOLERANCE,
        "result": common.check_result(in_benchmark, mib_s),
    }


def print_report(result: dict[str, Any]) -> None:
    params = result["params"]
    print(
        f"\ntiercache read benchmark: {params['shards']} shards x {params['shard_mib']:g} MiB, "
        f"{params['chunk_mib']:g} MiB reads, median of {params['repeat']} repeat(s)"
    )
    print(common.describe_profile(params["store_profile"]) + "\n")
    head = f"{'mode':<28} {'MiB':>7} {'seconds':>8} {'MiB/s':>8} {'cpu_s':>6} {'srv_cpu_s':>9}"
    print(f"{head} {'proxy_cpu_s':>11}")
    for mode, row in result["modes"].items():
        srv = "-" if row["server_cpu_s"] is None else f"{row['server_cpu_s']:.2f}"
        proxy = "-" if row.get("proxy_cpu_s") is None else f"{row['proxy_cpu_s']:.2f}"
        print(
            f"{mode:<28} {row['bytes'] / MiB:>7.0f} {row['seconds']:>8.3f} {row['mib_s']:>8.1f} "
            f"{row['client_cpu_s']:>6.2f} {srv:>9} {proxy:>11}"
        )
    common.print_ratio_rows(result["ratios"], 64)
    common.print_baseline_checks(result["baseline_checks"])
    common.print_notes(result["notes"])


# -- main --------------------------------------------------------------------------------------


def benchmark(args: argparse.Namespace, endpoint: Endpoint, tmp: Path) -> dict[str, Any]:
    direct = common.make_client(endpoint)
    dataset = build_dataset(direct, args, tmp)
    try:
        with common.remote_store(endpoint, args.store_profile, args.store_cores) as (
            store,
            profile,
        ):
            return benchmark_through(args, store, profile, dataset, tmp, direct)
    finally:
        if not endpoint.started_here:
            delete_dataset(direct, dataset)


def benchmark_through(
    args: argparse.Namespace,
    endpoint: Endpoint,
    profile: dict[str, Any],
    dataset: Dataset,
    tmp: Path,
    direct: Any,
) -> dict[str, Any]:
    """Every mode, through ``endpoint`` (the store as the profile emulates it)."""
    ctx = Context(args, endpoint, common.make_client(endpoint), dataset, tmp)
    warm_up_s3(ctx, direct)
    ctx.extras["chained_url_check"] = check_chained_url(ctx)
    first = dataset.shards[0]
    link = common.link_check(endpoint, dataset.bucket, first.key, first.size, profile)
    for index in range(args.repeat):
        run_repeat(ctx, index)
    modes = summarize(ctx)
    return {
        "params": {
            "shards": args.shards,
            "shard_mib": args.shard_mib,
            "chunk_mib": args.chunk_mib,
            "repeat": args.repeat,
            "concurrency": args.concurrency,
            "statistic": "median",
            "primed": not args.no_prime,
            "store_profile": profile,
        },
        "machine": common.machine_info(endpoint),
        "modes": modes,
        "ratios": common.ratio_rows(modes, RATIOS),
        "baseline_checks": {
            "transfer_manager_plain": transfer_plain_check(ctx, modes),
            "link": link,
        },
        **ctx.extras,
        "notes": list(NOTES),
    }


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(
        parse_args(argv), "tiercache-bench-", benchmark, print_report, chart=plot.read_chart
    )


if __name__ == "__main__":
    sys.exit(main())
