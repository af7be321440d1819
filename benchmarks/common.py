"""Helpers shared by the benchmark scripts: S3 endpoint, boto3 client, CPU time and results."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import xxhash

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import s3server  # noqa: E402  (scripts/ is not a package)

Result = dict[str, Any]


class VerifyError(Exception):
    """A mode read or stored bytes that differ from the originals, or left uploads pending."""


@dataclass(frozen=True)
class Endpoint(s3server.S3Endpoint):
    """The S3 server a benchmark talks to, and the processes whose CPU it measures."""

    server_pid: int | None = None  # set when this script started the server
    proxy_pid: int | None = None  # the remote-store emulator in front of it, if any

    @property
    def url(self) -> str:
        return self.endpoint

    @property
    def started_here(self) -> bool:
        return self.server_pid is not None

    def s3fs_options(self) -> dict[str, Any]:
        """s3fs options with the endpoint passed through ``client_kwargs``."""
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.url, "region_name": self.region},
        }


# -- command line ------------------------------------------------------------------------------


def add_run_args(p: argparse.ArgumentParser, default_json: Path) -> None:
    """The --repeat, --json, --plot and --endpoint options every benchmark takes."""
    p.add_argument("--repeat", type=int, default=1, help="samples per mode; median is reported")
    p.add_argument("--json", type=Path, default=default_json, help="where to write the results")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw the results as a chart into this file (needs matplotlib: the 'plot' extra)",
    )
    p.add_argument("--endpoint", help="use this S3 server (credentials from AWS_* env vars)")
    p.add_argument(
        "--store-dir",
        type=Path,
        metavar="DIR",
        help="the S3 server started here keeps its data in a fresh directory under DIR, a "
        "filesystem other than the tiers' (a remote store's disk is not the client's: on one "
        "filesystem its writes and the tiers' fsyncs wait on each other); default: beside "
        "the tiers, in the scratch directory",
    )


# -- server and client -------------------------------------------------------------------------


@contextlib.contextmanager
def s3_endpoint(url: str | None, tmp: Path, store_dir: Path | None = None) -> Iterator[Endpoint]:
    """The server at ``url``, or a SeaweedFS started here (and stopped on exit), its data in
    ``tmp``, or in a fresh directory under ``store_dir`` (removed on exit)."""
    if url:
        yield Endpoint(
            url,
            os.environ.get("AWS_ACCESS_KEY_ID", ""),
            os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        )
        return
    if store_dir is None:
        data_dir = tmp / "s3server"
        data_dir.mkdir()
    else:
        data_dir = Path(tempfile.mkdtemp(prefix="tiercache-s3server-", dir=store_dir))
    try:
        with s3server.start_server(data_dir=str(data_dir)) as srv:
            yield Endpoint(srv.endpoint, srv.access_key, srv.secret_key, srv.region, srv.pid)
    finally:
        if store_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)


STORE_PROFILES = ("loopback", "s3-region", "cross-region")


def add_store_profile_arg(p: argparse.ArgumentParser) -> None:
    """--store-profile: the emulated remote store (scripts/remote_store.py) to run through,
    and --store-cores: the cores it keeps to itself."""
    p.add_argument(
        "--store-profile",
        choices=STORE_PROFILES,
        default="loopback",
        help="run every mode through the remote-store emulator with this profile "
        "(default loopback: straight to the server)",
    )
    p.add_argument(
        "--store-cores",
        type=int,
        default=0,
        help="the S3 server (and the emulator, with a remote profile) run on this many cores of "
        "their own (the last ones) and the benchmark on the others, as a remote store's CPU "
        "is not the client's (default 0: everything shares every core)",
    )


def isolate_store(endpoint: Endpoint, cores: int | None) -> dict[str, Any]:
    """Pin the server and the emulator (every thread) to the last ``cores`` cores and this
    process to the rest; what was done, for the JSON."""
    available = sorted(os.sched_getaffinity(0))
    if cores is None or cores <= 0 or cores >= len(available):
        return {"store_cores": [], "client_cores": available}
    store, client = set(available[-cores:]), set(available[:-cores])
    for pid in (endpoint.server_pid, endpoint.proxy_pid):
        if pid is not None:
            _pin_all_threads(pid, store)
    _pin_all_threads(os.getpid(), client)
    return {"store_cores": sorted(store), "client_cores": sorted(client)}


def _pin_all_threads(pid: int, cores: set[int]) -> None:
    """sched_setaffinity applies to one thread; threads created later inherit their creator's."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cores)


