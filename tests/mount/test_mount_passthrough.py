"""FUSE passthrough on a real mount: warm read-only opens read by the kernel from the tier file."""

from __future__ import annotations

import errno
import mmap
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, mount_counters, requires_fuse

from tiercache.mount.library import built_libfuse

MiB = 1024 * 1024


def _why_not() -> str | None:
    """Why this host cannot pass reads through (None: it can)."""
    if os.geteuid() != 0:
        return "the kernel lets only root name backing files"
    if built_libfuse() is None:
        return "no libfuse >= 3.16 in this environment (scripts/build-libfuse.sh builds one)"
    major, minor = (int(n) for n in platform.release().split(".")[:2])
    if (major, minor) < (6, 9):
        return f"kernel {platform.release()} has no FUSE passthrough (6.9 or later)"
    return None


pytestmark = [
    pytest.mark.integration,
    requires_fuse,
    pytest.mark.skipif(_why_not() is not None, reason=f"passthrough: {_why_not()}"),
]


def _warm(cli: Cli, mnt: Path, name: str, body: bytes) -> dict[str, Any]:
    """Read ``name`` once through the mount (it lands in the tier); the counters after it."""
    assert (mnt / name).read_bytes() == body
    return mount_counters(cli, mnt, lambda c: c["bytes_read"] >= len(body))


def _mounted_warm(
    s3_client: Any, bucket: str, cli: Cli, mount: Callable[..., Path], size: int, *flags: str
) -> tuple[Path, bytes, dict[str, Any]]:
    """A mount of ``p/`` holding ``a.bin`` (``size`` random bytes) read once, so in the tier;
    the mountpoint, the bytes and the counters after that read."""
    body = os.urandom(size)
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=body)
    mnt = mount(f"s3://{bucket}/p", *flags)  # read-write, the default consistency
    return mnt, body, _warm(cli, mnt, "a.bin", body)


def _dropped_read(path: Path) -> bytes:
    """The file's bytes, read after dropping the pages the kernel holds of the open file."""
    with path.open("rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return f.read()


def test_a_warm_read_only_open_is_read_by_the_kernel_not_the_mount(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt, body, before = _mounted_warm(s3_client, bucket, cli, mount, 4 * MiB)
    assert _dropped_read(mnt / "a.bin") == body
    with (mnt / "a.bin").open("rb") as f:  # a read-only mapping reads the tier file too
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            assert mapped[-4096:] == body[-4096:]
        finally:
            mapped.close()
    after = mount_counters(cli, mnt, lambda c: c["passthrough_opens"] >= 2)
    # Dropping the open file's pages made no read reach the mount: the kernel read the tier
    # file. Served by the mount, the second read would have read the 4 MiB again.
    assert after["bytes_read"] == before["bytes_read"]


def test_without_passthrough_the_mount_serves_every_read(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt, body, before = _mounted_warm(s3_client, bucket, cli, mount, 2 * MiB, "--no-passthrough")
    assert _dropped_read(mnt / "a.bin") == body
    after = mount_counters(cli, mnt, lambda c: c["bytes_read"] >= before["bytes_read"] + len(body))
    assert after["passthrough_opens"] == 0


def test_a_writer_is_refused_while_passthrough_readers_hold_the_file_then_writes(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt, body, _ = _mounted_warm(s3_client, bucket, cli, mount, 1 * MiB)
    with (mnt / "a.bin").open("rb") as first, (mnt / "a.bin").open("rb") as second:
        assert first.read() == body and second.read() == body  # the second joins the first
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC):
            with pytest.raises(OSError) as refused:
                os.close(os.open(mnt / "a.bin", flags))
            assert refused.value.errno == errno.ETXTBSY
        assert first.read() == b""  # the readers are not disturbed
    changed = os.urandom(1 * MiB)
    (mnt / "a.bin").write_bytes(changed)  # the readers closed: the writer may open it
    assert (mnt / "a.bin").read_bytes() == changed
    done = cli("flush", "--timeout", "60", timeout=90)
    assert done.returncode == 0, done.stderr
    assert s3_client.get_object(Bucket=bucket, Key="p/a.bin")["Body"].read() == changed


def test_a_file_open_for_writing_is_read_through_the_mount_not_passed_through(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt, body, _ = _mounted_warm(s3_client, bucket, cli, mount, 1 * MiB)
    with (mnt / "a.bin").open("r+b") as writer:
        writer.write(b"new bytes")
        writer.flush()
        with (mnt / "a.bin").open("rb") as reader:  # sees what the writer wrote
            assert reader.read() == b"new bytes" + body[9:]
    time.sleep(2.5)  # two publications of the counters
    assert mount_counters(cli, mnt, lambda c: True)["passthrough_opens"] == 0  # the mount served
    # Committed at the writer's close and in the tier: the next open is passed through.
    assert (mnt / "a.bin").read_bytes() == b"new bytes" + body[9:]
    mount_counters(cli, mnt, lambda c: c["passthrough_opens"] == 1)


def test_a_renamed_open_file_keeps_its_passthrough_and_a_new_file_at_its_name_does_not(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt, body, _ = _mounted_warm(s3_client, bucket, cli, mount, 1 * MiB)
    other = os.urandom(1 * MiB)
    with (mnt / "a.bin").open("rb") as reader:
        os.rename(mnt / "a.bin", mnt / "b.bin")
        (mnt / "a.bin").write_bytes(other)  # a new file at the old name: not held by the reader
        assert (mnt / "a.bin").read_bytes() == other
        assert reader.read() == body
        with pytest.raises(OSError) as refused:  # the renamed file is still held
            os.close(os.open(mnt / "b.bin", os.O_WRONLY))
        assert refused.value.errno == errno.ETXTBSY
    assert (mnt / "b.bin").read_bytes() == body


def test_a_write_right_after_a_passthrough_reader_closed_is_not_refused(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    mnt, body, _ = _mounted_warm(s3_client, bucket, cli, mount, 256 * 1024)
    for round_ in range(10):  # read, then write at once: the reader's release may lag its close
        assert (mnt / "a.bin").read_bytes() == body
        body = os.urandom(256 * 1024)
        (mnt / "a.bin").write_bytes(body)
        assert (mnt / "a.bin").read_bytes() == body, round_
