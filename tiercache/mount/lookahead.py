"""``MetadataLookAhead``: the metadata of listed files read a few ahead of the stats asking for it.

A listing carries no user metadata, so the first ``ls -l`` (``find``, ``rsync``) of a directory
of a read-write mount takes a HEAD per file, and tools stat the names one at a time in the
order ``readdir`` gave them. Once two stats in a row need the metadata of files a listing
showed, next to each other in that listing, the next ``WINDOW`` files are read by a few
threads: the stats that follow find their metadata remembered (``stored``) or in flight.
A lone stat reads nothing ahead.
"""

from __future__ import annotations

import logging
import posixpath
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

log = logging.getLogger("tiercache.mount")

WINDOW = 64  # files read ahead of the latest stat
THREADS = 16  # HEADs in flight: a HEAD is a round trip, whatever its size
_DIRECTORIES_FOLLOWED = 8
_WAIT = 30.0  # how long a stat waits for the read already under way for its file


@dataclass
class _Order:
    """The files of one listing whose metadata was unknown, in listing order."""

    files: list[str]
    index: dict[str, int]
    last: int | None = None  # the position of the latest stat
    next: int = 0  # the first position not yet read ahead
    inflight: dict[str, Future[None]] = field(default_factory=dict)


class MetadataLookAhead:
    """Reads ahead (``read(path)``) along the most recent listings of a few directories."""

    def __init__(
        self, read: Callable[[str], None], window: int = WINDOW, threads: int = THREADS
    ) -> None:
        self._read = read
        self._window = window
        self._threads = threads
        self._lock = threading.Lock()
        self._orders: OrderedDict[str, _Order] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def listed(self, directory: str, files: list[str]) -> None:
        """A listing of ``directory`` showed ``files`` (in its order), metadata unknown."""
        order = _Order(files, {path: i for i, path in enumerate(files)})
        with self._lock:
            self._orders.pop(directory, None)
            if files:
                self._orders[directory] = order
                while len(self._orders) > _DIRECTORIES_FOLLOWED:
                    self._orders.popitem(last=False)

    def wanted(self, path: str) -> None:
        """A stat needs ``path``'s metadata: read ahead of it if stats follow the listing, and
        wait for a read of ``path`` already under way."""
        with self._lock:
            order = self._orders.get(posixpath.dirname(path))
            pos = None if order is None else order.index.get(path)
            if order is None or pos is None or self._closed:
                return
            following = order.next > pos or (order.last is not None and 0 < pos - order.last <= 2)
            order.last = pos
            if following:
                self._submit(order, pos)
            running = order.inflight.get(path)
        if running is not None:
            try:
                running.result(_WAIT)
            except Exception:
                pass  # the stat reads it itself

    def _submit(self, order: _Order, pos: int) -> None:
        """Read the files from ``pos + 1`` to ``pos + window`` not read yet (hold the lock)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="mount-lookahead")
        end = min(len(order.files), pos + 1 + self._window)
        for path in order.files[max(order.next, pos + 1) : end]:
            future = self._pool.submit(self._read_one, order, path)
            order.inflight[path] = future
        order.next = max(order.next, end)

    def _read_one(self, order: _Order, path: str) -> None:
        try:
            self._read(path)
        except Exception as exc:
            log.debug("reading the metadata of %s ahead: %s", path, exc)
        finally:
            with self._lock:
                order.inflight.pop(path, None)

    def close(self) -> None:
        """Stop reading ahead (at unmount); reads under way finish."""
        with self._lock:
            self._closed = True
            self._orders.clear()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
