"""``ReadAhead``: a known read order; opening object i prefetches i+1..i+k, k growing on waits.

The depth grows each time the reader has to wait for an object: by one, and to at least the
objects the engine keeps in flight (which grow with it, sized by the link's latency). The
order, and the reader's position in it, also rank the tier's eviction by next use.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Sequence
from types import TracebackType

from tiercache.prefetch.engine import MAX_PREFETCH_WORKERS, Budget, PrefetchEngine, Target
from tiercache.prefetch.handle import PrefetchHandle
from tiercache.stats import Stats
from tiercache.tiers.next_use import Floor

MAX_DEPTH = 2 * MAX_PREFETCH_WORKERS


class ReadAhead:
    """Prefetch along an order as a reader moves through it.

    The first ``k`` objects are queued at once; each open of an object of the order queues
    the ``k`` after it. When the reader opens an object whose bytes are not in the tier yet
    (it waits), the engine may put more objects in flight and the order looks further ahead
    from then on (one more, and at least as many as are in flight, up to ``MAX_DEPTH``):
    depth and parallelism grow until the reader stops waiting, always within the window. An
    object may appear more than once (several epochs in one order): an open counts as its
    next occurrence after the reader's position. The engine's window (and ``window_bytes``,
    if given, for this order alone) bounds the bytes held ahead of the reader: past it the
    next object waits until the reader opens one. The order (and what ``expect_after``
    adds) tells eviction which entries are read soonest: those are kept, the ones read
    furthest ahead or never again go first. ``close()`` (or leaving the ``with`` block)
    releases what is left.
    """

    def __init__(
        self,
        engine: PrefetchEngine,
        order: Sequence[Target],
        k: int,
        window_bytes: int | None = None,
        priority: int = 0,
        stats: Stats | None = None,
    ) -> None:
        self._engine = engine
        self._stats = stats
        self._order = list(order)
        self._paths = [f"{b}/{key}" for b, key, _ in self._order]
        self._positions: dict[str, list[int]] = {}
        for i, path in enumerate(self._paths):
            self._positions.setdefault(path, []).append(i)
        self._cursor = -1  # the reader's position: the last object of the order it opened
        self.k = k
        self._priority = priority
        self._budgets = (Budget(window_bytes),) if window_bytes else ()
        self._lock = threading.Lock()
        self._scheduled = 0  # objects before this one are queued, done or passed by
        # Objects queued beyond ``k`` while whole batches are found in the tier (a warm
        # epoch): they take no worker and no room, and a submit per open or two cost a
        # third of a warm epoch. Back to 0 as soon as one object of a batch must be fetched.
        self._warm_ahead = 0
        self.handle = PrefetchHandle(engine.cancel, sealed=False)
        self._closed = False
        self._hint = engine.next_use.add([engine.entry_id(b, key) for b, key, _ in self._order])
        engine.listen(list(self._positions), self)
        self._schedule(0, min(k, len(self._order)))

    def __len__(self) -> int:
        return len(self._order)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def cursor(self) -> int:
        """The position of the last object of the order the reader opened (-1: none yet)."""
        with self._lock:
            return self._cursor

    @property
    def paths(self) -> list[str]:
        """The order, as ``bucket/key`` paths."""
        return list(self._paths)

    def opened(self, path: str, ready: bool | None = True) -> None:
        """A reader opened ``path``: queue the ``k`` objects after it (one more from now on
        if it had to wait for this one, unless it is the first the reader opens). ``ready``
        None: nothing was in flight for it, because it was done when queued (found in the
        tier) or because it was not queued yet: only the latter is a wait."""
        positions = self._positions.get(path)
        if not positions:
            return
        with self._lock:
            nth = bisect.bisect_right(positions, self._cursor)
            i = positions[min(nth, len(positions) - 1)]
            if ready is None:
                waited = i >= self._scheduled and self._cursor >= 0
            else:
                waited = not ready and self._cursor >= 0
            self._cursor = max(self._cursor, i)
            cursor = self._cursor
        self._hint.advance(cursor)
        if waited:
            self._engine.add_worker()
            with self._lock:
                deepen = 0 < self.k < MAX_DEPTH
                if deepen:  # at least as deep as the objects in flight: fewer would idle some
                    self.k = min(MAX_DEPTH, max(self.k + 1, self._engine.workers))
            if deepen and self._stats is not None:
                self._stats.add("readahead_deepened")
        with self._lock:
            k, scheduled = self.k, self._scheduled
            depth = k + self._warm_ahead
            end = i + 1 + depth
        if scheduled <= i + 1 or end - scheduled >= max(1, depth // 4):
            # Queued a quarter of the depth at a time (deeper than ``k`` only while what is
            # queued is found in the tier): each submit costs its lock, lookups and hand-over,
            # and a warm epoch spent a third of its time submitting one object per open.
            self._schedule(i + 1, min(end, len(self._order)), beyond=i + 1 + k)

    def eviction_floor(self, path: str) -> Floor | None:
        """What eviction may take to bring ``path`` for its next read (see ``OrderHint``)."""
        positions = self._positions.get(path)
        with self._lock:
            cursor = self._cursor
        nth = bisect.bisect_right(positions or [], cursor)
        if positions is None or nth == len(positions):
            return None
        return self._hint.floor(positions[nth])

    def expect_after(self, paths: Iterable[str]) -> None:
        """``bucket/key`` paths the reader reads after this order (its next epoch, say): they
        rank eviction as the order's continuation; nothing is prefetched for them."""
        self._hint.extend(self._engine.entry_id(*_split(path)) for path in paths)

    def close(self) -> None:
        """Stop prefetching for this order; what it holds unread becomes evictable."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._hint.close()
        self._engine.unlisten(list(self._positions), self)
        self.handle.cancel()

    def _schedule(self, start: int, end: int, beyond: int | None = None) -> None:
        """Queue objects [start, end) not queued yet (those behind the reader never are);
        from ``beyond`` on, only while they are found in the tier (see ``_warm_ahead``)."""
        with self._lock:
            start = max(start, self._scheduled)
            if self._closed or end <= start:
                return
            batch = self._order[start:end]
            self._scheduled = end
        ready, taken = self._engine.submit(
            batch,
            self.handle,
            priority=self._priority,
            pin=True,
            budgets=self._budgets,
            ready_done=True,  # a warm epoch: no worker for what its reader may open as it is
            ready_only_after=None if beyond is None else max(0, beyond - start),
        )
        with self._lock:
            if taken < len(batch) and self._scheduled == end:
                self._scheduled = end = start + taken  # the rest when the reader is nearer
            warm = ready == len(batch)
            self._warm_ahead = min(_WARM_AHEAD, max(8, 2 * self._warm_ahead)) if warm else 0
        if end == len(self._order):
            self.handle.seal()


_WARM_AHEAD = 256


def _split(path: str) -> tuple[str, str]:
    bucket, _, key = path.removeprefix("s3://").partition("/")
    return bucket, key
