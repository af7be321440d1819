"""``Extents``: which byte ranges of a file being filled have arrived."""

from __future__ import annotations

import bisect


class Extents:
    """A set of disjoint, merged ``[start, end)`` ranges. Not thread-safe: callers lock."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        i = bisect.bisect_left(self._ends, start)  # first range that ends at/after start
        j = bisect.bisect_right(self._starts, end)  # ranges beyond j start after end
        if i < j:
            start = min(start, self._starts[i])
            end = max(end, self._ends[j - 1])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def covers(self, start: int, end: int) -> bool:
        if end <= start:
            return True
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def prefix_end(self) -> int:
        """End of the range that starts at byte 0 (0 when byte 0 has not arrived)."""
        return self._ends[0] if self._starts and self._starts[0] == 0 else 0

    def total(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))
