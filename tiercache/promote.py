"""Promotion: copy an entry from the shared tier into the local tier (kernel-side copy)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from tiercache.tiers.entry import CachedEntry
from tiercache.tiers.local import LocalTier, remove_file

_COPY_CHUNK = 64 * 1024 * 1024
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)


def promote(src: CachedEntry, dst: LocalTier, lock_timeout: float) -> CachedEntry:
    """Copy ``src`` (a published entry of another tier) into ``dst`` and publish it there.

    The source is read under a shared lock, so the other tier's eviction skips it while it
    is copied; its metadata (ETag, digest, validation time) carries over unchanged.
    """
    meta = src.meta
    with (
        dst.reservation(meta.size) as reserved,
        dst.entry_lock(src.entry_id, lock_timeout) as paths,
    ):
        existing = dst.lookup(src.entry_id, meta.namespace, meta.source)
        if existing is not None and existing.meta.etag == meta.etag and dst.is_intact(existing):
            return existing
        fd_in = os.open(src.paths.data, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd_in, fcntl.LOCK_SH)
            if os.fstat(fd_in).st_size != meta.size:
                raise FileNotFoundError(2, "shared entry is torn", src.paths.data)
            fd_out = dst.create_part(paths)
            try:
                _copy(fd_in, fd_out, meta.size)
                return reserved.publish(paths, fd_out, meta)
            except BaseException:
                with contextlib.suppress(OSError):
                    remove_file(paths.part)
                raise
            finally:
                os.close(fd_out)
        finally:
            os.close(fd_in)


def _copy(fd_in: int, fd_out: int, size: int) -> None:
    copied = 0
    kernel = True
    while copied < size:
        count = min(_COPY_CHUNK, size - copied)
        if kernel:
            try:
                n = os.copy_file_range(fd_in, fd_out, count, copied, copied)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
        else:
            data = os.pread(fd_in, min(count, 8 * 1024 * 1024), copied)
            n = os.pwrite(fd_out, data, copied) if data else 0
        if n == 0:
            raise OSError(errno.EIO, f"source ended at byte {copied} of {size}")
        copied += n
