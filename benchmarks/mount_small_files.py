"""The mount benchmark's small-file section: loose files read whole through a read-only mount."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common
from common import Endpoint
from small_objects_bench import (
    Dataset,
    delete_dataset,
    read_all_once,
    torch_missing,
    upload,
    verify,
)

POOL = 64  # boto3 threads: the usual hand-written loader
THREADS = (1, 4, 16)  # reader threads through the mount
LOADER_WORKERS = 4
PREFIX = "small"  # where small_objects_bench.upload puts the objects
KERNEL_OPENS = ("--read-only", "--consistency", "immutable", "--kernel-opens")
WITH_OPENS = ("--read-only", "--consistency", "immutable")

NOTES = (
    "small files: every file read whole with open().read() (what a path-based dataset "
    "does); the timer covers the reads, not the check after it (xxh3_128 of every file), "
    "and starts after a sync (earlier modes' writeback is not charged to the next).",
    f"boto3_pool{POOL}: get_object from {POOL} threads. local_t1/local_t16: the same bytes in "
    f"page-cache-warm local files; local_dataloader_w{LOADER_WORKERS}: those files through the "
    "DataLoader below.",
    "mount_cold_tN: a fresh tier behind a fresh `--read-only --consistency immutable "
    "--kernel-opens` mount, N reader threads. mount_warm_tN: the same mount again once a "
    "cold pass has read every file (tier and kernel page cache warm). mount_warm_new_t1: "
    "a new mount over that warm tier (every file's first read reaches the mount process).",
    "*_opens: the same without --kernel-opens (every open and close is a request to the mount "
    "process; warm reads by passthrough where it is available).",
    "open_us: microseconds per warm file of each step alone (os.open + os.close; os.isatty, "
    "the ioctl Python's open() sends; os.open + os.read + os.close; open().read()), on the "
    "--kernel-opens mount after its warm passes, on the mount without it, and on local files.",
    f"mount_dataloader_w{LOADER_WORKERS}_cold/_warm: a torch DataLoader (map-style dataset of "
    f"paths under the mountpoint, batch_size=None, {LOADER_WORKERS} workers, fork) on a fresh "
    "tier and mount, then a second epoch.",
)

RATIOS: tuple[common.RatioSpec, ...] = (
    ("mount_cold_t16 / boto3_pool64", "mount_cold_t16", (f"boto3_pool{POOL}",), 0.8),
    ("mount_warm_t1 / local_t1", "mount_warm_t1", ("local_t1",), 0.3),
    ("mount_warm_t16 / local_t16", "mount_warm_t16", ("local_t16",), 0.3),
    ("mount_cold_t1 / boto3_pool64", "mount_cold_t1", (f"boto3_pool{POOL}",), None),
    ("mount_cold_t4 / boto3_pool64", "mount_cold_t4", (f"boto3_pool{POOL}",), None),
    ("mount_warm_new_t1 / local_t1", "mount_warm_new_t1", ("local_t1",), None),
    ("mount_cold_t16_opens / boto3_pool64", "mount_cold_t16_opens", (f"boto3_pool{POOL}",), None),
    ("mount_warm_t1_opens / local_t1", "mount_warm_t1_opens", ("local_t1",), None),
    ("mount_warm_t16_opens / local_t16", "mount_warm_t16_opens", ("local_t16",), None),
    (
        f"mount_dataloader_w{LOADER_WORKERS}_cold / boto3_pool64",
        f"mount_dataloader_w{LOADER_WORKERS}_cold",
        (f"boto3_pool{POOL}",),
        None,
    ),
    (
        f"mount_dataloader_w{LOADER_WORKERS}_warm / local_dataloader_w{LOADER_WORKERS}",
        f"mount_dataloader_w{LOADER_WORKERS}_warm",
        (f"local_dataloader_w{LOADER_WORKERS}",),
        None,
    ),
)

Mounter = Callable[[Path, Sequence[str]], AbstractContextManager[Path]]


# Where a warm open's time goes, each step alone over every file (microseconds, median of
# rounds): os.open + os.close; os.isatty on an open file (the ioctl Python's open() sends);
# os.open + os.read of the whole file + os.close; Python's open().read().
OPEN_STEPS = ("open_close", "isatty", "open_read_close", "python_open_read")


def open_costs(root: Path, names: Sequence[str], rounds: int = 3) -> dict[str, float]:
    """Microseconds per file of each step of ``OPEN_STEPS`` under ``root`` (warm files)."""
    paths = [str(root / n) for n in names]

    def open_close() -> None:
        for p in paths:
            os.close(os.open(p, os.O_RDONLY))

    def isatty() -> None:
        fd = os.open(paths[0], os.O_RDONLY)
        try:
            for _ in paths:
                os.isatty(fd)
        finally:
            os.close(fd)

    def open_read_close() -> None:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                while os.read(fd, 1 << 20):
                    pass
            finally:
                os.close(fd)

    def python_open_read() -> None:
        for p in paths:
            read_file(Path(p))

    steps = dict(
        zip(OPEN_STEPS, (open_close, isatty, open_read_close, python_open_read), strict=True)
    )
    costs = {}
    for name, step in steps.items():
        taken = []
        for _ in range(rounds):
            start = time.perf_counter()
            step()
            taken.append(time.perf_counter() - start)
        costs[name] = round(statistics.median(taken) / len(paths) * 1e6, 1)
    return costs


@dataclass
class SmallFiles:
    """One run's dataset, how to mount it, and the seconds each mode took."""

    endpoint: Endpoint
    ds: Dataset
    tmp: Path
    mount: Mounter  # (tier, flags) -> the mountpoint, while the block runs
    samples: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    open_us: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [k.rsplit("/", 1)[-1] for k in self.ds.keys]

    def time(self, mode: str, read: Callable[[], list[bytes]]) -> None:
        # What earlier modes wrote (their tiers) is flushed before the timer starts: its
        # writeback (kernel threads, and on a loop-mounted scratch filesystem the loop device's
        # own) otherwise lands in whichever pass runs some 30 s later, on the same cores.
        os.sync()
        start = time.perf_counter()
        blobs = read()
        seconds = time.perf_counter() - start
        verify(mode, self.ds, blobs)
        self.samples.setdefault(mode, []).append(seconds)