def store_profile(name: str) -> dict[str, Any]:
    """The numbers of the named remote-store profile (latency_s, conn_bps, total_bps, ...)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import remote_store as rs

    return dataclasses.asdict(rs.resolve_profile(name))


def describe_profile(profile: dict[str, Any]) -> str:
    """One line: the profile's name and what it emulates."""
    if not any(profile[k] for k in ("latency_s", "conn_bps", "total_bps", "error_rate")):
        return f"store profile {profile['name']}: straight to the server, nothing emulated"
    split = profile.get("cpu_split") or {}
    cores = (
        f"; server and emulator on core(s) {split['store_cores']}, benchmark on "
        f"{split['client_cores']}"
        if split.get("store_cores")
        else "; server, emulator and benchmark share every core"
    )
    return (
        f"store profile {profile['name']}: {profile['latency_s'] * 1000:g} ms per request, "
        f"{profile['conn_bps'] / MiB:g} MiB/s per connection, {profile['total_bps'] / MiB:g} "
        f"MiB/s in all (0 = unlimited), error rate {profile['error_rate']:g}{cores}"
    )


@contextlib.contextmanager
def remote_store(
    endpoint: Endpoint, profile: str, store_cores: int | None = None
) -> Iterator[tuple[Endpoint, dict[str, Any]]]:
    """The endpoint as seen through the emulator (its own process), and the profile's numbers.

    For ``loopback`` no proxy runs and the endpoint is returned unchanged. The server (when
    started here) and the emulator get ``store_cores`` cores of their own (see
    ``isolate_store``; 0: they share every core with the benchmark).
    """
    sys.path.insert(0, str(REPO / "scripts"))
    import remote_store as rs

    params = store_profile(profile)
    with rs.spawn(endpoint.url, profile) as spawned:
        params["url"] = spawned.url
        proxied = dataclasses.replace(endpoint, endpoint=spawned.url, proxy_pid=spawned.pid)
        if store_cores != 0 and endpoint.started_here:
            params["cpu_split"] = isolate_store(proxied, store_cores)
        yield proxied, params


