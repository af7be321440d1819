"""An in-memory sink for a ranged GET: the bytes and where each write went, for unit tests."""

from __future__ import annotations

import threading

from tiercache.read.ranges import HeldBytes
from tiercache.store.base import ObjectInfo


class MemorySink:
    """A ``RangeSink`` that keeps the bytes written and each write's (offset, length); a
    reader waits for the range ``waited`` (if any). Sized at once (``size``) or by ``begin``."""

    def __init__(self, size: int = 0, waited: tuple[int, int] | None = None) -> None:
        self.data = bytearray(size)
        self.writes: list[tuple[int, int]] = []
        self.waited = waited
        self._lock = threading.Lock()

    def begin(self, info: ObjectInfo) -> None:
        if len(self.data) != info.size:
            self.data = bytearray(info.size)

    def next_read(self, offset: int) -> int:
        return 0

    def awaited_end(self, start: int, end: int) -> int:
        if self.waited is not None and start < self.waited[1] <= end:
            return self.waited[1]
        return start

    def holding(self, held: HeldBytes, holds: bool) -> None:
        pass

    def write(self, offset: int, data: memoryview | bytes) -> None:
        with self._lock:
            self.data[offset : offset + len(data)] = data
            self.writes.append((offset, len(data)))