def read_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_files(root: Path, names: Sequence[str], threads: int) -> list[bytes]:
    """Every file under ``root``, by ``threads`` readers (in order for one)."""
    paths = [root / name for name in names]
    if threads == 1:
        return [read_file(p) for p in paths]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(read_file, paths))


class MountedFiles:
    """A map-style dataset of paths (what a path-based dataset hands a DataLoader)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        with open(self.paths[i], "rb") as f:
            return i, f.read()


def read_with_loader(root: Path, names: Sequence[str]) -> list[bytes]:
    import torch.utils.data

    warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
    dataset: Any = MountedFiles([str(root / n) for n in names])
    loader: Any = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=LOADER_WORKERS)
    blobs: list[Any] = [None] * len(names)
    for i, data in loader:
        blobs[i] = data
    return blobs


def fresh_tier(run: SmallFiles, name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"small-{name}-", dir=run.tmp))


def run_repeat(run: SmallFiles) -> None:
    """Every mode once, the plain baselines first."""
    names = run.names()
    client = common.make_client(run.endpoint, pool=POOL)
    client.head_bucket(Bucket=run.ds.bucket)  # built and connected outside the timer
    run.time(f"boto3_pool{POOL}", lambda: boto3_pool(client, run.ds))
    for path in run.ds.local_paths:
        path.read_bytes()  # page cache warm
    local = Path(run.ds.local_dir)
    run.time("local_t1", lambda: read_files(local, names, 1))
    run.time("local_t16", lambda: read_files(local, names, 16))
    if torch_missing() is None:
        run.time(f"local_dataloader_w{LOADER_WORKERS}", lambda: read_with_loader(local, names))
    for threads in THREADS:
        tier = fresh_tier(run, f"t{threads}")
        with run.mount(tier, KERNEL_OPENS) as mnt:
            run.time(f"mount_cold_t{threads}", lambda: read_files(mnt, names, threads))  # noqa: B023
            if threads == THREADS[-1]:
                run.time("mount_warm_t1", lambda: read_files(mnt, names, 1))
                run.time("mount_warm_t16", lambda: read_files(mnt, names, 16))
                run.open_us.setdefault("kernel_opens", []).append(open_costs(mnt, names))
    with run.mount(tier, KERNEL_OPENS) as mnt:
        run.time("mount_warm_new_t1", lambda: read_files(mnt, names, 1))
    tier = fresh_tier(run, "opens")
    with run.mount(tier, WITH_OPENS) as mnt:
        run.time("mount_cold_t16_opens", lambda: read_files(mnt, names, 16))
        run.time("mount_warm_t1_opens", lambda: read_files(mnt, names, 1))
        run.time("mount_warm_t16_opens", lambda: read_files(mnt, names, 16))
        run.open_us.setdefault("opens", []).append(open_costs(mnt, names))
    run.open_us.setdefault("local", []).append(open_costs(local, names))
    if (reason := torch_missing()) is not None:
        run.skipped[f"mount_dataloader_w{LOADER_WORKERS}"] = reason
        return
    tier = fresh_tier(run, "loader")
    with run.mount(tier, KERNEL_OPENS) as mnt:
        run.time(f"mount_dataloader_w{LOADER_WORKERS}_cold", lambda: read_with_loader(mnt, names))
        run.time(f"mount_dataloader_w{LOADER_WORKERS}_warm", lambda: read_with_loader(mnt, names))


def boto3_pool(client: Any, ds: Dataset) -> list[bytes]:
    def get(key: str) -> bytes:
        data: bytes = client.get_object(Bucket=ds.bucket, Key=key)["Body"].read()
        return data

    with ThreadPoolExecutor(POOL) as pool:
        return list(pool.map(get, ds.keys))


def summarize(run: SmallFiles) -> dict[str, dict[str, Any]]:
    files = len(run.ds.keys)
    modes = {}
    for mode, samples in run.samples.items():
        seconds = statistics.median(samples)
        modes[mode] = {
            "files": files,
            "seconds": round(seconds, 4),
            "files_s": round(files / seconds, 1),
            "mib_s": round(run.ds.total_bytes / common.MiB / seconds, 1),
            "samples_s": [round(s, 4) for s in samples],
        }
    return modes


@contextmanager
def uploaded(direct: Any, count: int, kib: int, tmp: Path) -> Iterator[Dataset]:
    """Upload the dataset (straight to the server), read it once untimed; delete it after."""
    local = Path(tempfile.mkdtemp(prefix="small-files-", dir=tmp))
    ds = upload(direct, argparse.Namespace(objects=count, object_kib=kib), local)
    read_all_once(direct, ds)
    try:
        yield ds
    finally:
        delete_dataset(direct, ds)


def benchmark(run: SmallFiles, repeat: int) -> dict[str, Any]:
    for _ in range(repeat):
        run_repeat(run)
    modes = summarize(run)
    return {
        "files": len(run.ds.keys),
        "file_kib": run.ds.size // 1024,
        "modes": modes,
        "ratios": common.ratio_rows(modes, [r for r in RATIOS if r[1] in modes]),
        "skipped": dict(run.skipped),
        "open_us": {
            where: {step: statistics.median(r[step] for r in rows) for step in OPEN_STEPS}
            for where, rows in run.open_us.items()
        },
        "notes": list(NOTES),
        "cpus": os.cpu_count(),
    }


def print_section(section: dict[str, Any]) -> None:
    print(f"\nsmall files: {section['files']} x {section['file_kib']} KiB, each read whole")
    print(f"{'mode':<28} {'files/s':>9} {'MiB/s':>8}")
    for mode, row in section["modes"].items():
        print(f"{mode:<28} {row['files_s']:>9.1f} {row['mib_s']:>8.1f}")
    for mode, reason in section["skipped"].items():
        print(f"{mode:<28} skipped: {reason}")
    common.print_ratio_rows(section["ratios"], 62)
    print(f"\nwarm open, microseconds per file  {'  '.join(f'{s:>16}' for s in OPEN_STEPS)}")
    for where, costs in section["open_us"].items():
        print(f"{where:<33}  {'  '.join(f'{costs[s]:>16.1f}' for s in OPEN_STEPS)}")
