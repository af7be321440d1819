"""Reads through the FUSE mount vs tiercache's fsspec API vs plain local files (and fio)."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import common
import mount_small_files
import page_cache
import plot
from boto3.s3.transfer import TransferConfig
from common import REPO, Endpoint, MiB, VerifyError
from read_bench import Dataset, Shard, build_dataset, delete_dataset, drain

from tiercache import TierCacheFileSystem

DEFAULT_JSON = REPO / "benchmarks" / "results" / "mount_bench.json"

NOTES = (
    "Every object is read sequentially in --chunk-mib reads; the timer covers open + reads + "
    "close of each object; every byte is checked (xxh3_128) after the timer stops.",
    "local_raw reads page-cache-warm local copies: the ceiling for any warm read.",
    "boto3_download_c32: the best-configured plain client for a cold read, download_fileobj "
    "into memory with TransferConfig(max_concurrency=32, multipart_chunksize=8 MiB) and a "
    "32-connection pool.",
    "fsspec_cold/fsspec_warm: TierCacheFileSystem.open() on a fresh tier, then a second pass.",
    "mount_cold: a fresh tier behind a fresh mount, every byte fetched from the store.",
    "mount_warm: the objects are in the local tier but the mount is new, so the kernel has no "
    "page of them: every byte is served by the mount process (FUSE read requests).",
    "mount_warm_pagecache: a second pass on the same mount; with --consistency immutable the "
    "kernel keeps the pages across opens (keep_cache), so reads never reach the mount process.",
    "Mounts are made with the command line (`tiercache mount ... --read-only --consistency "
    "immutable`) in the background, as a user would, and unmounted after each pass.",
    "Reported value per mode = median seconds over --repeat samples.",
    "fio (psync, one job, --fio-files files of 32 MiB, read-only): the same files in a plain "
    "local directory and through a read-write mount with the default consistency (ttl). "
    "Every run but mount_cold_seq reads for --fio-seconds. local_*: page-cache-warm local "
    "files; local and warm mount runs alternate, 3 rounds, the median of each reported. "
    "mount_cold_rand: 4 KiB random reads on a fresh tier and mount, through a counting "
    "proxy (0.1 ms per request) that gives the bytes fetched from the store. mount_cold_seq: "
    "1 MiB sequential reads of every file once, on a fresh tier and mount; mount_warm_seq, "
    "mount_warm_rand: the same mount again (tier and kernel page cache warm, files reopened). "
    "tmpfs_seq: the same files copied to /dev/shm, read in the same rounds: a page cache of "
    "small pages, where a local ext4 file may be cached in large folios, which copy out "
    "faster. page_cache_folios_kib: the folios (size in KiB: count) that cache the tier's "
    "files as mount_cold_seq's fetches wrote them, and the local files (root only).",
    "--store-profile runs every mode that reads the store (boto3, fsspec and the mount "
    "process) through scripts/remote_store.py, the profile's numbers in params.store_profile; "
    "the upload, an untimed warm-up read of every object and cleanup go straight to the "
    "server.",
)

RATIOS: tuple[common.RatioSpec, ...] = (
    (
        "mount_warm / local_raw (warm tier, every byte through FUSE)",
        "mount_warm",
        ("local_raw",),
        0.7,
    ),
    ("mount_warm_pagecache / local_raw", "mount_warm_pagecache", ("local_raw",), 0.7),
    ("mount_warm / fsspec_warm", "mount_warm", ("fsspec_warm",), None),
    ("mount_cold / fsspec_cold", "mount_cold", ("fsspec_cold",), None),
    ("mount_cold / boto3_download_c32", "mount_cold", ("boto3_download_c32",), None),
    ("fsspec_cold / boto3_download_c32", "fsspec_cold", ("boto3_download_c32",), None),
)
TUNED = TransferConfig(max_concurrency=32, multipart_chunksize=8 * MiB)


@dataclass
class Context:
    args: argparse.Namespace
    endpoint: Endpoint
    bucket: str
    shards: list[Shard]
    tmp: Path
    samples: dict[str, list[float]] = field(default_factory=dict)
    other_bytes: int = 0  # read through the mount beside the shards (the small files)

    @property
    def chunk(self) -> int:
        return int(self.args.chunk_mib * MiB)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    def env(self, local_dir: Path) -> dict[str, str]:
        return {
            **os.environ,
            "AWS_ENDPOINT_URL": self.endpoint.url,
            "AWS_ACCESS_KEY_ID": self.endpoint.key,
            "AWS_SECRET_ACCESS_KEY": self.endpoint.secret,
            "AWS_DEFAULT_REGION": self.endpoint.region,
            "TIERCACHE_LOCAL_DIR": str(local_dir),
            "TIERCACHE_LOCAL_MAX_BYTES": str(4 * (self.total_bytes + self.other_bytes)),
        }


Reader = Callable[[Shard], list[Any]]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shards", type=int, default=8, help="number of objects (default 8)")
    p.add_argument("--shard-mib", type=float, default=64, help="object size in MiB (default 64)")
    p.add_argument("--chunk-mib", type=float, default=8, help="read size in MiB (default 8)")
    common.add_run_args(p, DEFAULT_JSON)
    common.add_store_profile_arg(p)
    p.add_argument("--fio-files", type=int, default=8, help="files of 32 MiB for fio (0: skip)")
    p.add_argument("--fio-seconds", type=float, default=5, help="length of each timed fio run")
    p.add_argument(
        "--small-files",
        type=int,
        default=2000,
        help="loose files read whole through the mount (default 2000; 0: skip)",
    )
    p.add_argument("--small-kib", type=int, default=128, help="their size in KiB (default 128)")
    p.add_argument(
        "--quick", action="store_true", help="4 objects x 16 MiB and 200 small files: a smoke run"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.shard_mib = 4, 16
        args.fio_files, args.fio_seconds = 4, 1
        args.small_files = min(args.small_files, 200)
    if args.shards < 1 or args.shard_mib <= 0 or args.chunk_mib <= 0 or args.repeat < 1:
        p.error("--shards, --shard-mib, --chunk-mib and --repeat must be positive")
    if args.small_files < 0 or args.small_kib < 1:
        p.error("--small-files must be >= 0 and --small-kib positive")
    return args


def file_reader(ctx: Context, root: Path | None) -> Reader:
    """Plain ``open()`` of the local copy (root None) or of the object under a mountpoint."""

    def read(shard: Shard) -> list[Any]:
        path = shard.path if root is None else str(root / shard.key.removeprefix("shards/"))
        with open(path, "rb", buffering=0) as f:
            return drain(f, ctx.chunk)

    return read


def download_reader(ctx: Context, client: Any) -> Reader:
    """boto3 download_fileobj into memory, 32 parts in flight."""

    def read(shard: Shard) -> list[Any]:
        buf = io.BytesIO()
        client.download_fileobj(ctx.bucket, shard.key, buf, Config=TUNED)
        return [buf.getbuffer()]

    return read


def fsspec_reader(ctx: Context, fs: Any) -> Reader:
    def read(shard: Shard) -> list[Any]:
        with fs.open(f"{ctx.bucket}/{shard.key}", "rb") as f:
            return drain(f, ctx.chunk)

    return read


def timed_pass(ctx: Context, mode: str, reader: Reader) -> None:
    os.sync()
    total = 0.0
    for shard in ctx.shards:
        start = time.perf_counter()
        chunks = reader(shard)
        total += time.perf_counter() - start
        count, digest = common.count_and_digest(chunks)
        if count != shard.size or digest != shard.digest:
            raise VerifyError(f"{mode}: {shard.key}: read {count} bytes with the wrong digest")
        del chunks
    ctx.samples.setdefault(mode, []).append(total)


def cli(ctx: Context, local_dir: Path, *args: str, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tiercache.cli", *args, "--json"],
        env={**ctx.env(local_dir), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tiercache {args[0]} failed: {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def mount_counters(ctx: Context, local_dir: Path, mountpoint: Path) -> dict[str, Any]:
    """The counters the mount on ``mountpoint`` published last (``tiercache stats``)."""
    for entry in cli(ctx, local_dir, "stats")["mounts"]:
        if entry["mountpoint"] == str(mountpoint):
            return dict(entry.get("stats") or {})
    return {}


@contextmanager
def mounted(
    ctx: Context,
    local_dir: Path,
    flags: Sequence[str] = ("--read-only", "--consistency", "immutable"),
    bucket: str | None = None,
    endpoint_url: str | None = None,
    prefix: str = "shards",
) -> Iterator[Path]:
    mountpoint = Path(tempfile.mkdtemp(prefix="mnt-", dir=ctx.tmp))
    url = f"s3://{bucket or ctx.bucket}/{prefix}"
    env = {"AWS_ENDPOINT_URL": endpoint_url} if endpoint_url else {}
    pid = int(cli(ctx, local_dir, "mount", url, str(mountpoint), *flags, **env)["pid"])
    try:
        yield mountpoint
    finally:
        cli(ctx, local_dir, "unmount", str(mountpoint))
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def run_repeat(ctx: Context) -> None:
    timed_pass(ctx, "local_raw", file_reader(ctx, None))
    largest = max(s.size for s in ctx.shards)  # parts at once (see make_transfer_client)
    client = common.make_transfer_client(ctx.endpoint, TUNED, largest, pool=32)
    timed_pass(ctx, "boto3_download_c32", download_reader(ctx, client))

    fs_dir = Path(tempfile.mkdtemp(prefix="fsspec-", dir=ctx.tmp))
    fs = TierCacheFileSystem(
        target_options=ctx.endpoint.target_options(),
        local_dir=str(fs_dir),
        local_max_bytes=4 * ctx.total_bytes,
        consistency="immutable",
        skip_instance_cache=True,
    )
    common.build_client_now(fs)
    timed_pass(ctx, "fsspec_cold", fsspec_reader(ctx, fs))
    fs.wait_fetches()
    timed_pass(ctx, "fsspec_warm", fsspec_reader(ctx, fs))

    tier = Path(tempfile.mkdtemp(prefix="mount-tier-", dir=ctx.tmp))
    with mounted(ctx, tier) as mnt:
        timed_pass(ctx, "mount_cold", file_reader(ctx, mnt))
    with mounted(ctx, tier) as mnt:  # a new mount: the kernel has no page of these files
        timed_pass(ctx, "mount_warm", file_reader(ctx, mnt))
        timed_pass(ctx, "mount_warm_pagecache", file_reader(ctx, mnt))


FIO_FILE_MIB = 32
FIO_WARM_ROUNDS = 3
SHM = "/dev/shm"  # tmpfs: the small-page reference (tmpfs_seq)
FIO_RATIOS = (  # name, numerator, denominator, measure, target, "min" (at least) or "max"
    ("mount_warm_seq / local_seq (1 MiB, MiB/s)", "mount_warm_seq", "local_seq", "mib_s", 0.8),
    ("mount_warm_rand / local_rand (4 KiB, IOPS)", "mount_warm_rand", "local_rand", "iops", 0.5),
    ("mount_cold_seq / local_seq (1 MiB, MiB/s)", "mount_cold_seq", "local_seq", "mib_s", None),
    ("mount_warm_seq / tmpfs_seq (1 MiB, MiB/s)", "mount_warm_seq", "tmpfs_seq", "mib_s", None),
    ("tmpfs_seq / local_seq (1 MiB, MiB/s)", "tmpfs_seq", "local_seq", "mib_s", None),
    ("mount_cold_rand / local_rand (4 KiB, IOPS)", "mount_cold_rand", "local_rand", "iops", None),
)


def fio(
    ctx: Context, directory: Path, names: Sequence[str], rw: str, bs: str, timed: bool = True
) -> dict[str, Any]:
    """One fio psync job reading the files for --fio-seconds (``timed``), or each once."""
    command = [
        "fio",
        "--name=read",
        "--ioengine=psync",
        "--numjobs=1",
        "--readonly",
        "--invalidate=0",  # warm means warm: fio must not drop the files' cached pages
        f"--rw={rw}",
        f"--bs={bs}",
        "--filename=" + ":".join(str(directory / name) for name in names),
        "--output-format=json",
    ]
    random = rw == "randread"
    command.append("--file_service_type=" + ("random" if random else "sequential"))
    if timed:
        command += ["--time_based", f"--runtime={int(ctx.args.fio_seconds * 1000)}ms"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fio failed: {(done.stderr or done.stdout).strip()}")
    read = json.loads(done.stdout[done.stdout.index("{") :])["jobs"][0]["read"]
    return {
        "mib_s": round(read["bw_bytes"] / MiB, 1),
        "iops": round(read["iops"]),
        "bytes": read["io_bytes"],
        "seconds": read["runtime"] / 1000,
    }


@contextmanager
def counting_proxy(ctx: Context) -> Iterator[Any]:
    """A proxy in front of the store that counts the bytes it serves (0.1 ms per request)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import remote_store

    with remote_store.RemoteStore(
        ctx.endpoint.url, "s3-region", latency_s=0.0001, conn_bps=0, total_bps=0, error_rate=0
    ) as proxy:
        yield proxy


