"""``Reservation``: a tier's room held for an entry until its publication counts the bytes."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol

from tiercache.tiers.entry import CachedEntry, EntryMeta, EntryPaths


class ReservingTier(Protocol):
    """What a reservation asks of its tier (``LocalTier``)."""

    def reserve(self, nbytes: int) -> None: ...

    def release(self, nbytes: int) -> None: ...

    def publish(
        self,
        paths: EntryPaths,
        fd: int,
        meta: EntryMeta,
        src: str | None = None,
        durable: bool = False,
        keep_src: bool = False,
        prepared_meta: str | None = None,
        meta_absent: bool = False,
        reserved: int = 0,
    ) -> CachedEntry: ...


class Reservation:
    """Bytes ``LocalTier.reserve`` counted for an entry about to be published.

    ``publish`` hands them over to the published entry in the step that counts it, so the
    bytes count once all along; whatever was not handed over (a failure, an entry found
    cached already) is given back by ``release`` or on leaving the ``with`` block.
    """

    def __init__(self, tier: ReservingTier, nbytes: int) -> None:
        tier.reserve(nbytes)
        self._tier = tier
        self.held = nbytes

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def publish(self, paths: EntryPaths, fd: int, meta: EntryMeta, **options: Any) -> CachedEntry:
        """``LocalTier.publish`` with these bytes as its ``reserved``."""
        entry = self._tier.publish(paths, fd, meta, reserved=self.held, **options)
        self.held = 0
        return entry

    def release(self) -> None:
        """Give back what was not handed to a published entry (none after a publication)."""
        held, self.held = self.held, 0
        self._tier.release(held)
