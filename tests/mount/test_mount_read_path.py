"""Reads through the mount: cold random reads fetch ranges, kept pages, the kernel read-ahead
and the background requests that keep it going under load."""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, mount_counters, requires_fuse

from tiercache.mount.binding import BACKGROUND_REQUESTS, CONGESTION_THRESHOLD, READ_AHEAD_KB

pytestmark = [pytest.mark.integration, requires_fuse]

MiB = 1024 * 1024


def _cached(cli: Cli, url: str) -> bool:
    (entry,) = cli.json("ls", url)
    return bool(entry["cached"])


def _mount_counters(cli: Cli, mnt: Path, least_read: int) -> dict[str, Any]:
    """The mount's counters once they show at least ``least_read`` bytes read (published ~1/s)."""
    return mount_counters(cli, mnt, lambda counters: counters["bytes_read"] >= least_read)


def _settled_counters(cli: Cli, mnt: Path, least_read: int) -> dict[str, Any]:
    """The mount's counters once they show ``least_read`` bytes and stay put over two publications.

    The kernel may still have a read of the same file in flight (read-ahead, the read at the end
    of the file) when the counters first pass ``least_read``.
    """
    counters = _mount_counters(cli, mnt, least_read)
    for _ in range(8):
        time.sleep(2.5)  # two publications of the counters
        again = _mount_counters(cli, mnt, least_read)
        if again["bytes_read"] == counters["bytes_read"]:
            return again
        counters = again
    raise AssertionError(f"the mount's reads never settled: {counters}")


def test_random_reads_of_a_cold_object_fetch_ranges_and_a_sequential_one_caches_it(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    body = os.urandom(16 * MiB)
    s3_client.put_object(Bucket=bucket, Key="r/big.bin", Body=body)
    s3_client.put_object(Bucket=bucket, Key="r/seq.bin", Body=body[: 4 * MiB])
    s3_client.put_object(Bucket=bucket, Key="r/small.bin", Body=body[:5000])
    mnt = mount(f"s3://{bucket}/r", "--read-only")
    picks = random.Random(7)
    with open(mnt / "big.bin", "rb", buffering=0) as f:
        for _ in range(20):
            offset = picks.randrange(MiB, len(body) - 4096) & ~4095
            assert os.pread(f.fileno(), 4096, offset) == body[offset : offset + 4096]
    counters = _mount_counters(cli, mnt, 20 * 4096)
    # Twenty 4 KiB reads moved their ranges, not the 16 MiB object.
    assert counters["bytes_fetched"] < 2 * MiB, counters
    assert not _cached(cli, f"s3://{bucket}/r/big.bin")

    assert (mnt / "seq.bin").read_bytes() == body[: 4 * MiB]  # sequential: fetched whole
    assert (mnt / "small.bin").read_bytes() == body[:5000]  # one read takes it all
    assert _cached(cli, f"s3://{bucket}/r/seq.bin")
    assert _cached(cli, f"s3://{bucket}/r/small.bin")


def test_an_unchanged_file_is_read_again_from_the_kernels_pages(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    body = os.urandom(2 * MiB)
    s3_client.put_object(Bucket=bucket, Key="k/a.bin", Body=body)
    mnt = mount(f"s3://{bucket}/k")  # read-write, consistency ttl: pages kept only if unchanged
    assert (mnt / "a.bin").read_bytes() == body
    first = _settled_counters(cli, mnt, len(body))["bytes_read"]
    assert (mnt / "a.bin").read_bytes() == body
    time.sleep(2.5)  # two publications of the counters
    # The kernel's kept pages served the second read: a file whose pages were dropped is read
    # whole again (2 MiB). A few pages may still reach the mount: once in CI, 8 KiB of the
    # 2 MiB did, pages the kernel had reclaimed in between, which the mount cannot prevent.
    again = _mount_counters(cli, mnt, first)["bytes_read"] - first
    assert again <= 64 * 1024, again

    changed = os.urandom(2 * MiB)
    (mnt / "a.bin").write_bytes(changed)  # a new version: its pages are not the old ones
    assert (mnt / "a.bin").read_bytes() == changed


def test_the_mount_raises_the_kernels_read_ahead(
    bucket: str, cli: Cli, mount: Callable[..., Path]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root may set a mount's read-ahead (/sys/class/bdi is root's)")
    mnt = mount(f"s3://{bucket}", "--read-only")
    device = os.stat(mnt).st_dev
    knob = Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")
    deadline = time.monotonic() + 10
    while int(knob.read_text()) != READ_AHEAD_KB:  # set just after the mount comes up
        assert time.monotonic() < deadline, knob.read_text()
        time.sleep(0.1)


FUSECTL = Path("/sys/fs/fuse/connections")


def _fuse_connections() -> Path:
    """The kernel's FUSE control filesystem (mounted here if it is not)."""
    if not any(FUSECTL.iterdir()):
        # Refused when another process mounted it meanwhile: the check below tells.
        subprocess.run(["mount", "-t", "fusectl", "none", str(FUSECTL)], check=False)
    assert any(FUSECTL.iterdir()), f"no FUSE connection listed in {FUSECTL}"
    return FUSECTL


def test_the_mount_lets_the_kernel_keep_reading_ahead_under_load(
    bucket: str, mount: Callable[..., Path]
) -> None:
    """Many readers of cold files keep many read-ahead requests waiting on the store: the
    mount raises the kernel's limits (libfuse's are 12 and 9), past which the kernel stops
    reading ahead and splits files into requests of a page or a few."""
    if os.geteuid() != 0 or not FUSECTL.is_dir():
        pytest.skip("the FUSE control filesystem is root's (/sys/fs/fuse/connections)")
    mnt = mount(f"s3://{bucket}", "--read-only")
    connection = _fuse_connections() / str(os.minor(os.stat(mnt).st_dev))
    assert int((connection / "max_background").read_text()) == BACKGROUND_REQUESTS
    assert int((connection / "congestion_threshold").read_text()) == CONGESTION_THRESHOLD