def make_client(endpoint: Endpoint, pool: int = 16) -> Any:
    """A boto3 S3 client that, like tiercache's own, computes no CRC checksums."""
    return endpoint.client(
        max_pool_connections=pool,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


def make_transfer_client(endpoint: Endpoint, config: Any, object_size: int, pool: int = 16) -> Any:
    """A boto3 S3 client for TransferManager downloads (``config``: its TransferConfig) of
    objects of ``object_size`` bytes that checks no CRC and lets every part start at once.

    With response_checksum_validation='when_required' s3transfer (since boto/s3transfer#363)
    skips its HEAD and asks for the first part alone, and schedules the other parts only once
    that part has arrived: a 32 MiB object in 8 MiB parts is read as one part and then three,
    half the rate of four at once when one connection gets a quarter of the link. With
    'when_supported' it asks a HEAD, then every part together. Neither computes a CRC for
    objects written by one PUT, as the benchmarks' are: a ranged GET of one carries no checksum
    (S3 sends one only for a range that is a part of a multipart upload; SeaweedFS none). An
    object that one GET covers keeps 'when_required': 'when_supported' would cost it a HEAD
    and a CRC of the whole body.
    """
    parts = object_size >= config.multipart_threshold and object_size > config.multipart_chunksize
    return endpoint.client(
        max_pool_connections=pool,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_supported" if parts else "when_required",
    )


def build_client_now(fs: Any) -> None:
    """Build a tiercache filesystem's boto3 client outside the timer, as the baselines do."""
    client = getattr(fs.store, "client", None)
    if callable(client):
        client()


# -- measurement helpers -----------------------------------------------------------------------


def server_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of the S3 server (or the proxy) process; 0 for None."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prime_page_cache(directory: Path, nbytes: int) -> float:
    """Write then delete ``nbytes`` of scratch data in ``directory``; return the seconds it took.

    On a VM whose balloon driver reports free memory to the host, memory left free for a few
    seconds is taken back, and the first write into it costs several times a normal page-cache
    write (measured here: 1.5-1.7 s instead of 0.2 s per GiB). Cold cache modes fill the page
    cache, a download into memory does not: priming hands every pass the same freshly used pages
    and measures the cache instead of the hypervisor. ``--no-prime`` shows the raw effect.
    """
    start = time.perf_counter()
    block = memoryview(bytearray(b"\xa5" * MiB))
    fd, path = tempfile.mkstemp(prefix="prime-", dir=directory)
    try:
        for offset in range(0, nbytes, MiB):
            os.pwrite(fd, block, offset)
    finally:
        os.close(fd)
        os.unlink(path)
    return time.perf_counter() - start


def count_and_digest(chunks: Iterable[Any]) -> tuple[int, str]:
    """Total byte count and xxh3_128 hex digest of ``chunks`` (bytes-like objects)."""
    hasher = xxhash.xxh3_128()
    count = 0
    for chunk in chunks:
        hasher.update(chunk)
        count += memoryview(chunk).nbytes
    return count, hasher.hexdigest()


# -- baseline checks ---------------------------------------------------------------------------

CHECK_TOLERANCE = 0.15  # a check passes within this fraction of what it is held against
LINK_STREAMS = (1, 2, 4, 8)


def check_result(value: float, expected: float) -> str:
    return "PASS" if abs(value / expected - 1.0) <= CHECK_TOLERANCE else "FAIL"


def run_transfer_plain(endpoint: Endpoint, bucket: str, keys: list[str]) -> list[dict[str, Any]]:
    """Download ``keys`` with boto3's defaults in a new process (benchmarks/transfer_plain.py):
    no thread, client or pool of this one beside it. One row per key: seconds, cpu_s, bytes,
    digest."""
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID=endpoint.key,
        AWS_SECRET_ACCESS_KEY=endpoint.secret,
        AWS_DEFAULT_REGION=endpoint.region,
    )
    script = REPO / "benchmarks" / "transfer_plain.py"
    argv = [sys.executable, str(script), "--endpoint", endpoint.url, "--bucket", bucket, *keys]
    done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    rows: list[dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])["objects"]
    return rows


def link_check(
    endpoint: Endpoint,
    bucket: str,
    key: str,
    size: int,
    profile: dict[str, Any],
    samples: int = 3,
) -> dict[str, Any]:
    """N parallel ranged GETs of one object (plain get_object, one thread and connection
    each) for N in LINK_STREAMS, held against min(N x conn_bps, total_bps) of the profile.

    body_mib_s counts from the first response head to the last byte, so the profile's
    per-request latency is not charged to the link; wall_mib_s counts from the requests.
    The best of ``samples`` counts: other load on the machine only ever slows a sample.
    """
    conn, total = profile["conn_bps"], profile["total_bps"]
    if not (conn or total):
        return {"skipped": "the profile paces nothing"}
    client = make_client(endpoint, pool=max(LINK_STREAMS))
    rows = []
    for n in LINK_STREAMS:
        expected = min(r for r in (n * conn, total) if r)
        runs = [_parallel_ranges(client, bucket, key, size, n) for _ in range(samples)]
        body = max(r[0] for r in runs)
        rows.append(
            {
                "streams": n,
                "expected_mib_s": round(expected / MiB, 1),
                "body_mib_s": round(body / MiB, 1),
                "wall_mib_s": round(max(r[1] for r in runs) / MiB, 1),
                "samples_body_mib_s": [round(r[0] / MiB, 1) for r in runs],
                "ratio": round(body / expected, 3),
                "result": check_result(body, expected),
            }
        )
    return {
        "object_mib": round(size / MiB, 3),
        "tolerance": CHECK_TOLERANCE,
        "rows": rows,
        "result": "PASS" if all(r["result"] == "PASS" for r in rows) else "FAIL",
    }


