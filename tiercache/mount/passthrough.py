"""FUSE passthrough: the kernel reads a warm file opened read-only from its tier copy itself.

A warm read through FUSE is served from the FUSE inode's page cache, a cache of small pages
that copies out at about 0.7x a local ext4 file (cached in large folios). With passthrough
(Linux >= 6.9, libfuse >= 3.16, root: the kernel refuses backing files to other users), the
open names the tier file as its backing file and the kernel reads it as a local file: no
request reaches the mount and the tier file's own page cache serves it.

The kernel keeps one io mode per inode: while one open of a file uses passthrough, every
other open of it must use the same backing file, and an open served by the mount (a writer,
a reader of bytes still being fetched) is refused; the other way round too. So:

- a read-only open of a cached, checked object uses passthrough unless the file is open
  through the mount already;
- a later read-only open of a file held by passthrough joins it (same version: the one
  opened first, until the last descriptor closes);
- an open for writing of a file held by passthrough is refused with ETXTBSY, as Linux
  refuses writes to a running program; it succeeds once the readers have closed.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import struct
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tiercache.mount")

FUSE_CAP_PASSTHROUGH = 1 << 29
_BACKING_OPEN = 0x4010E501  # _IOW(229, 1, struct fuse_backing_map {i32 fd; u32 flags; u64})
_BACKING_CLOSE = 0x4004E502  # _IOW(229, 2, uint32_t)
_BACKING_ID_OFFSET = 36  # int32_t backing_id in libfuse >= 3.16's struct fuse_file_info


@dataclass
class _Open:
    """One open descriptor as the kernel's io mode sees it."""

    path: str | None  # None once the name was unlinked or replaced (a new file may take it)
    backing_id: int  # 0: served by the mount


class Passthrough:
    """Which opens use passthrough, and the backing files they share (see the module)."""

    def __init__(self, wanted: bool) -> None:
        self._wanted = wanted
        self.active = False
        self._device: int | None = None
        self._opens: dict[int, _Open] = {}
        self._refs: dict[int, int] = {}  # backing id -> opens using it
        self._passed = 0  # opens that used passthrough
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {"passthrough_opens": self._passed}

    def negotiate(self, conn: Any, libfuse_version: tuple[int, int]) -> None:
        """At INIT: ask the kernel for passthrough where libfuse, the kernel and we may."""
        if not self._wanted or conn is None:
            return
        if libfuse_version < (3, 16):
            log.info("passthrough off: libfuse %d.%d cannot ask for it", *libfuse_version)
            return
        if not conn.capable & FUSE_CAP_PASSTHROUGH:
            log.info("passthrough off: the kernel does not offer it")
            return
        conn.want |= FUSE_CAP_PASSTHROUGH
        conn.want_ext |= FUSE_CAP_PASSTHROUGH
        conn.max_backing_stack_depth = 0  # tier files on a plain filesystem
        self.active = True

    def held(self, path: str, wait: float = 0.0) -> bool:
        """Whether an open of ``path`` uses passthrough, after waiting up to ``wait`` seconds
        for its releases: the kernel sends them after ``close(2)`` returns, so a writer that
        follows a reader's last close may arrive first."""
        with self._lock:
            return not self._released.wait_for(lambda: not self._holds(path), wait)

    def _holds(self, path: str) -> bool:
        return any(o.path == path and o.backing_id for o in self._opens.values())

    def opened(self, number: int, path: str, fi: Any, backing_fd: int | None) -> bool:
        """Record open ``number`` of ``path``; with passthrough (True) if the file is held by
        passthrough already, or ``backing_fd`` is given and no open of it is served by the
        mount. Sets the open's backing id in ``fi``."""
        with self._lock:
            same = [o for o in self._opens.values() if o.path == path]
            backing_id = next((o.backing_id for o in same if o.backing_id), 0)
            if not backing_id and self.active and backing_fd is not None and not same:
                backing_id = self._backing_open(backing_fd)
            if backing_id:
                self._passed += 1
                self._refs[backing_id] = self._refs.get(backing_id, 0) + 1
                ctypes.c_int32.from_address(
                    ctypes.addressof(fi) + _BACKING_ID_OFFSET
                ).value = backing_id
                fi.keep_cache = 0  # the kernel fails a passthrough open that asks it (EIO)
            self._opens[number] = _Open(path, backing_id)
            return bool(backing_id)

    def released(self, number: int) -> None:
        """Open ``number`` closed; its backing file is let go with its last open."""
        with self._lock:
            found = self._opens.pop(number, None)
            if found is None or not found.backing_id:
                return
            self._released.notify_all()
            left = self._refs[found.backing_id] - 1
            if left:
                self._refs[found.backing_id] = left
                return
            del self._refs[found.backing_id]
            self._backing_close(found.backing_id)

    def moved(self, old: str, new: str) -> None:
        """A rename: open files under ``old`` are now under ``new``; what ``new`` named is
        gone."""
        with self._lock:
            for o in self._opens.values():
                if o.path is not None and _under(o.path, new):
                    o.path = None
            for o in self._opens.values():
                if o.path is not None and _under(o.path, old):
                    o.path = new + o.path[len(old) :]
            self._released.notify_all()

    def gone(self, path: str) -> None:
        """``path`` was unlinked: its open files keep their io mode, the name does not."""
        with self._lock:
            for o in self._opens.values():
                if o.path == path:
                    o.path = None
            self._released.notify_all()

    def _backing_open(self, fd: int) -> int:
        """A backing id for ``fd`` (0 if the kernel refuses: passthrough is then turned off)."""
        try:
            if self._device is None:
                self._device = _session_device()
            arg = bytearray(struct.pack("iIQ", fd, 0, 0))
            return int(fcntl.ioctl(self._device, _BACKING_OPEN, arg, True))
        except (OSError, AttributeError) as exc:  # AttributeError: a binding without the calls
            self.active = False
            refused = isinstance(exc, OSError) and exc.errno == errno.EPERM
            reason = "not root" if refused else str(exc)
            log.warning("passthrough off: the kernel refused a backing file (%s)", reason)
            return 0

    def _backing_close(self, backing_id: int) -> None:
        """Let the kernel drop a backing id no open uses (the files opened with it keep it)."""
        if self._device is None:
            return
        try:
            fcntl.ioctl(self._device, _BACKING_CLOSE, struct.pack("I", backing_id))
        except OSError as exc:
            log.warning("passthrough: closing a backing file: %s", exc.strerror)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def _session_device() -> int:
    """The ``/dev/fuse`` descriptor of the session serving the current request."""
    import mfusepy  # noqa: PLC0415  (loaded by the mount already)

    lib = mfusepy._libfuse
    lib.fuse_get_session.restype = ctypes.c_void_p
    lib.fuse_get_session.argtypes = [ctypes.c_void_p]
    lib.fuse_session_fd.restype = ctypes.c_int
    lib.fuse_session_fd.argtypes = [ctypes.c_void_p]
    context = lib.fuse_get_context()
    device = int(lib.fuse_session_fd(lib.fuse_get_session(context.contents.fuse)))
    if device < 0:
        raise OSError(errno.EBADF, "no FUSE session descriptor")
    return device
