"""Publishing this process's counters beside each tier it uses, off the hot path.

A daemon thread writes every ``PUBLISH_SECONDS`` (and once more at exit) the counters of the
caches this process runs, summed per local tier, to that tier's metrics directory
(``metrics/files.py``). Counting stays where it is (``Stats.add``); nothing here runs per
counter increment. A cache whose runtime is collected leaves its last counters to the process's
retired sum, so the published file never goes down; once a tier has no cache left, its last
counters are written and the process lets go of its liveness lock there, so the next fold moves
them into the tier's total. A forked child publishes under its own id.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tiercache import forksafe
from tiercache.metrics.files import (
    DIRNAME,
    fold_if_free,
    hold_alive,
    metrics_dir,
    new_process_id,
    write_process_counters,
)
from tiercache.stats import at_exit
from tiercache.tiers.local import make_tier_dir

if TYPE_CHECKING:
    from tiercache.stats import Stats
    from tiercache.store.base import ObjectStore

log = logging.getLogger("tiercache.metrics")

# A scrape sees a live process within two of these (the acceptance bound is 10 s).
PUBLISH_SECONDS = 2.0
# Prefixes of the flat counter names that carry an ``op`` label once exposed.
STORE_REQUESTS = "store_requests:"
STORE_ERRORS = "store_errors:"

CounterReader = Callable[[], Mapping[str, float]]


def cache_counters(stats: Stats, store: ObjectStore) -> CounterReader:
    """A reader of one cache's counters: its ``Stats`` and its store's requests and errors."""

    def read() -> dict[str, float]:
        out: dict[str, float] = dict(stats.snapshot())
        for op, count in store.request_counts().items():
            out[STORE_REQUESTS + op] = count
        for op, count in store.error_counts().items():
            out[STORE_ERRORS + op] = count
        return out

    return read


class _TierOutlet:
    """What this process publishes beside one tier."""

    def __init__(self, root: str, file_mode: int, dir_mode: int) -> None:
        self.root = root
        self.directory = metrics_dir(root)
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.readers: dict[int, CounterReader] = {}
        self.last: dict[int, Mapping[str, float]] = {}  # each reader's last good reading
        self.retired: Counter[str] = Counter()
        self.alive_fd: int | None = None
        self.warned = False
        # Names this process's files here; a new one after a fork, or when the tier is used
        # again after its last cache was collected (the old id may be folded already).
        self.process_id = new_process_id()


class Publisher:
    """The process's publisher (one per process: ``track`` and ``publish_now`` below)."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._outlets: dict[str, _TierOutlet] = {}
        self._tokens = itertools.count()
        # Filled by finalizers, which may run in any thread at any allocation: no lock there.
        self._collected: deque[tuple[str, int]] = deque()
        self.after_fork()
        forksafe.register(self)

    def after_fork(self) -> None:
        """A child publishes under its own id; its parent's sums and liveness lock stay there."""
        self._lock = threading.Lock()
        self._publishing = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for outlet in self._outlets.values():
            if outlet.alive_fd is not None:
                os.close(outlet.alive_fd)  # the parent's lock lives on in the parent
                outlet.alive_fd = None
            outlet.retired = Counter()
            outlet.last = {}
            outlet.process_id = new_process_id()
        if self._outlets:
            # The first publication waits a period: the other objects' fork hooks run first.
            self._start(first_delay=self._interval)

    def track(
        self,
        tier_root: str,
        owner: object,
        read: CounterReader,
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
    ) -> None:
        """Publish ``read()`` beside the tier at ``tier_root`` while ``owner`` lives."""
        token = next(self._tokens)
        with self._lock:
            outlet = self._outlets.get(tier_root)
            if outlet is None:
                outlet = self._outlets[tier_root] = _TierOutlet(tier_root, file_mode, dir_mode)
            outlet.readers[token] = read
            if self._thread is None:
                self._start(first_delay=0.0)
        weakref.finalize(owner, self._collected.append, (tier_root, token))

    def publish_now(self) -> None:
        """Write the counters of every tier this process uses (one publication at a time)."""
        with self._publishing:
            self._retire_collected()
            with self._lock:
                outlets = [(o, list(o.readers.items())) for o in self._outlets.values()]
            for outlet, readers in outlets:
                counters = Counter(outlet.retired)
                for token, read in readers:
                    counters.update(_reading(outlet, token, read))
                self._write(outlet, counters)
                if not readers:
                    self._drop_if_unused(outlet)

    def process_id(self, tier_root: str) -> str | None:
        """The id this process publishes under beside ``tier_root`` (None: it does not)."""
        with self._lock:
            outlet = self._outlets.get(tier_root)
            return None if outlet is None else outlet.process_id

    def stop(self) -> None:
        """Publish a last time and end the thread (at exit)."""
        self._stop.set()
        if self._outlets:
            self.publish_now()

    def _retire_collected(self) -> None:
        while self._collected:
            root, token = self._collected.popleft()
            with self._lock:
                outlet = self._outlets.get(root)
                read = None if outlet is None else outlet.readers.pop(token, None)
            if outlet is not None and read is not None:
                outlet.retired.update(_reading(outlet, token, read))
                outlet.last.pop(token, None)

    def _drop_if_unused(self, outlet: _TierOutlet) -> None:
        """The tier's last cache is gone and its counters are written: end this process's
        presence there (its lock released, the next fold moves them into the total)."""
        with self._lock:
            if outlet.readers or self._outlets.get(outlet.root) is not outlet:
                return
            del self._outlets[outlet.root]
        if outlet.alive_fd is not None:
            os.close(outlet.alive_fd)
            outlet.alive_fd = None

    def _write(self, outlet: _TierOutlet, counters: Mapping[str, float]) -> None:
        pid = outlet.process_id
        try:
            if outlet.alive_fd is None:
                # Never makes a removed tier again, nor writes through a planted link.
                make_tier_dir(outlet.root, DIRNAME, outlet.dir_mode)
                outlet.alive_fd = hold_alive(outlet.directory, pid, outlet.file_mode)
                fold_if_free(outlet.directory, outlet.file_mode)  # keeps the directory bounded
            write_process_counters(outlet.directory, pid, counters, outlet.file_mode)
        except OSError as exc:
            if not outlet.warned:
                outlet.warned = True
                # A tier removed while a cache of it lived (a benchmark's, a test's): nothing
                # to publish to, and nothing wrong to tell an operator.
                gone = isinstance(exc, FileNotFoundError)
                log.log(
                    logging.DEBUG if gone else logging.WARNING,
                    "cannot publish metrics in %s: %s",
                    outlet.directory,
                    exc,
                )

    def _start(self, first_delay: float) -> None:
        thread = threading.Thread(
            target=self._run, args=(first_delay,), name="tiercache-metrics", daemon=True
        )
        self._thread = thread
        thread.start()

    def _run(self, first_delay: float) -> None:
        delay = first_delay
        while not self._stop.wait(delay):
            delay = self._interval
            try:
                self.publish_now()
            except Exception:  # the thread must outlive one bad publication
                log.exception("publishing metrics")


def _reading(outlet: _TierOutlet, token: int, read: CounterReader) -> Mapping[str, float]:
    """``read()``, or the last good reading if it fails: a published sum must not go down."""
    try:
        outlet.last[token] = read()
    except Exception:
        log.debug("reading counters", exc_info=True)
    return outlet.last.get(token, {})


_publisher = Publisher(PUBLISH_SECONDS)
at_exit(_publisher.stop)
# A multiprocessing child (a DataLoader worker) ends with os._exit, where atexit handlers never
# run; it does run threading's shutdown hooks first, which it inherits from its parent.
_threading_exit_hook = getattr(threading, "_register_atexit", None)
if _threading_exit_hook is not None:
    _threading_exit_hook(_publisher.stop)


def track(
    tier_root: str,
    owner: object,
    read: CounterReader,
    file_mode: int = 0o600,
    dir_mode: int = 0o700,
) -> None:
    """Publish ``read()`` beside the tier at ``tier_root`` while ``owner`` lives."""
    _publisher.track(tier_root, owner, read, file_mode, dir_mode)


def publish_now() -> None:
    """Write this process's counters now (the thread does it every ``PUBLISH_SECONDS``)."""
    _publisher.publish_now()
