"""Reads of files the kernel opens by itself: read handles found by path, kept in a bounded table.

A read-only mount of immutable objects answers its first open with ENOSYS, which the kernel
takes as "opens need no request" (FUSE's zero-message open): from then on no open, flush or
release of a file reaches the mount, and every file keeps its cached pages across opens.
Its reads then arrive with a path and no handle; ``PathReaders`` opens each path once
(``ReadOpener``, as an open would), keeps the handle for the next reads and closes the least
recently used one that no read is using when more than ``limit`` are open.
"""

from __future__ import annotations

import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tiercache.mount.handles import ColdReadHandle, ReadHandle

Opener = Callable[[str], ReadHandle | ColdReadHandle]

# Open handles kept: each holds at most one descriptor of a tier file, so at most a quarter
# of the process's descriptors (a soft limit of 1024 is common) and no more than 512.
MAX_LIMIT = 512


def default_limit() -> int:
    """Handles kept by default: ``MAX_LIMIT``, or a quarter of the descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_LIMIT
    return max(16, min(MAX_LIMIT, soft // 4))


class PathReaders:
    """The read handle of each path read lately; opened at its first read."""

    def __init__(self, opener: Opener, limit: int | None = None) -> None:
        limit = default_limit() if limit is None else limit
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._opener = opener
        self._limit = limit
        self._lock = threading.Lock()
        self._handles: OrderedDict[str, ReadHandle | ColdReadHandle] = OrderedDict()
        self._users: dict[str, int] = {}  # reads under way on each path's handle
        self._opening: dict[str, threading.Event] = {}  # one open per path at a time
        self._opened = 0

    @contextmanager
    def reading(self, path: str) -> Iterator[ReadHandle | ColdReadHandle]:
        """``path``'s handle, not closed until the block ends (opened here if need be)."""
        handle = self._acquire(path)
        try:
            yield handle
        finally:
            self._release(path)

    def _acquire(self, path: str) -> ReadHandle | ColdReadHandle:
        while True:
            with self._lock:
                handle = self._handles.get(path)
                if handle is not None:
                    self._handles.move_to_end(path)
                    self._users[path] = self._users.get(path, 0) + 1
                    return handle
                opening = self._opening.get(path)
                if opening is None:
                    opening = self._opening[path] = threading.Event()
                    break
            opening.wait()  # another read opens it: use that handle
        try:
            handle = self._opener(path)
        except BaseException:
            with self._lock:
                del self._opening[path]
            opening.set()
            raise
        with self._lock:
            del self._opening[path]
            self._opened += 1
            self._handles[path] = handle
            self._users[path] = self._users.get(path, 0) + 1
            surplus = self._evictable()
        opening.set()
        for old in surplus:
            old.close()
        return handle

    def _release(self, path: str) -> None:
        with self._lock:
            left = self._users[path] - 1
            if left:
                self._users[path] = left
            else:
                del self._users[path]
            surplus = self._evictable()
        for old in surplus:
            old.close()

    def _evictable(self) -> list[ReadHandle | ColdReadHandle]:
        """Remove the oldest unused handles beyond the limit (hold the lock); close them after."""
        surplus: list[ReadHandle | ColdReadHandle] = []
        over = len(self._handles) - self._limit
        if over <= 0:
            return surplus
        oldest_unused = []
        for path in self._handles:  # oldest first; stops at the first ``over`` unused
            if over <= 0:
                break
            if path not in self._users:
                oldest_unused.append(path)
                over -= 1
        for path in oldest_unused:
            surplus.append(self._handles.pop(path))
        return surplus

    def counters(self) -> dict[str, int]:
        """Files opened for reads the kernel sent without an open (each open counts once)."""
        with self._lock:
            return {"kernel_opened_files": self._opened}

    def close_all(self) -> None:
        """Close every handle (the mount is going away)."""
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            handle.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._handles)
