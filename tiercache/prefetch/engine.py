"""``PrefetchEngine``: a bounded worker pool fetching objects ahead of readers, in priority order.

One engine per runtime (process and configuration). Requests are split into items, one per
object; an object asked for twice is one item. Items leave a priority queue strictly in
order (higher priority first, then first asked first), and only when their bytes fit the
window: a later object never takes the room an earlier one needs, so prefetch never evicts
what will be read sooner than what it brings. A prefetched object stays *pinned* until a
reader opens it: the engine holds a shared ``flock`` on its data file, exactly as an open
reader does, so eviction in any process on the node leaves it alone. Pins count against the
window (``prefetch_window_bytes``), which bounds what prefetch protects: one window for the
node's processes together, counted in the tier's ledger (``tiers/ledger.py``), as the tier's
budget is one. Fetching goes through ``ReadPath.warm``: a read of an object being prefetched
joins the same fetch.

Read-ahead orders rank the tier's eviction by next use (``next_use``): as items leave the
queue in order and are pinned as they go, what eviction takes for an object of an order is
read after it, or never; and an object waits rather than take what MIN would keep
(``_may_bring``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from tiercache import forksafe
from tiercache.config import TierCacheConfig
from tiercache.prefetch.governor import FlightGovernor
from tiercache.prefetch.handle import (
    CACHED,
    FAILED,
    FETCHED,
    READ_FIRST,
    SKIPPED,
    PrefetchHandle,
)
from tiercache.prefetch.items import Budget, Item, OrderListener, Target
from tiercache.read.fetch import BlockModeRequiredError, Fetch
from tiercache.read.path import ReadPath
from tiercache.stats import Stats
from tiercache.store.base import ObjectStore
from tiercache.tiers.entry import CachedEntry
from tiercache.tiers.local import LocalTier
from tiercache.tiers.next_use import NEVER, NextUse

__all__ = ["MAX_PREFETCH_WORKERS", "Budget", "PrefetchEngine", "Target"]

# A worker with nothing to do for this long exits (a new request starts it again), so an
# unused filesystem leaves no threads behind.
_IDLE_EXIT_SECONDS = 5.0
# A worker whose next object waits for window that other processes hold looks again this
# often: their readers free it, and nobody here is told.
_NODE_WINDOW_POLL_SECONDS = 0.05
# Prefetched objects released unread (cancel, close) are remembered, up to this many, to
# count the ones evicted before a reader came (``prefetch_wasted``).
_UNUSED_RECORDS = 4096
# Objects in flight grow (``add_worker``) up to this many, or ``prefetch_workers`` if more:
# enough for 128 KiB objects to fill a 100 MiB/s link 30 ms away (bandwidth x delay / size
# is 24) with room for the time each spends in this process.
MAX_PREFETCH_WORKERS = 64

_NO_ROOM = "no room: larger than the prefetch window or tier"


class PrefetchEngine:
    """Fetches objects into the local tier ahead of their readers."""

    def __init__(
        self,
        config: TierCacheConfig,
        read_path: ReadPath,
        tier: LocalTier,
        store: ObjectStore,
        stats: Stats,
        next_use: NextUse,
    ) -> None:
        """``next_use``: where the read orders go that rank ``tier``'s eviction."""
        self._workers = config.prefetch_workers
        self._governor = FlightGovernor(config.prefetch_workers, MAX_PREFETCH_WORKERS)
        self._read_path = read_path
        self._tier = tier
        self._stats = stats
        self.window = Budget(config.prefetch_window, node=tier.ledger)
        self.next_use = next_use
        self._reset()
        forksafe.register(self)

    def _reset(self) -> None:
        lock = threading.Lock()
        # Two conditions on one lock: idle workers wait for work, one woken per change that
        # may let an item go (a notify_all woke every idle worker for every object finished:
        # hundreds of futex calls and GIL hand-overs per small object); ``wait_settled``
        # waits for items to leave "running".
        self._cond = threading.Condition(lock)
        self._work_ready = threading.Condition(lock)
        # (-priority, arrival, push count, item): the push count keeps items uncompared.
        self._heap: list[tuple[int, int, int, Item]] = []
        self._seq = itertools.count()
        self._items: dict[str, Item] = {}
        self._listeners: dict[str, OrderListener] = {}  # path -> read-ahead order that contains it
        # Nothing leaves the queue until this order's reader is at this position (``_may_bring``).
        self._held: tuple[OrderListener, int] | None = None
        self._unused: OrderedDict[str, tuple[str, str, int]] = OrderedDict()
        self._running_threads = 0
        self._busy = 0  # workers fetching an item
        self._settling = 0  # threads in ``wait_settled``
        self._sizes_seen = 0
        self._typical_size = 0  # mean size of the objects whose size was learnt
        self._window_elsewhere = False  # the next item waits for other processes' window
        self.window.used = 0  # the ledger forgets the parent's too (``NodeLedger.after_fork``)

    def after_fork(self) -> None:
        """The child shares the parent's pin descriptors (and so their locks): drop them."""
        for item in list(self._items.values()):
            if item.pin_fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(item.pin_fd)
        self._reset()

    # -- requests ----------------------------------------------------------------------------

    def submit(
        self,
        targets: Sequence[Target],
        handle: PrefetchHandle,
        priority: int = 0,
        pin: bool = True,
        budgets: Sequence[Budget] = (),
        local: bool = True,
        ready_done: bool = False,
        ready_only_after: int | None = None,
    ) -> tuple[int, int]:
        """Queue objects for ``handle``; the window (and any ``budgets``) bound them. Returns
        how many were done at once (``ready_done``) and how many of ``targets`` were taken.

        ``local=False`` fills the shared tier only. ``ready_done``: objects a reader may open
        as they are in the local tier are done at once (see ``_ready_in_tier``), looked up in
        the caller's thread: for a read-ahead order, which asks for a few at a time. With
        ``ready_only_after`` n, the targets after the first n are taken only while they are
        done at once: the first that is not ends the batch (it is not queued)."""
        all_budgets = (self.window, *budgets)
        ready = self._ready_in_tier(targets) if ready_done and pin and local else {}
        taken = 0
        with self._cond:
            for bucket, key, size in targets:
                path = f"{bucket}/{key}"
                item = self._items.get(path)
                cached = ready.get(path)
                if item is None and cached is not None:
                    handle.add(1, cached)
                    handle.finish(path, CACHED, cached)
                    taken += 1
                    continue
                if ready_only_after is not None and taken >= ready_only_after:
                    break
                taken += 1
                handle.add(1, size or 0)
                if item is not None and item.state == "pinned":
                    handle.finish(path, CACHED, item.size or 0)
                    continue
                rank = (-priority, next(self._seq))
                if item is None:
                    item = Item(bucket, key, size, pin, all_budgets, rank, local=local)
                    self._items[path] = item
                elif rank < item.rank:
                    item.rank = rank
                item.handles.append(handle)
                if item.state == "queued":
                    # A duplicate heap entry is harmless: the first popped moves the item on.
                    heapq.heappush(self._heap, (*item.rank, next(self._seq), item))
            self._start_workers()
            self._wake_worker()
        return len(ready), taken

    def _ready_in_tier(self, targets: Sequence[Target]) -> dict[str, int]:
        """Objects of ``targets`` whose local entry a reader may open as it is (fresh, or
        vouched for by a listing), by path, with their sizes, while the tier has room for the
        whole window besides (so nothing evicts them for prefetch's sake before their reader
        comes): no worker needs to find and pin them. A warm epoch then costs its reader's
        opens alone, not a worker's lookup, pin and hand-over for every object as well."""
        tier = self._tier
        if tier.usage() + self.window.limit > tier.fill_limit():
            return {}
        ready = {}
        for bucket, key, _ in targets:
            entry = self._read_path.cached(bucket, key)
            if entry is not None and (
                entry.meta.state == "dirty" or self._read_path.vouched_for(entry, bucket, key)
            ):
                ready[f"{bucket}/{key}"] = entry.meta.size
        return ready

    def cancel(self, handle: PrefetchHandle) -> None:
        """Drop ``handle``'s queued objects and unpin the ones only it wanted."""
        to_close: list[Item] = []
        with self._cond:
            for item in list(self._items.values()):
                if handle not in item.handles:
                    continue
                # All of them: an order that repeats an object may hold it twice.
                item.handles = [h for h in item.handles if h is not handle]
                if item.handles:
                    continue
                if item.state == "queued":
                    self._drop(item)
                elif item.state == "pinned":
                    self._drop(item)
                    to_close.append(item)
                    if item.brought:
                        self._remember_unused(item)
                # A running item ends on its own; with no handle left it is not pinned.
            self._wake_worker()
        for item in to_close:
            _close(item)

    def listen(self, paths: Sequence[str], order: OrderListener) -> None:
        """Tell ``order`` (its ``opened(path)``) when a reader opens one of ``paths``."""
        with self._cond:
            for path in paths:
                self._listeners[path] = order

    def entry_id(self, bucket: str, key: str) -> str:
        """The tier entry that holds an object (what next-use hints name)."""
        return self._read_path.entry_id(bucket, key)

    def unlisten(self, paths: Sequence[str], order: OrderListener) -> None:
        with self._cond:
            for path in paths:
                if self._listeners.get(path) is order:
                    del self._listeners[path]
            if self._held is not None and self._held[0] is order:
                self._held = None
                self._wake_worker()

    # -- the reader's side -------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self, bucket: str, key: str) -> Iterator[None]:
        """Wrap a reader's open: count prefetch use, unpin after the reader holds its own lock,
        and let a read-ahead order schedule what comes next."""
        path = f"{bucket}/{key}"
        release: Item | None = None
        with self._cond:
            item = self._items.get(path)
            ready = item is not None and item.state == "pinned"
            # Not in flight: done when it was queued (a warm object, see ``_ready_in_tier``)
            # or never queued; the order tells which (``ReadAhead.opened``).
            known: bool | None = ready if item is not None else None
            if item is not None:
                if item.state == "queued":
                    self._drop(item, READ_FIRST)
                elif item.state == "running":
                    item.read = True
                elif item.state == "pinned":
                    release = item
                    self._drop(item)
                    if item.brought:
                        self._count_used(item.size or 0)
                    self._wake_worker()  # room in the window: the next object may go
            unused = self._unused.pop(path, None)
            order = self._listeners.get(path)
        if unused is not None:
            self._settle_unused(*unused)
        if not ready and self.next_use.has_spared():
            self.next_use.used(self.entry_id(bucket, key), lambda: self._is_cached(bucket, key))
        if order is not None and known is False:
            order.opened(path, False)  # the reader waits for this one: the next ones go now
        try:
            yield
        finally:
            if release is not None:
                _close(release)
        if order is not None and known is not False:
            # After the open: the work of queueing the next objects would otherwise take the
            # GIL from this open at each of its system calls (measured: 2-3x its time).
            order.opened(path, known)
        held = self._held
        if held is not None and held[0].cursor >= held[1]:  # the reader is past it: try again
            with self._cond:
                if self._held is held:
                    self._held = None
                    self._wake_worker()

    # -- metrics -----------------------------------------------------------------------------

    def sweep(self) -> None:
        """Count remembered prefetched-unread objects that were evicted (wasted)."""
        with self._cond:
            records = list(self._unused.items())
        for path, (bucket, key, size) in records:
            if not self._is_cached(bucket, key):
                with self._cond:
                    if self._unused.pop(path, None) is None:
                        continue
                self._stats.add("prefetch_wasted")
                self._stats.add("prefetch_wasted_bytes", size)

    def wait_settled(self, timeout: float = 60.0) -> None:
        """Wait until the objects in flight now are done with: pinned for their reader, or
        let go of (no lock of this engine left on them)."""
        with self._cond:
            running = [item for item in self._items.values() if item.state == "running"]
            self._settling += 1
            try:
                self._cond.wait_for(lambda: all(i.state != "running" for i in running), timeout)
            finally:
                self._settling -= 1

    def pinned_bytes(self) -> int:
        """Bytes the window holds now (pinned and in flight)."""
        with self._cond:
            return self.window.used

    # -- workers -----------------------------------------------------------------------------

    @property
    def workers(self) -> int:
        """Objects this engine may have in flight now."""
        return self._workers

    def add_worker(self) -> bool:
        """More objects in flight, when a reader waited while every worker was busy: half as
        many again while fetches do not queue (see ``FlightGovernor``), up to
        ``MAX_PREFETCH_WORKERS``; False when that would not help."""
        with self._cond:
            if self._busy < self._workers:
                return False
        more = self._governor.grow()
        if not more:
            return False
        with self._cond:
            self._workers = self._governor.width
            self._start_workers()
            self._wake_worker()
        self._stats.add("prefetch_workers_added", more)
        return True

    def _wake_worker(self) -> None:
        """Wake an idle worker if the queue holds anything it may take (hold the lock): on a
        busy core each wake-up with nothing to take cost two context switches."""
        if self._heap and self._held is None:
            self._work_ready.notify()

    def _start_workers(self) -> None:
        while self._running_threads < self._workers:
            self._running_threads += 1
            threading.Thread(target=self._work, name="tiercache-prefetch", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._cond:
                item = self._take()
                while item is None:
                    idle = (
                        _NODE_WINDOW_POLL_SECONDS if self._window_elsewhere else _IDLE_EXIT_SECONDS
                    )
                    woken = self._work_ready.wait(idle)
                    item = self._take()
                    if item is None and not woken and not self._heap:
                        self._running_threads -= 1
                        return
                self._busy += 1
                if self._heap and self._held is None:
                    self._work_ready.notify()  # more may go: the next idle worker looks
            try:
                self._fetch(item)
            finally:
                with self._cond:
                    self._busy -= 1

    def _take(self) -> Item | None:
        """The next item to work on, or None; strictly in queue order (hold the lock)."""
        while self._heap and self._held is None:
            item = self._heap[0][3]
            if item.state != "queued" or self._items.get(item.path) is not item:
                heapq.heappop(self._heap)
                continue
            if not item.handles:  # every request that wanted it was cancelled
                heapq.heappop(self._heap)
                self._drop(item)
                continue
            # An object of unknown size (a list names no sizes) is not asked about first: its
            # GET's reply says the size, and until then it holds the size typical so far.
            size = self._typical_size if item.size is None else item.size
            if any(size > b.limit - (b.used if b.sticky else 0) for b in item.budgets):
                heapq.heappop(self._heap)
                self._drop(item, SKIPPED, _NO_ROOM)
                continue
            if not all(b.fits(size) for b in item.budgets if not b.sticky):
                # Wait for readers to free room: never overtake this item. Another process's
                # reader frees its share without a word to this one: look again shortly.
                self._window_elsewhere = self.window.elsewhere() > 0
                return None
            self._window_elsewhere = False
            heapq.heappop(self._heap)
            for budget in item.budgets:
                budget.charge(size)
            item.charged = size
            item.state = "running"
            return item
        return None

    def _room_for(self, item: Item) -> int:
        """The largest object ``item`` may bring, as for an object of known size: a window's
        whole limit (a larger object could never fit), what a sticky budget has left."""
        with self._cond:
            return min(
                b.limit - b.used + item.charged if b.sticky else b.limit for b in item.budgets
            )

    def _learn_size(self, item: Item, size: int) -> None:
        """An object's size, learnt from its GET or its entry: charge that instead (hold the
        lock)."""
        if item.size is None:
            item.size = size
            for handle in item.handles:
                handle.learn_size(size)
            self._sizes_seen += 1
            self._typical_size += (size - self._typical_size) // self._sizes_seen
        if item.charged and item.charged != size:
            for budget in item.budgets:
                budget.charge(size - item.charged)
            item.charged = size

    def _fetch(self, item: Item) -> None:
        if not item.pin:
            self._fetch_item(item, None)
            return
        # From the lookup that finds it cached to the lock that pins it, the entry is open to
        # eviction: this process's, which would take it as it is read soonest, passes it over.
        # ``_fetch_item`` lets go of it once the entry is pinned, before the item settles: a
        # caller of ``wait_settled`` then finds no entry kept from its eviction.
        entry_id = self.entry_id(item.bucket, item.key)
        self.next_use.protect(entry_id)
        try:
            claim = self._may_bring(item)
        except BaseException:
            self.next_use.unprotect(entry_id)
            raise
        if claim is None:
            self.next_use.unprotect(entry_id)
            return
        self._fetch_item(item, entry_id, claim)

    def _may_bring(self, item: Item) -> int | None:
        """The tier's claim on room to bring an object of a read-ahead order now (0: none
        needed), evicting only what MIN would (``OrderHint.floor``). None if it cannot: the
        item goes back, and the queue holds, strictly in order, until the order's reader is
        where room may be had (it may come first and fetch the object itself)."""
        with self._cond:
            order = self._listeners.get(item.path)
            # Of a size not learnt yet: it needs some room, how much its GET will say.
            size = max(1, self._typical_size if item.size is None else item.size)
        if order is None:
            return 0
        floor = None
        if self._tier.usage() + size > self._tier.fill_limit():
            if self._is_cached(item.bucket, item.key):
                return 0  # nothing to fetch, no room needed
            floor = order.eviction_floor(item.path)
            if floor is None:
                return 0
        # With room to spare the floor is not worked out (it walks the order from its reader
        # to the item): should the room go meanwhile, only entries no order reads again go.
        claim = self._tier.make_room(size, NEVER if floor is None else floor.distance)
        if claim is not None:
            return claim
        floor = floor or order.eviction_floor(item.path)
        if floor is None:
            return 0
        with self._cond:
            if item.read or not item.handles or self._items.get(item.path) is not item:
                return 0  # a reader came meanwhile, or nobody wants it: the usual path
            self._uncharge(item)
            item.state = "queued"
            heapq.heappush(self._heap, (*item.rank, next(self._seq), item))
            self._held = (order, floor.unblock_at) if order is not None else None
        return None

    def _fetch_item(self, item: Item, entry_id: str | None, claim: int = 0) -> None:
        """Fetch or find ``item``'s object and pin it; ``claim``: room ``make_room`` reserved
        for it, dropped once its fetch has started (its ``reserve`` took it over); the
        protection of ``entry_id`` (``_fetch``) ends once it is pinned."""
        outcome, fd, size = CACHED, -1, item.size
        error: BaseException | str | None = None
        try:
            joined = self._read_path.in_flight(item.bucket, item.key) is not None
            limit = None if item.size is not None else self._room_for(item)
            warmed = self._read_path.warm(
                item.bucket, item.key, local=item.local, limit=limit, start=False
            )
            fetch = None
            if isinstance(warmed, Fetch) and not warmed.started:
                started = time.monotonic()
                warmed.pin = item.pin  # held from its part file on: eviction never takes it
                warmed.run()  # in this worker, which would only wait for another thread
                fd = warmed.pin_fd
                size = warmed.wait_finished().meta.size
                if warmed.info is not None:
                    outcome = FETCHED
                    self._governor.sample(time.monotonic() - started, size)
            elif isinstance(warmed, Fetch):
                fetch = warmed
            elif warmed is not None and not item.pin:
                size = warmed.meta.size
            else:
                fd, size = self._pin_cached(item, warmed)
                if fd >= 0 and warmed is not None and entry_id is not None:
                    self.next_use.used(entry_id, lambda: True)
                if fd < 0 and warmed is not None:  # evicted since: fetch it after all
                    again = self._read_path.warm(item.bucket, item.key, item.local, limit)
                    fetch = again if isinstance(again, Fetch) else None
            if fetch is not None:
                started = time.monotonic()
                if item.pin:  # before it is published: no moment where eviction may take it
                    fd = self._read_path.hold(fetch)
                if claim:
                    fetch.wait_started()
                    self._tier.drop_claim(claim)
                    claim = 0
                size = fetch.wait_finished().meta.size
                if not joined and fetch.info is not None:
                    outcome = FETCHED
                    self._governor.sample(time.monotonic() - started, size)
        except BlockModeRequiredError as big:  # its GET's reply: larger than the room left
            outcome, error, size = SKIPPED, _NO_ROOM, big.info.size
        except Exception as exc:
            outcome, error = FAILED, exc
            if fd >= 0:
                os.close(fd)
                fd = -1
        finally:
            if entry_id is not None:  # pinned, or let go of: before the item settles
                self.next_use.unprotect(entry_id)
        if claim:
            self._tier.drop_claim(claim)
        if not item.pin and fd >= 0:
            os.close(fd)
            fd = -1
        with self._cond:
            if size is not None:
                self._learn_size(item, size)
            size = item.size or 0
            item.brought = outcome == FETCHED
            if outcome == FETCHED:
                self._stats.add("prefetched")
                self._stats.add("prefetched_bytes", size)
            current = self._items.get(item.path) is item
            keep = current and fd >= 0 and not item.read and bool(item.handles)
            if item.read and item.brought:
                self._count_used(size)
            for handle in item.handles:
                handle.finish(item.path, outcome, size, error)
            if keep:
                item.state, item.pin_fd = "pinned", fd
            else:
                if fd >= 0:  # before the item is done: one who waited for it finds no lock
                    os.close(fd)
                self._forget(item)  # out of the table only if it is still this item's
                self._uncharge(item)
                if item.brought and not item.read:
                    self._remember_unused(item)
            self._wake_worker()
            if self._settling:
                self._cond.notify_all()

    def _pin_cached(self, item: Item, entry: CachedEntry | None) -> tuple[int, int | None]:
        """A shared lock on a cached entry's data, which keeps eviction off it, and its size;
        -1 if gone (or only in the shared tier)."""
        if entry is None:
            shared = None if item.local else self._read_path.cached_shared(item.bucket, item.key)
            return -1, None if shared is None else shared.meta.size
        try:
            return self._tier.open_data(entry), entry.meta.size
        except OSError:
            return -1, None

    # -- bookkeeping (hold the lock) ---------------------------------------------------------

    def _drop(self, item: Item, outcome: str | None = None, why: object = None) -> None:
        """Remove an item; tell its handles how it ended (if ``outcome``)."""
        if outcome is not None:
            error = why if isinstance(why, (BaseException, str)) else None
            for handle in item.handles:
                handle.finish(item.path, outcome, item.size or 0, error)
        if item.state == "pinned":
            self._uncharge(item)
        self._forget(item)

    def _forget(self, item: Item) -> None:
        if self._items.get(item.path) is item:
            del self._items[item.path]
        item.state = "gone"

    def _uncharge(self, item: Item) -> None:
        for budget in item.budgets:
            if not budget.sticky:
                budget.charge(-item.charged)
        item.charged = 0

    def _count_used(self, size: int) -> None:
        self._stats.add("prefetch_used")
        self._stats.add("prefetch_used_bytes", size)

    def _remember_unused(self, item: Item) -> None:
        self._unused[item.path] = (item.bucket, item.key, item.size or 0)
        while len(self._unused) > _UNUSED_RECORDS:
            self._unused.popitem(last=False)

    def _settle_unused(self, bucket: str, key: str, size: int) -> None:
        """A reader opened an object prefetched earlier and released unread."""
        used = self._is_cached(bucket, key)
        self._stats.add("prefetch_used" if used else "prefetch_wasted")
        self._stats.add("prefetch_used_bytes" if used else "prefetch_wasted_bytes", size)

    def _is_cached(self, bucket: str, key: str) -> bool:
        entry = self._read_path.cached(bucket, key)
        return entry is not None and self._tier.is_intact(entry)


def _close(item: Item) -> None:
    fd, item.pin_fd = item.pin_fd, -1
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
