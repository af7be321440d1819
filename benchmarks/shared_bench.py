"""Shared-tier benchmark: L2-hit reads vs a plain read on the same filesystem; GETs per object.

Part 1 fills the shared tier from S3 (one "host"), then reads every shard as another host
would: through tiercache with ``shared_policy=serve`` (in place) and ``promote`` (copied into
that host's local tier on first read), beside a plain read of copies of the same bytes in a
directory of the same filesystem. Part 2 starts N processes standing in for H hosts on an
empty shared tier; they all read every shard, and the store's GETs are counted.

With ``--cephfs`` the shared tier is a real distributed filesystem: ``scripts/cephfs.sh``
starts CephFS and mounts it twice through ceph-fuse (two clients, two "hosts"); the filler
writes through the first mount and every reader reads through the second.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import common
import plot
import xxhash
from common import REPO, Endpoint, MiB, VerifyError

from tiercache import TierCacheFileSystem

DEFAULT_JSON = REPO / "benchmarks" / "results" / "shared_bench.json"

NOTES = (
    "plain_same_fs reads copies of the shards placed in a directory of the shared tier's "
    "filesystem, with the same chunk size; page cache not dropped for either side.",
    "l2_serve: a fresh host (empty local tier) reads every shard from the shared tier in "
    "place. l2_promote: the same with shared_policy=promote, so each read also copies the "
    "shard into that host's local tier (the price of the first read; later reads are local); "
    "its baseline plain_copy_then_read copies each plain file on the same filesystem "
    "(shutil.copyfile) and reads the copy.",
    "copies_per_object (and gets_per_object, ranged GETs, several per fetch on a slow link): "
    "N processes as H hosts (own host_id and local tier each host) read "
    "every shard from an empty shared tier at once; bytes fetched (and GETs) summed from "
    "every process's counters, divided by the shard count and size (1.0 = each object "
    "crossed the link once).",
    "fill_from_store_mib_s: the first host's reads of every shard from the store into an "
    "empty shared tier (cat_file, then wait_fetches), median over --repeat.",
    "store_get: the same shards read straight from the store with boto3 (one GET each, "
    "through the emulator with --store-profile): what a host without the shared tier pays. "
    "l1_warm: the promoting host reads every shard again, now from its local tier (local "
    "disk). Local tiers are always on local disk (the temp dir), never on the shared "
    "filesystem.",
    "--cephfs: the filler's shared_dir (and the plain files) are written through one "
    "ceph-fuse mount and read through the other, as a second host would.",
    "--store-profile runs every request to the store (the fill, the racing processes) "
    "through scripts/remote_store.py, the profile's numbers in params.store_profile; the "
    "upload and cleanup go straight to the server. The L2 reads never reach the store.",
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--shard-mib", type=int, default=64)
    p.add_argument("--chunk-mib", type=int, default=4)
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument(
        "--shared-dir",
        type=Path,
        help="directory on the shared filesystem to test (default: a temp dir, local disk)",
    )
    p.add_argument(
        "--cephfs",
        action="store_true",
        help="the shared tier on CephFS (scripts/cephfs.sh: two ceph-fuse mounts as two hosts; "
        "needs root, /dev/fuse, and Ceph or apt-get to install it)",
    )
    p.add_argument("--quick", action="store_true", help="4 x 16 MiB shards, 4 processes")
    common.add_run_args(p, DEFAULT_JSON)
    common.add_store_profile_arg(p)
    args = p.parse_args(argv)
    if args.cephfs and args.shared_dir:
        p.error("--cephfs and --shared-dir are exclusive")
    if args.quick:
        args.shards, args.shard_mib, args.processes, args.hosts = 4, 16, 4, 2
    return args


def _read_all(
    open_file: Callable[[str], Any], names: list[str], chunk: int
) -> tuple[float, dict[str, str]]:
    digests = {}
    started = time.perf_counter()
    hashers = {}
    for name in names:
        hasher = xxhash.xxh3_128()
        with open_file(name) as f:
            while block := f.read(chunk):
                hasher.update(block)
        hashers[name] = hasher
    elapsed = time.perf_counter() - started
    for name, hasher in hashers.items():
        digests[name] = hasher.hexdigest()
    return elapsed, digests


def _copy_then_read(names: list[str], dest: Path, chunk: int) -> tuple[float, dict[str, str]]:
    """What promotion does without tiercache: copy each file, then read the copy."""
    dest.mkdir()
    started = time.perf_counter()
    copies = []
    for name in names:
        copy = dest / Path(name).name
        shutil.copyfile(name, copy)  # copy_file_range / sendfile, as promotion uses
        copies.append(str(copy))
    copy_time = time.perf_counter() - started
    elapsed, digests = _read_all(io.FileIO, copies, chunk)
    renamed = {name: digests[copy] for name, copy in zip(names, copies, strict=True)}
    return copy_time + elapsed, renamed


def _host_fs(
    endpoint: Endpoint, root: Path, shared: Path, host: str, **extra: Any
) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=endpoint.target_options(),
        local_dir=str(root / f"local-{host}"),
        shared_dir=str(shared),
        host_id=host,
        consistency="immutable",
        shared_max_bytes=1 << 50,
        local_max_bytes=1 << 50,
        skip_instance_cache=True,
        **extra,
    )


def _process(
    options: dict[str, Any],
    root: str,
    shared: str,
    host: str,
    paths: list[str],
    start: Any,
    out: Any,
) -> None:
    fs = TierCacheFileSystem(
        target_options=options,
        local_dir=os.path.join(root, f"local-{host}"),
        shared_dir=shared,
        host_id=host,
        consistency="immutable",
        skip_instance_cache=True,
    )
    start.wait()
    digests = {p: xxhash.xxh3_128(fs.cat_file(p)).hexdigest() for p in paths}
    fs.wait_fetches()
    stats = fs.stats()
    out.put((digests, stats["store_requests"].get("GetObject", 0), stats["bytes_fetched"]))


@contextlib.contextmanager
def _shared_views(args: argparse.Namespace, tmp: Path) -> Iterator[tuple[Path, Path]]:
    """Where the first host and the other hosts see the shared filesystem (one dir, two views).

    With ``--cephfs``, the two ceph-fuse mounts of ``scripts/cephfs.sh``, started here and
    stopped at the end; else ``--shared-dir`` (or the temp dir) seen the same by every host.
    """
    if not args.cephfs:
        base = args.shared_dir or tmp
        yield base, base
        return
    base = Path(os.environ.get("CEPHFS_DIR", "/tmp/tiercache-cephfs"))
    env = {**os.environ, "CEPHFS_DIR": str(base)}
    script = str(REPO / "scripts" / "cephfs.sh")
    subprocess.run(["bash", script, "start"], env=env, check=True, timeout=900)
    try:
        yield base / "hostA", base / "hostB"
    finally:
        subprocess.run(["bash", script, "stop"], env=env, check=False, timeout=120)


def benchmark(args: argparse.Namespace, endpoint: Endpoint, tmp: Path) -> dict[str, Any]:
    client = common.make_client(endpoint)  # straight to the server: upload and cleanup
    bucket = f"tc-shared-bench-{os.getpid()}"
    client.create_bucket(Bucket=bucket)
    try:
        with (
            _shared_views(args, tmp) as views,
            common.remote_store(endpoint, args.store_profile, args.store_cores) as (
                store,
                profile,
            ),
        ):
            return benchmark_through(args, store, profile, client, bucket, tmp, views)
    finally:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for page in pages:
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
        client.delete_bucket(Bucket=bucket)


def _store_get(
    endpoint: Endpoint, bucket: str, names: list[str], chunk: int
) -> tuple[float, dict[str, str]]:
    """Every shard read straight from the store (through the emulator, if any)."""
    client = common.make_client(endpoint)
    client.head_bucket(Bucket=bucket)  # connection and credentials outside the timer

    def open_object(name: str) -> Any:
        body = client.get_object(Bucket=bucket, Key=name.split("/", 1)[1])["Body"]
        return contextlib.closing(body)

    return _read_all(open_object, names, chunk)


def benchmark_through(
    args: argparse.Namespace,
    endpoint: Endpoint,
    profile: dict[str, Any],
    client: Any,
    bucket: str,
    tmp: Path,
    views: tuple[Path, Path],
) -> dict[str, Any]:
    """Both parts, every request to the store through ``endpoint`` (the emulated store)."""
    name = f"tiercache-shared-bench-{os.getpid()}"
    work, seen = views[0] / name, views[1] / name  # written by the first host, read by others
    work.mkdir(parents=True)
    local = tmp / "local-tiers"  # each host's local tier: local disk
    size = args.shard_mib * MiB
    expected: dict[str, str] = {}
    plain = work / "plain"
    plain.mkdir()
    names = []
    for i in range(args.shards):
        data = os.urandom(size)
        key = f"shards/{i:04d}.bin"
        client.put_object(Bucket=bucket, Key=key, Body=data)
        (plain / f"{i:04d}.bin").write_bytes(data)
        expected[f"{bucket}/{key}"] = xxhash.xxh3_128(data).hexdigest()
        names.append(f"{bucket}/{key}")
    chunk = args.chunk_mib * MiB
    try:
        samples: dict[str, list[float]] = {
            "plain_same_fs": [],
            "plain_copy_then_read": [],
            "l2_serve": [],
            "l2_promote": [],
            "l1_warm": [],
            "store_get": [],
        }
        fills = []
        for repeat in range(args.repeat):
            filler = _host_fs(endpoint, local / f"r{repeat}", work / f"shared-{repeat}", "filler")
            common.build_client_now(filler)
            fill = 0.0
            for path in names:  # timed per object: the check of its bytes is not
                started = time.perf_counter()
                data = filler.cat_file(path)
                fill += time.perf_counter() - started
                if xxhash.xxh3_128(data).hexdigest() != expected[path]:
                    raise VerifyError(f"the filler read wrong bytes of {path}")
            started = time.perf_counter()
            filler.wait_fetches()
            fills.append(fill + time.perf_counter() - started)
            plain_names = [str(seen / "plain" / Path(n).name) for n in names]
            elapsed, got = _read_all(io.FileIO, plain_names, chunk)
            if list(got.values()) != list(expected.values()):
                raise VerifyError("plain read differs")
            samples["plain_same_fs"].append(elapsed)
            elapsed, got = _copy_then_read(plain_names, seen / f"copies-{repeat}", chunk)
            if list(got.values()) != list(expected.values()):
                raise VerifyError("plain copy differs")
            samples["plain_copy_then_read"].append(elapsed)
            elapsed, got = _store_get(endpoint, bucket, names, chunk)
            if got != expected:
                raise VerifyError("store read differs")
            samples["store_get"].append(elapsed)
            for policy in ("serve", "promote"):
                reader = _host_fs(
                    endpoint,
                    local / f"r{repeat}",
                    seen / f"shared-{repeat}",
                    f"reader-{policy}",
                    shared_policy=policy,
                )
                common.build_client_now(reader)
                elapsed, got = _read_all(reader.open, names, chunk)
                if got != expected:
                    raise VerifyError(f"l2_{policy} read differs")
                if reader.stats()["fetches"]:
                    raise VerifyError(f"l2_{policy} fetched from the store")
                samples[f"l2_{policy}"].append(elapsed)
            elapsed, got = _read_all(reader.open, names, chunk)  # promoted: now local
            if got != expected or reader.stats()["hits"] < 2 * len(names):
                raise VerifyError("l1_warm read differs or missed the local tier")
            samples["l1_warm"].append(elapsed)
        total = args.shards * size
        throughput = {k: total / MiB / statistics.median(v) for k, v in samples.items()}
        race = _race(args, endpoint, local, (work, seen), names, expected)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "params": {
            "shards": args.shards,
            "shard_mib": args.shard_mib,
            "chunk_mib": args.chunk_mib,
            "repeat": args.repeat,
            "processes": args.processes,
            "hosts": args.hosts,
            "shared_dir": "cephfs (two ceph-fuse mounts)" if args.cephfs else str(views[0]),
            "store_profile": profile,
        },
        "machine": common.machine_info(endpoint),
        "mib_per_s": throughput,
        "fill_from_store_mib_s": round(total / MiB / statistics.median(fills), 1),
        "ratios": {
            "l2_serve_vs_plain_same_fs": throughput["l2_serve"] / throughput["plain_same_fs"],
            "l2_promote_vs_plain_copy_then_read": throughput["l2_promote"]
            / throughput["plain_copy_then_read"],
            "l2_serve_vs_store_get": throughput["l2_serve"] / throughput["store_get"],
            "l2_serve_vs_l1_warm": throughput["l2_serve"] / throughput["l1_warm"],
        },
        **race,
        "notes": list(NOTES),
    }


def _race(
    args: argparse.Namespace,
    endpoint: Endpoint,
    local: Path,
    views: tuple[Path, Path],
    names: list[str],
    expected: dict[str, str],
) -> dict[str, float]:
    """N processes as H hosts read every shard at once: GETs and copies per object.

    Host 0 sees the shared tier through the first view, the others through the second.
    """
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = []
    for n in range(args.processes):
        host = n % args.hosts
        shared = str(views[0 if host == 0 else 1] / "shared-race")
        procs.append(
            ctx.Process(
                target=_process,
                args=(
                    endpoint.target_options(),
                    str(local / "race"),
                    shared,
                    f"host{host}",
                    names,
                    start,
                    out,
                ),
            )
        )
    for proc in procs:
        proc.start()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    for digests, _, _ in results:
        if digests != expected:
            raise VerifyError("a racing process read wrong bytes")
    size = int(args.shard_mib * MiB)
    return {
        "gets_per_object": float(sum(gets for _, gets, _ in results)) / len(names),
        "copies_per_object": float(sum(nbytes for _, _, nbytes in results)) / (size * len(names)),
    }


def print_report(result: dict[str, Any]) -> None:
    cfg = result["params"]
    print(
        f"\nshared tier: {cfg['shards']} x {cfg['shard_mib']} MiB, {cfg['chunk_mib']} MiB reads, "
        f"median of {cfg['repeat']}, on {cfg['shared_dir']}"
    )
    print(common.describe_profile(cfg["store_profile"]))
    for mode, rate in result["mib_per_s"].items():
        print(f"  {mode:<22} {rate:>9,.0f} MiB/s")
    print(f"  {'fill_from_store':<22} {result['fill_from_store_mib_s']:>9,.0f} MiB/s")
    for name, ratio in result["ratios"].items():
        print(f"  {name:<32} {ratio:5.2f}x")
    print(
        f"  GETs per object, {cfg['processes']} processes as {cfg['hosts']} hosts: "
        f"{result['gets_per_object']:.2f} (ranged GETs), copies fetched per object: "
        f"{result['copies_per_object']:.2f} (1.00: each object crossed the link once)"
    )
    common.print_notes(result["notes"])


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(
        parse_args(argv),
        "tiercache-shared-bench-",
        benchmark,
        print_report,
        chart=plot.shared_chart,
    )


if __name__ == "__main__":
    sys.exit(main())
