"""Mount read-ahead: opening a file queues the next files of its directory in the prefetcher.

Code that reads a directory of shards through the mount (``for f in sorted(os.listdir(d))``)
gets the next ``readahead`` files fetched while it reads the current one: the directory's
listing order is the read order handed to ``fs.read_ahead``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from tiercache.prefetch.readahead import ReadAhead

_DIRECTORIES_FOLLOWED = 8


class DirectoryReadAhead:
    """A ``ReadObserver``: one read-ahead order per directory, for the most recent few."""

    def __init__(self, fs: Any, root: str, k: int) -> None:
        self._fs = fs
        self._root = root
        self._k = k
        self._orders: OrderedDict[str, ReadAhead] = OrderedDict()
        self._listing: set[str] = set()  # directories whose order is being made
        self._lock = threading.Lock()

    def opened(self, path: str, size: int) -> None:
        full = f"{self._root}{path}"
        parent = full.rsplit("/", 1)[0]
        with self._lock:
            order = self._orders.get(parent)
            if order is not None:
                self._orders.move_to_end(parent)
            elif parent in self._listing:
                # Another reader lists the directory: readers that open its files together
                # (a DataLoader's workers, a thread pool) make one listing, not one each.
                return
            else:
                self._listing.add(parent)
        if order is None:
            try:
                order = self._follow(parent, full)
            finally:
                with self._lock:
                    self._listing.discard(parent)
            if order is None:
                return
        order.opened(full)

    def read(self, path: str, offset: int, size: int) -> None:
        pass  # the kernel's read-ahead covers reads within a file

    def close(self) -> None:
        with self._lock:
            orders = list(self._orders.values())
            self._orders.clear()
        for order in orders:
            order.close()

    def _follow(self, parent: str, first: str) -> ReadAhead | None:
        """Start an order over the files of ``parent`` from ``first`` on (listing order)."""
        try:
            rows = self._fs.ls(parent, detail=True)
        except OSError:
            return None  # the read itself reports what is wrong
        files = sorted(row["name"] for row in rows if row["type"] == "file")
        if first not in files:
            return None
        order: ReadAhead = self._fs.read_ahead(files[files.index(first) :], k=self._k)
        with self._lock:
            self._orders[parent] = order
            stale = []
            while len(self._orders) > _DIRECTORIES_FOLLOWED:
                stale.append(self._orders.popitem(last=False)[1])
        for old in stale:
            old.close()
        return order