def _parallel_ranges(client: Any, bucket: str, key: str, size: int, n: int) -> tuple[float, float]:
    """(body, wall) bytes/s of ``n`` threads each reading one nth of the object at once."""
    bounds = [size * i // n for i in range(n + 1)]
    barrier = threading.Barrier(n)
    times: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * n
    errors: list[BaseException] = []

    def fetch(i: int) -> None:
        try:
            want = bounds[i + 1] - bounds[i]
            barrier.wait()
            start = time.perf_counter()
            body = client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={bounds[i]}-{bounds[i + 1] - 1}"
            )["Body"]
            head = time.perf_counter()
            got = 0
            while chunk := body.read(MiB):
                got += len(chunk)
            times[i] = (start, head, time.perf_counter())
            if got != want:
                raise VerifyError(f"link check: {key}: range {i} read {got} bytes, not {want}")
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise next((e for e in errors if isinstance(e, VerifyError)), errors[0])
    end = max(t[2] for t in times)
    return size / (end - min(t[1] for t in times)), size / (end - min(t[0] for t in times))


def print_baseline_checks(checks: dict[str, Any]) -> None:
    """One PASS/FAIL line per check (within CHECK_TOLERANCE of what it is held against)."""
    print(f"\nbaseline checks (PASS: within {CHECK_TOLERANCE:.0%} of the reference)")
    plain = checks.get("transfer_manager_plain")
    if plain:
        print(
            f"  {plain['result']}  boto3_transfer_manager / transfer_manager_plain = "
            f"{plain['ratio']:.3f} ({plain['in_benchmark_mib_s']:.1f} vs {plain['mib_s']:.1f} "
            f"MiB/s; the plain script in a fresh process, boto3 defaults)"
        )
    link = checks.get("link")
    if link and "rows" in link:
        for row in link["rows"]:
            print(
                f"  {row['result']}  link, {row['streams']} parallel ranged GET(s) of one "
                f"{link['object_mib']:g} MiB object: {row['body_mib_s']:.1f} MiB/s (expected "
                f"{row['expected_mib_s']:.1f}, ratio {row['ratio']:.3f}; {row['wall_mib_s']:.1f} "
                "with the request latency)"
            )
    elif link:
        print(f"  -     link: {link['skipped']}")


# -- results -----------------------------------------------------------------------------------


def mount_of(path: str | Path) -> tuple[str, str, str]:
    """The mount ``path`` is on, from /proc/mounts: (mount point, type, source); the type is
    "unknown" where that cannot be read."""
    real = os.path.realpath(path)
    best = ("", "unknown", "")
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) > len(best[0]):
                    best = (point, fields[2], fields[0])
    except OSError:
        pass
    return best


def filesystem_type(path: str) -> str:
    """The type of the filesystem ``path`` is on, from /proc/mounts ("unknown" elsewhere)."""
    return mount_of(path)[1]


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def machine_info(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            n: package_version(n) for n in ("tiercache", "boto3", "botocore", "fsspec", "s3fs")
        },
        "s3_server": "SeaweedFS started by scripts/s3server.py"
        if endpoint.started_here
        else endpoint.url,
    }


def scratch_filesystem(path: Path) -> dict[str, Any]:
    """The filesystem under ``path`` (where a benchmark's tiers and files go): its mount
    point, type and, for ext4, whether it has a journal (None where that cannot be told).

    On ext4 without a journal the kernel skips every inode freed in the last minutes when it
    allocates one (``recently_deleted``, which reads each skipped inode from its table), so
    after thousands of files were removed creating one costs 10-30 times as much, for up to
    six minutes. tiercache creates files for every object it caches, the plain clients none:
    there its cold figures measure the filesystem's history, not the cache.
    """
    point, fstype, source = mount_of(path)
    journal: bool | None = None
    if fstype == "ext4":
        task = Path("/sys/fs/ext4") / os.path.basename(source) / "journal_task"
        with contextlib.suppress(OSError):
            journal = task.read_text().strip() != "<none>"
    return {"mount_point": point, "type": fstype, "journal": journal}


