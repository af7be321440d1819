"""The prefetch queue's items, the budgets they count against and the orders told of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tiercache.prefetch.handle import PrefetchHandle
from tiercache.tiers.next_use import Floor

Target = tuple[str, str, "int | None"]  # bucket, key, size if known


class OrderListener(Protocol):
    """A read-ahead order, told when a reader opens one of its objects (``ready``: its bytes
    were already in the tier, so the reader did not wait; None: nothing was in flight for it,
    see ``ReadAhead.opened``); it says what eviction may take to bring one of them
    (``eviction_floor``) and where its reader is (``cursor``)."""

    def opened(self, path: str, ready: bool | None) -> None: ...
    def eviction_floor(self, path: str) -> Floor | None: ...
    @property
    def cursor(self) -> int: ...


class WindowShare(Protocol):
    """Where the node's processes count the bytes their prefetch holds (``tiers/ledger.py``)."""

    def hold_window(self, nbytes: int) -> None: ...
    def window_elsewhere(self) -> int: ...


@dataclass
class Budget:
    """Bytes a set of items may hold at once. A sticky budget is never given back: items that
    do not fit are skipped instead of waiting (a request with no reader to free room). With
    ``node``, the limit is one for the node's processes together (the prefetch window)."""

    limit: int
    used: int = 0  # by this process
    sticky: bool = False
    node: WindowShare | None = None

    def fits(self, nbytes: int) -> bool:
        return self.used + self.elsewhere() + nbytes <= self.limit

    def elsewhere(self) -> int:
        """Bytes the node's other processes hold against the limit."""
        return 0 if self.node is None else self.node.window_elsewhere()

    def charge(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (fewer, if negative); the node is told (memory only)."""
        self.used += nbytes
        if self.node is not None:
            self.node.hold_window(self.used)


@dataclass(eq=False)
class Item:
    """One object in the queue, however many requests asked for it."""

    bucket: str
    key: str
    size: int | None
    pin: bool
    budgets: tuple[Budget, ...]
    rank: tuple[int, int]  # (-priority, arrival): the queue's order
    handles: list[PrefetchHandle] = field(default_factory=list)
    state: str = "queued"  # queued → running → pinned → gone
    read: bool = False  # a reader opened it while it was being fetched
    brought: bool = False  # its bytes came from the store through this item's fetch
    charged: int = 0
    pin_fd: int = -1
    local: bool = True  # False: fill the shared tier only (no copy into the local one)

    @property
    def path(self) -> str:
        return f"{self.bucket}/{self.key}"