def fio_pass(ctx: Context, client: Any) -> dict[str, Any]:
    """fio through a read-write mount (default consistency) against a plain local directory."""
    tmp = ctx.tmp / "fio"
    tmp.mkdir()
    shape = argparse.Namespace(shards=ctx.args.fio_files, shard_mib=FIO_FILE_MIB)
    dataset = build_dataset(client, shape, tmp)
    # The mounts' tier holds the fio files whatever the shards' size (a tier smaller than
    # them would send the warm runs through the daemon and the store).
    ctx = replace(ctx, other_bytes=ctx.other_bytes + dataset.total_bytes)
    names = [Path(shard.path).name for shard in dataset.shards]
    local = Path(dataset.shards[0].path).parent
    runs: dict[str, dict[str, Any]] = {}
    # A second reference: the same files on tmpfs, a page cache of small pages only (like a
    # FUSE mount's here), where the local directory's filesystem may keep large folios.
    shm = Path(tempfile.mkdtemp(prefix="tiercache-fio-", dir=SHM)) if os.path.isdir(SHM) else None
    try:
        fio(ctx, local, names, "read", "1M", timed=False)  # the local files in the page cache
        if shm is not None:
            for name in names:
                shutil.copyfile(local / name, shm / name)
        with counting_proxy(ctx) as proxy:
            tier = Path(tempfile.mkdtemp(prefix="fio-tier-", dir=tmp))
            with mounted(ctx, tier, (), dataset.bucket, proxy.url) as mnt:
                before = proxy.bytes_down
                runs["mount_cold_rand"] = fio(ctx, mnt, names, "randread", "4k")
                runs["mount_cold_rand"]["fetched"] = proxy.bytes_down - before
        tier = Path(tempfile.mkdtemp(prefix="fio-tier-", dir=tmp))
        with mounted(ctx, tier, (), dataset.bucket) as mnt:
            runs["mount_cold_seq"] = fio(ctx, mnt, names, "read", "1M", timed=False)
            # Read once the mount has settled: the mount raises it a moment after it comes up.
            read_ahead_kb = kernel_read_ahead_kb(mnt)
            # What the warm runs copy out of: the tier files' folios as the fetches left them.
            folios = {
                "tier": page_cache.folio_sizes_kib(sorted(tier.rglob("*.data"))),
                "local": page_cache.folio_sizes_kib(local / name for name in names),
            }
            # Warm runs alternate local and mount, the median of each kept: on a busy host a
            # ratio of runs made side by side drifts less than one of runs made apart.
            samples: dict[str, list[dict[str, Any]]] = {}
            for _ in range(FIO_WARM_ROUNDS):
                for name, where, rw, bs in (
                    ("local_seq", local, "read", "1M"),
                    ("mount_warm_seq", mnt, "read", "1M"),
                    ("tmpfs_seq", shm, "read", "1M"),
                    ("local_rand", local, "randread", "4k"),
                    ("mount_warm_rand", mnt, "randread", "4k"),
                ):
                    if where is not None:
                        samples.setdefault(name, []).append(fio(ctx, where, names, rw, bs))
            for name, taken in samples.items():
                runs[name] = sorted(taken, key=lambda run: float(run["mib_s"]))[len(taken) // 2]
            time.sleep(2.5)  # two publications of the mount's counters
            passthrough_opens = mount_counters(ctx, tier, mnt).get("passthrough_opens", 0)
    finally:
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
        if not ctx.endpoint.started_here:
            delete_dataset(client, dataset)
    ratios: list[dict[str, Any]] = []
    for name, numerator, denominator, measure, target in FIO_RATIOS:
        if numerator not in runs or denominator not in runs:
            continue  # no tmpfs here
        value = runs[numerator][measure] / max(runs[denominator][measure], 1e-9)
        row: dict[str, Any] = {"name": name, "value": round(value, 3), "target": target}
        if target is not None:
            row["result"] = "PASS" if value >= target else "MISS"
        ratios.append(row)
    cold = runs["mount_cold_rand"]
    fetched = cold["fetched"] / max(cold["bytes"], 1)
    ratios.append(
        {
            "name": "mount_cold_rand bytes fetched / bytes read (at most)",
            "value": round(fetched, 3),
            "target": 2.0,
            "result": "PASS" if fetched <= 2.0 else "MISS",
        }
    )
    return {
        "files": len(names),
        "file_mib": FIO_FILE_MIB,
        "read_ahead_kb": read_ahead_kb,
        "passthrough_opens": passthrough_opens,  # warm opens the kernel read from the tier
        "page_cache_folios_kib": folios,
        "runs": runs,
        "ratios": ratios,
    }


def kernel_read_ahead_kb(mountpoint: Path) -> int | None:
    """The kernel's read-ahead for the mount (None where it cannot be read)."""
    device = os.stat(mountpoint).st_dev
    name = f"{os.major(device)}:{os.minor(device)}"
    try:
        return int(Path(f"/sys/class/bdi/{name}/read_ahead_kb").read_text())
    except (OSError, ValueError):
        return None


def print_fio(report: dict[str, Any]) -> None:
    print(
        f"\nfio psync, one job, {report['files']} files x {report['file_mib']} MiB; "
        f"the mount's kernel read-ahead {report['read_ahead_kb']} KiB"
    )
    print(f"{'run':<18} {'MiB/s':>9} {'IOPS':>9} {'MiB read':>9} {'MiB fetched':>12}")
    for name, run in report["runs"].items():
        fetched = f"{run['fetched'] / MiB:>12.1f}" if "fetched" in run else ""
        print(
            f"{name:<18} {run['mib_s']:>9.1f} {run['iops']:>9} {run['bytes'] / MiB:>9.1f}{fetched}"
        )
    for where, found in (report.get("page_cache_folios_kib") or {}).items():
        if found:
            sizes = ", ".join(f"{kib} KiB x{count}" for kib, count in found["folios"].items())
            print(f"page-cache folios of the {where} files: {sizes}")
    print(f"\n{'fio ratio':<54} {'value':>6} {'target':>7}  result")
    for row in report["ratios"]:
        sign = "<=" if "at most" in row["name"] else ">="
        target = f"{sign}{row['target']:g}" if row["target"] is not None else ""
        print(f"{row['name']:<54} {row['value']:>6.3f} {target:>7}  {row.get('result', '')}")


def summarize(ctx: Context) -> dict[str, dict[str, Any]]:
    modes = {}
    for mode, samples in ctx.samples.items():
        seconds = statistics.median(samples)
        modes[mode] = {
            "bytes": ctx.total_bytes,
            "seconds": round(seconds, 4),
            "mib_s": round(ctx.total_bytes / MiB / seconds, 1),
            "samples_s": [round(s, 4) for s in samples],
        }
    return modes


def print_report(result: dict[str, Any]) -> None:
    params = result["params"]
    print(
        f"\ntiercache mount benchmark: {params['shards']} objects x {params['shard_mib']:g} MiB, "
        f"{params['chunk_mib']:g} MiB reads, median of {params['repeat']} repeat(s)"
    )
    print(common.describe_profile(params["store_profile"]) + "\n")
    print(f"{'mode':<24} {'MiB':>7} {'seconds':>8} {'MiB/s':>8}")
    for mode, row in result["modes"].items():
        print(f"{mode:<24} {row['bytes'] / MiB:>7.0f} {row['seconds']:>8.3f} {row['mib_s']:>8.1f}")
    common.print_ratio_rows(result["ratios"], 62)
    if result.get("fio"):
        print_fio(result["fio"])
    if result.get("small_files"):
        mount_small_files.print_section(result["small_files"])
    common.print_notes(result["notes"] + result.get("small_files", {}).get("notes", []))


def benchmark(args: argparse.Namespace, endpoint: Endpoint, tmp: Path) -> dict[str, Any]:
    direct = common.make_client(endpoint)
    dataset = build_dataset(direct, args, tmp)
    try:
        warm_up(direct, dataset)
        with common.remote_store(endpoint, args.store_profile, args.store_cores) as (
            store,
            profile,
        ):
            result = benchmark_through(args, store, profile, dataset, tmp)
    finally:
        if not endpoint.started_here:
            delete_dataset(direct, dataset)
    if args.small_files:
        result["small_files"] = small_files(args, endpoint, direct, tmp)
    return result


def small_files(
    args: argparse.Namespace, endpoint: Endpoint, direct: Any, tmp: Path
) -> dict[str, Any]:
    """The small-file section (``mount_small_files``): uploaded straight to the server, read
    through the profile's emulator."""
    with (
        mount_small_files.uploaded(direct, args.small_files, args.small_kib, tmp) as ds,
        common.remote_store(endpoint, args.store_profile, args.store_cores) as (store, _),
    ):
        ctx = Context(args, store, ds.bucket, [], tmp, other_bytes=ds.total_bytes)

        def mount(tier: Path, flags: Sequence[str]) -> Any:
            return mounted(ctx, tier, flags, prefix=mount_small_files.PREFIX)

        run = mount_small_files.SmallFiles(store, ds, tmp, mount)
        section: dict[str, Any] = mount_small_files.benchmark(run, args.repeat)
        return section


def warm_up(client: Any, dataset: Dataset) -> None:
    """Read every object once, untimed and straight to the server: all modes see one state."""
    for shard in dataset.shards:
        body = client.get_object(Bucket=dataset.bucket, Key=shard.key)["Body"]
        while body.read(8 * MiB):
            pass
        body.close()


def benchmark_through(
    args: argparse.Namespace,
    endpoint: Endpoint,
    profile: dict[str, Any],
    dataset: Dataset,
    tmp: Path,
) -> dict[str, Any]:
    """Every mode, through ``endpoint`` (the store as the profile emulates it)."""
    ctx = Context(args, endpoint, dataset.bucket, dataset.shards, tmp)
    for _ in range(args.repeat):
        run_repeat(ctx)
    modes = summarize(ctx)
    fio_report = None
    if args.fio_files > 0:
        if shutil.which("fio") is None:
            raise RuntimeError("fio is not installed (apt-get install fio), or pass --fio-files 0")
        fio_report = fio_pass(ctx, common.make_client(ctx.endpoint))
    return {
        "params": {
            "shards": args.shards,
            "shard_mib": args.shard_mib,
            "chunk_mib": args.chunk_mib,
            "repeat": args.repeat,
            "statistic": "median",
            "store_profile": profile,
        },
        "machine": common.machine_info(endpoint),
        "modes": modes,
        "ratios": common.ratio_rows(modes, RATIOS),
        "fio": fio_report,
        "notes": list(NOTES),
    }


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(
        parse_args(argv), "tiercache-mbench-", benchmark, print_report, chart=plot.mount_chart
    )


if __name__ == "__main__":
    sys.exit(main())
