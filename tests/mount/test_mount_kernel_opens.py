"""``--kernel-opens``: a read-only mount of immutable objects whose opens send no request."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import random
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, mount_counters, requires_fuse

from tiercache.libc import libc_function

pytestmark = [pytest.mark.integration, requires_fuse]

KERNEL_OPENS = ("--read-only", "--consistency", "immutable", "--kernel-opens")
KiB = 1024


def _upload(s3_client: Any, bucket: str, prefix: str, bodies: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda item: s3_client.put_object(
                    Bucket=bucket, Key=f"{prefix}/{item[0]}", Body=item[1]
                ),
                bodies.items(),
            )
        )


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:  # open() as a dataset does (it asks isatty: an ioctl)
        return f.read()


_mmap = libc_function(
    "mmap",
    [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long],
    ctypes.c_void_p,
)
_mlock = libc_function("mlock", [ctypes.c_void_p, ctypes.c_size_t])
_munmap = libc_function("munmap", [ctypes.c_void_p, ctypes.c_size_t])
_MAP_FAILED = ctypes.c_void_p(-1).value


@contextmanager
def _pages_locked(paths: Iterable[Path]) -> Iterator[None]:
    """Each file mapped shared and its pages locked in memory (read in where not cached):
    reclaim takes no locked page, while an invalidation of a file's cache still drops them."""
    limits = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (limits[1], limits[1]))
    mapped: list[tuple[int, int]] = []
    try:
        for path in paths:
            size = path.stat().st_size
            if not size:
                continue
            fd = os.open(path, os.O_RDONLY)
            try:  # the mapping holds the file; no open reaches the mount
                address = _mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            finally:
                os.close(fd)
            if address in (None, _MAP_FAILED):
                raise OSError(ctypes.get_errno(), "mmap failed", str(path))
            mapped.append((address, size))
            if _mlock(address, size) != 0:
                code = ctypes.get_errno()
                pytest.skip(f"cannot lock the files' pages here: {os.strerror(code)} (mlock)")
        yield
    finally:
        for address, size in mapped:
            _munmap(address, size)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, limits)


def test_files_read_whole_by_many_threads_need_no_open_after_the_first_and_keep_their_pages(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    picks = random.Random(seed)
    sizes = [0, 1, 4095, 4096, 128 * KiB, 300 * KiB + 7] + [
        picks.randrange(1, 200 * KiB) for _ in range(34)
    ]
    bodies = {f"f{i:03d}.bin": os.urandom(size) for i, size in enumerate(sizes)}
    _upload(s3_client, bucket, "ds", bodies)
    mnt = mount(f"s3://{bucket}/ds", *KERNEL_OPENS)
    names = list(bodies)
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda n: _read(mnt / n), names)) == list(bodies.values())
    total = sum(len(b) for b in bodies.values())
    # A second epoch, in another order: no open reaches the mount, no file is opened again
    # and no byte is read again. The kernel promises that an open keeps a file's cached
    # pages (FUSE's zero-message open implies FOPEN_KEEP_CACHE), and drops them itself only
    # when getattr reports another size or mtime; it does not promise to keep a clean page
    # in memory: reclaim takes any it likes, and on a loaded machine as many as it likes (a
    # CI run once read one page of these files again, another 37 KiB: more than the 1 %
    # allowed then). So the pages are locked in memory between the epochs (reclaim leaves a
    # locked page alone, an invalidation does not): a byte read again is then one the kernel
    # dropped on purpose, as an open without keep_cache or a changed mtime would make it.
    with _pages_locked(mnt / n for n in names):
        time.sleep(2.5)  # two publications of the counters: every read before counted
        first = mount_counters(cli, mnt, lambda c: c.get("bytes_read", 0) >= total)
        # The first opens (at most one per reader thread, sent before the kernel heard the
        # answer) are answered ENOSYS; the kernel opens every file after them by itself.
        assert 1 <= first["open_requests"] <= 8, first
        assert first["kernel_opened_files"] == len([s for s in sizes if s]), first
        assert first["passthrough_opens"] == 0
        picks.shuffle(names)
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda n: _read(mnt / n), names))
        assert got == [bodies[n] for n in names]
        time.sleep(2.5)
        again = mount_counters(cli, mnt, lambda c: True)
    for counter in ("open_requests", "kernel_opened_files", "bytes_read"):
        assert again[counter] == first[counter], (counter, first[counter], again[counter])


def test_random_reads_seeks_fstat_and_mmap_of_a_kernel_opened_file(
    bucket: str, s3_client: Any, mount: Callable[..., Path]
) -> None:
    body = os.urandom(3 * 1024 * KiB + 123)
    s3_client.put_object(Bucket=bucket, Key="big/blob.bin", Body=body)
    mnt = mount(f"s3://{bucket}/big", *KERNEL_OPENS)
    picks = random.Random(11)
    fd = os.open(mnt / "blob.bin", os.O_RDONLY)
    try:
        assert os.fstat(fd).st_size == len(body)
        for _ in range(30):  # out of order: ranged reads of a cold object
            offset = picks.randrange(len(body))
            assert os.pread(fd, 5000, offset) == body[offset : offset + 5000]
        assert os.lseek(fd, -10, os.SEEK_END) == len(body) - 10
        assert os.read(fd, 100) == body[-10:]
    finally:
        os.close(fd)
    with open(mnt / "blob.bin", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[:] == body
    with pytest.raises(OSError) as refused:
        os.close(os.open(mnt / "blob.bin", os.O_RDWR))
    assert refused.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError):
        os.close(os.open(mnt / "missing.bin", os.O_RDONLY))


def test_kernel_opens_are_refused_where_objects_may_change_or_files_be_written(
    bucket: str, cli: Cli, tmp_path: Path
) -> None:
    mnt = tmp_path / "refused"
    mnt.mkdir()
    for flags, said in (
        (("--consistency", "immutable", "--kernel-opens"), "read-write"),
        (("--read-only", "--consistency", "ttl", "--kernel-opens"), "'ttl'"),
    ):
        done = cli("mount", f"s3://{bucket}/x", str(mnt), *flags)
        assert done.returncode != 0
        assert "--kernel-opens needs --read-only and --consistency immutable" in done.stderr
        assert said in done.stderr
        assert not os.path.ismount(mnt)
