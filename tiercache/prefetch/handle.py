"""``PrefetchHandle``: the progress, errors and cancellation of one prefetch request."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# How an object of a request ended.
FETCHED = "fetched"  # brought from the store by this prefetch
CACHED = "cached"  # already in the tier (or brought by a read in flight that it joined)
FAILED = "failed"
SKIPPED = "skipped"  # no room (larger than the window, or the tier's budget is spent)
READ_FIRST = "read_first"  # a reader opened it before the prefetch got to it
CANCELLED = "cancelled"


@dataclass(frozen=True)
class PrefetchProgress:
    """A snapshot of a request: objects and bytes, and how the finished objects ended."""

    objects_total: int
    objects_done: int
    bytes_total: int
    bytes_done: int
    fetched: int
    cached: int
    failed: int
    skipped: int
    cancelled: bool
    done: bool


class PrefetchHandle:
    """What ``fs.prefetch`` returns: wait for it, watch it, cancel it.

    ``bytes_total`` counts the objects whose size is known (listed, or learnt when a worker
    reaches them); ``bytes_done`` the bytes of objects finished, fetched or found cached.
    An open handle (a read-ahead order) keeps growing until it is closed.
    """

    def __init__(self, cancel: Callable[[PrefetchHandle], None], sealed: bool = True) -> None:
        self._cancel_hook = cancel
        self._cond = threading.Condition()
        self._sealed = sealed
        self._cancelled = False
        self._total = 0
        self._bytes_total = 0
        self._done = 0
        self._bytes_done = 0
        self._outcomes: dict[str, int] = {}
        self.errors: dict[str, BaseException] = {}
        self.skipped: dict[str, str] = {}

    def __repr__(self) -> str:
        p = self.progress()
        return f"<PrefetchHandle {p.objects_done}/{p.objects_total} objects done={p.done}>"

    # -- the caller's side -------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def done(self) -> bool:
        """True once every object ended (or the request was cancelled)."""
        with self._cond:
            return self._is_done()

    def progress(self) -> PrefetchProgress:
        with self._cond:
            return PrefetchProgress(
                objects_total=self._total,
                objects_done=self._done,
                bytes_total=self._bytes_total,
                bytes_done=self._bytes_done,
                fetched=self._outcomes.get(FETCHED, 0),
                cached=self._outcomes.get(CACHED, 0),
                failed=self._outcomes.get(FAILED, 0),
                skipped=self._outcomes.get(SKIPPED, 0),
                cancelled=self._cancelled,
                done=self._is_done(),
            )

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the request is done; False if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._is_done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def cancel(self) -> None:
        """Stop: objects not started are dropped, what this request holds becomes evictable.

        Fetches already streaming finish in the background (a reader may be joined to them).
        """
        with self._cond:
            if self._cancelled:
                return
            self._cancelled = True
            self._cond.notify_all()
        self._cancel_hook(self)

    # -- the engine's side -------------------------------------------------------------------

    def _is_done(self) -> bool:
        return self._cancelled or (self._sealed and self._done >= self._total)

    def add(self, objects: int, nbytes: int) -> None:
        with self._cond:
            self._total += objects
            self._bytes_total += nbytes

    def learn_size(self, nbytes: int) -> None:
        with self._cond:
            self._bytes_total += nbytes

    def seal(self) -> None:
        """No more objects will be added."""
        with self._cond:
            self._sealed = True
            self._cond.notify_all()

    def finish(
        self, path: str, outcome: str, nbytes: int, error: BaseException | str | None = None
    ) -> None:
        with self._cond:
            self._done += 1
            self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1
            if outcome in (FETCHED, CACHED):
                self._bytes_done += nbytes
            if isinstance(error, BaseException):
                self.errors[path] = error
            elif error is not None:
                self.skipped[path] = error
            self._cond.notify_all()