def warn_scratch_filesystem(info: dict[str, Any]) -> None:
    """Say on stderr when the benchmark's files are on an ext4 without a journal."""
    if info["type"] == "ext4" and info["journal"] is False:
        print(
            f"warning: the benchmark's files (its tiers) are on {info['mount_point']}, an ext4 "
            "without a journal, where creating a file after many were removed costs 10-30x "
            "(the kernel's recently_deleted check); cold tiercache figures then measure that. "
            "Point TMPDIR at a filesystem with a journal (an NVMe tier's usual ext4 or xfs).",
            file=sys.stderr,
        )


# A ratio: (name, numerator mode, denominator modes (the fastest counts), target or None).
RatioSpec = tuple[str, str, tuple[str, ...], float | None]


def ratio_rows(
    modes: dict[str, dict[str, Any]], specs: Iterable[RatioSpec]
) -> list[dict[str, Any]]:
    """Each ratio of MiB/s measured in this run, with PASS/MISS against its target."""
    rows = []
    for name, numerator, denominators, target in specs:
        value = modes[numerator]["mib_s"] / max(modes[d]["mib_s"] for d in denominators)
        row: dict[str, Any] = {"name": name, "value": round(value, 3), "target": target}
        if target is not None:
            row["result"] = "PASS" if value >= target else "MISS"
        rows.append(row)
    return rows


def print_ratio_rows(rows: Iterable[dict[str, Any]], width: int) -> None:
    """The ratio table: name, value, target and PASS/MISS."""
    print(f"\n{'ratio':<{width}} {'value':>6} {'target':>7}  result")
    for row in rows:
        target = f">={row['target']:g}" if row["target"] is not None else ""
        print(f"{row['name']:<{width}} {row['value']:>6.3f} {target:>7}  {row.get('result', '')}")


def print_notes(notes: Iterable[str]) -> None:
    print("\nnotes:")
    for note in notes:
        print(f"  - {note}")


def write_json(path: Path, result: Result) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nresults written to {path}")


# -- main --------------------------------------------------------------------------------------


def run_main(
    args: argparse.Namespace,
    tmp_prefix: str,
    benchmark: Callable[[argparse.Namespace, Endpoint, Path], Result],
    print_report: Callable[[Result], None],
    prepare: Callable[[Path], None] | None = None,
    chart: Callable[[Result, Path], None] | None = None,
) -> int:
    """Run ``benchmark`` in a fresh temp dir against the S3 endpoint; report and write JSON.

    ``prepare`` runs on the temp dir before the server starts; ``chart`` draws the result into
    ``args.plot`` when that is given (matplotlib is checked for before the run, not after it).
    Returns the exit status: 1 (after printing the failure) when a mode fails verification,
    2 when --plot cannot be honoured, else 0.
    """
    plot_path: Path | None = getattr(args, "plot", None)
    if plot_path is not None:
        import plot

        try:
            plot.require_matplotlib()
        except plot.PlotUnavailableError as exc:
            print(f"--plot: {exc}", file=sys.stderr)
            return 2
        if chart is None:
            print("--plot: this benchmark has no chart", file=sys.stderr)
            return 2
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix))
    scratch = scratch_filesystem(tmp)
    warn_scratch_filesystem(scratch)
    if prepare is not None:
        prepare(tmp)
    try:
        with s3_endpoint(args.endpoint, tmp, args.store_dir) as endpoint:
            result = benchmark(args, endpoint, tmp)
            if isinstance(result.get("machine"), dict):
                result["machine"]["scratch_filesystem"] = scratch
                if args.store_dir is not None and args.endpoint is None:
                    result["machine"]["store_filesystem"] = scratch_filesystem(args.store_dir)
    except VerifyError as exc:
        print(f"VERIFICATION FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_report(result)
    write_json(args.json, result)
    if plot_path is not None and chart is not None:
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        chart(result, plot_path)
        print(f"chart written to {plot_path}")
    return 0
