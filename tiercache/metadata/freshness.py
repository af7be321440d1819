"""``Freshness``: when a cached copy may be served without asking the store (one rule for all).

Every reader, the metadata cache and the mount follow it: in ``immutable`` mode a copy is
always fresh, in ``ttl`` mode for ``ttl`` seconds after the store last vouched for it, in
``always`` mode never. A time stamp ahead of this process's clock (written by a process or
host whose clock runs ahead) earns no freshness: it is not trusted for longer than the ttl it
would have had if stamped now.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Seconds a stamp may lie ahead of this clock and still count as "now" (hosts whose clocks
# agree to within NTP's usual error).
CLOCK_SLACK = 1.0


def wall_clock() -> float:
    """``time.time()``, looked up at each call: a clock moved by replacing ``time.time`` (as
    the tests do, rather than wait out a ttl) moves every default clock with it."""
    return time.time()


@dataclass(frozen=True)
class Freshness:
    """The consistency mode's rule for how long the store's word about an object holds."""

    consistency: str
    ttl: float
    clock: Callable[[], float] = field(default=wall_clock, compare=False)

    def holds(self, vouched_at: float) -> bool:
        """Whether a copy the store vouched for at ``vouched_at`` may be served unasked."""
        if self.consistency == "immutable":
            return True
        if self.consistency != "ttl":
            return False
        age = self.clock() - vouched_at
        return -CLOCK_SLACK <= age < self.ttl

    @property
    def by_listing(self) -> bool:
        """Whether stale copies are revalidated by listing their prefix (``ttl`` mode)."""
        return self.consistency == "ttl" and self.ttl > 0
