"""``FlightGovernor``: how many objects prefetch keeps in flight, sized by the link's latency.

A store far away answers each request after tens of milliseconds, so small objects fetched one
after the other leave the link idle: it takes bandwidth x delay / object size of them in
flight to fill it. Neither term is known in advance, so the governor learns from the fetches
themselves, as a TCP sender learns its window from round-trip times: while a fetch takes
about as long as the quickest fetch seen (the link's latency, not a queue, sets its time),
one more object in flight is one more object per round trip, and the count grows by half
each time a reader has to wait. Once fetches take markedly longer than that, something is
full (the link, the store or the CPU) and more in flight would only queue: the count holds.
"""

from __future__ import annotations

import threading
from collections import deque

# A fetch slower than the quickest by this factor means requests queue somewhere.
QUEUEING = 1.6
# Recent fetch times compared with the quickest (a few, so one slow fetch does not stop it).
_RECENT = 8
# The quickest time is forgotten slowly: a link that got slower for good is learnt again.
_MIN_DECAY = 1.02
# Only objects this small are timed: a larger one's time is its bytes, not the round trip
# (and the stream governor spreads those over connections).
SMALL = 4 * 1024 * 1024


class FlightGovernor:
    """Objects in flight for one process's prefetch: grows while fetches do not queue."""

    def __init__(self, start: int, maximum: int) -> None:
        self.maximum = max(start, maximum)
        self.width = start
        self._lock = threading.Lock()
        self._quickest: float | None = None  # seconds of the quickest small fetch
        self._recent: deque[float] = deque(maxlen=_RECENT)

    def sample(self, seconds: float, nbytes: int) -> None:
        """A fetch of ``nbytes`` took ``seconds`` from its start to its publication."""
        if seconds <= 0 or nbytes > SMALL:
            return
        with self._lock:
            if self._quickest is None or seconds < self._quickest:
                self._quickest = seconds
            else:
                self._quickest *= _MIN_DECAY ** (1 / _RECENT)
            self._recent.append(seconds)

    def queueing(self) -> bool:
        """Whether recent fetches take markedly longer than the quickest: more in flight
        would wait in a queue rather than use an idle link."""
        with self._lock:
            if self._quickest is None or len(self._recent) < min(_RECENT, self.width):
                return False
            typical = sorted(self._recent)[len(self._recent) // 2]
            return typical > QUEUEING * self._quickest

    def grow(self) -> int:
        """A reader waited while every object in flight was busy: how many more to fly
        (0 when at the maximum, or when fetches queue already)."""
        if self.queueing():
            return 0
        with self._lock:
            more = min(max(1, self.width // 2), self.maximum - self.width)
            self.width += more
            return more
