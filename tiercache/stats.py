"""``Stats``: the counters behind ``fs.stats()`` (hits, misses, bytes, fetches, evictions…)."""

from __future__ import annotations

import atexit
import threading
from collections import Counter
from collections.abc import Callable

from tiercache import forksafe

COUNTERS = (
    "hits",
    "shared_hits",
    "promotions",
    "misses",
    "revalidations",
    "revalidation_listings",
    "invalidations",
    "corrupt_entries",
    "verify_checks",
    "verify_failures",
    "tier_full",
    "fetches",
    "fetches_joined",
    "fetches_joined_other_process",
    "fetch_errors",
    "bytes_fetched",
    "blocks_fetched",
    "block_errors",
    "block_entries_completed",
    "promotion_errors",
    "bytes_read",
    "bytes_written",
    "uploads",
    "upload_errors",
    "uploads_failed",
    "uploads_lost",
    "uploads_superseded",
    "uploads_delivered_elsewhere",
    "uploads_claim_lost",
    "uploads_cancelled",
    "multipart_aborted",
    "uploads_streamed",
    "streams_restarted",
    "evictions",
    "bytes_evicted",
    "evictions_by_next_use",
    "bytes_evicted_by_next_use",
    "kept_by_next_use",
    "bytes_kept_by_next_use",
    "prefetched",
    "prefetched_bytes",
    "prefetch_used",
    "prefetch_used_bytes",
    "prefetch_wasted",
    "prefetch_wasted_bytes",
    "readahead_deepened",
    "prefetch_workers_added",
)
# Accumulated seconds reported even when still zero.
TIMES = ("reader_wait_seconds", "verify_seconds")

_exit_callbacks: list[Callable[[], None]] = []


def at_exit(callback: Callable[[], None]) -> None:
    """Run ``callback`` at interpreter exit, after write-behind's exit drain.

    The write path imports this module before it registers its drain, and ``atexit`` runs
    handlers last-registered first, so counters read here include the uploads of the drain.
    """
    _exit_callbacks.append(callback)


@atexit.register
def _run_exit_callbacks() -> None:
    for callback in _exit_callbacks:
        callback()


class Stats:
    """Thread-safe counters of one process; a forked child starts from zero."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._times: dict[str, float] = {}
        forksafe.register(self)

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._counts = Counter()
        self._times = {}

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def add_time(self, name: str, seconds: float) -> None:
        with self._lock:
            self._times[name] = self._times.get(name, 0.0) + seconds

    def snapshot(self) -> dict[str, float]:
        """All counters (zeros included) and accumulated seconds, as a flat dict."""
        with self._lock:
            out: dict[str, float] = {name: self._counts.get(name, 0) for name in COUNTERS}
            out.update(dict.fromkeys(TIMES, 0.0))
            out.update(self._counts)
            out.update(self._times)
        return out
