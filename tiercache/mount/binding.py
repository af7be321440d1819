"""The mfusepy ``FUSE`` class with reads copied straight into libfuse's buffer, and read-ahead.

Measured on the development VM (256 MiB object in the local tier, fresh mount, 8 MiB reads):
mfusepy's own ``read`` with the kernel's default 128 KiB read-ahead served 0.2x a plain
local read; a 4 MiB read-ahead, which lets the kernel send 1 MiB requests, doubled that.
Handing libfuse the tier file's descriptor (``read_buf``, with or without splice) and
``direct_io`` measured no better, so neither is used (``direct_io`` would also refuse shared
``mmap`` with libfuse before 3.16, which numpy and Arrow readers use). libfuse's
single-threaded loop (``nothreads``) measured the same as the multi-threaded one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Any

from tiercache.mount.library import prefer_libfuse3

log = logging.getLogger("tiercache.mount")

# The kernel's read-ahead for the mount (KiB); its default of 128 KiB caps requests at that.
READ_AHEAD_KB = 4096
# Requests the kernel may keep in flight in the background (read-ahead, writeback) before it
# counts the mount congested, and where congestion starts. A congested mount gets no
# read-ahead: with libfuse's defaults (12 and 9), sixteen readers of cold files, each waiting
# on the store, congested it, and the kernel split their files into requests of a page or a
# few (1.56 READ requests per 128 KiB file on average, where one does).
BACKGROUND_REQUESTS = 64
CONGESTION_THRESHOLD = BACKGROUND_REQUESTS * 3 // 4


def fuse_class(mountpoint: str) -> Any:
    """mfusepy's FUSE, reading into libfuse's buffer and raising the mount's read-ahead."""
    prefer_libfuse3()
    import mfusepy  # noqa: PLC0415  (an optional extra: the rest of tiercache works without)

    # From libfuse 3.12 on, worker threads are never ended for being idle (unless asked).
    keep_threads = (mfusepy.fuse_version_major, mfusepy.fuse_version_minor) >= (3, 12)

    class FUSE(mfusepy.FUSE):  # type: ignore[misc]
        def _wrapper(self, func: Any, *args: Any, **kwargs: Any) -> Any:
            if keep_threads:
                _keep_thread_state()
            return super()._wrapper(func, *args, **kwargs)

        def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
            # mfusepy's read has the operation return bytes and then copies them: reading
            # into libfuse's buffer saves a copy and an allocation per request.
            target = (ctypes.c_char * size).from_address(ctypes.addressof(buf.contents))
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            done: int = self.operations.read_into(
                decoded, memoryview(target).cast("B"), offset, fip.contents
            )
            return done

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            # mfusepy drops the open file of an ftruncate; the mount needs it (no path is
            # given for a file unlinked while open).
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            done: int = self.operations.truncate(decoded, length, fip.contents if fip else None)
            return done

        def utimens_fuse_2(self, path: bytes | None, buf: Any) -> int:
            # mfusepy folds UTIME_NOW and UTIME_OMIT into the nanoseconds; the mount needs
            # them apart (``touch -m`` leaves the atime, ``touch`` sets now).
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            times = None
            if buf:
                times = (_ns(buf.contents.actime), _ns(buf.contents.modtime))
            done: int = self.operations.utimens(decoded, times)
            return done

        def init_fuse_3(self, conn: Any, config: Any) -> None:
            _tune_kernel(mountpoint, conn)
            passthrough = getattr(self.operations, "passthrough", None)
            if passthrough is not None and conn:
                version = (mfusepy.fuse_version_major, mfusepy.fuse_version_minor)
                passthrough.negotiate(conn.contents, version)
            super().init_fuse_3(conn, config)

        def init_fuse_2(self, conn: Any) -> None:
            # mfusepy loads libfuse 2 where both are installed: the kernel is tuned there too.
            _tune_kernel(mountpoint, conn)
            super().init_fuse_2(conn)

    return FUSE


_kept_threads: set[int] = set()  # only each thread adds itself: no lock needed


def _keep_thread_state() -> None:
    """Keep the Python thread state of the libfuse thread serving this request.

    A ctypes callback on a thread Python did not start makes a thread state for the call and
    deletes it after: every request paid for a new one (its frame stack mapped and unmapped,
    ``threading.local`` values lost). One more ``PyGILState_Ensure``, never released, keeps it
    for the thread's next requests. Only with libfuse 3.12 or later, which keeps its worker
    threads (up to ``max_threads``) for the life of the mount: at most that many are kept
    (libfuse 2 ends idle threads beyond ten, whose thread states would then be left behind).
    """
    ident = threading.get_ident()
    if ident not in _kept_threads:
        _kept_threads.add(ident)
        ctypes.pythonapi.PyGILState_Ensure()


_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2


def _ns(ts: Any) -> int | None:
    """A ``timespec`` in nanoseconds; None for UTIME_OMIT."""
    if ts.tv_nsec == _UTIME_OMIT:
        return None
    if ts.tv_nsec == _UTIME_NOW:
        return time.time_ns()
    return int(ts.tv_sec) * 10**9 + int(ts.tv_nsec)


def caller_pid() -> int:
    """The pid of the process behind the FUSE request being served (0 when unknown)."""
    prefer_libfuse3()
    import mfusepy  # noqa: PLC0415

    return int(mfusepy.fuse_get_context()[2])


def _tune_kernel(mountpoint: str, conn: Any) -> None:
    """At INIT: raise the mount's read-ahead (once the kernel has the mount) and let the kernel
    keep ``BACKGROUND_REQUESTS`` in flight before it stops reading ahead (it lowers them to
    its own limit for a mount by an unprivileged user)."""
    threading.Thread(
        target=_raise_read_ahead, args=(mountpoint,), name="mount-readahead", daemon=True
    ).start()
    if conn:
        conn.contents.max_background = BACKGROUND_REQUESTS
        conn.contents.congestion_threshold = CONGESTION_THRESHOLD


def _raise_read_ahead(mountpoint: str) -> None:
    """Set the mount's read-ahead once the kernel has it.

    The kernel lowers it to what INIT's answer allows right after ``init`` returns, so it is
    set shortly after, and once more a little later. Only root may; otherwise the kernel's
    default stays and reads arrive in 128 KiB requests.
    """
    for delay in (0.1, 0.9):
        time.sleep(delay)
        device = _device_of(os.path.realpath(mountpoint))
        if device is None:
            continue
        try:
            with open(f"/sys/class/bdi/{device}/read_ahead_kb", "w", encoding="ascii") as f:
                f.write(str(READ_AHEAD_KB))
        except OSError as exc:
            log.info("kernel read-ahead left at its default: %s", exc.strerror)
            return


def _device_of(mountpoint: str) -> str | None:
    """``major:minor`` of the tiercache mount on ``mountpoint`` (from the kernel's table)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    escaped = mountpoint.replace("\\", "\\134").replace(" ", "\\040")
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.startswith("fuse.tiercache ") and len(fields) > 4 and fields[4] == escaped:
            return fields[2]
    return None
