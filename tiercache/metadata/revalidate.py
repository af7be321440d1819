"""``ListingRevalidator``: one LIST of a prefix vouches for every cached object below it.

In ``ttl`` mode a copy older than the ttl is revalidated by the listing of its parent prefix
(delimiter ``/``) instead of a HEAD of its own: the listing's ETag and size judge every cached
object directly below the prefix for ``ttl`` seconds, so a warm epoch costs one LIST page per
1000 objects rather than a request per object. Listings are kept by the metadata cache, which
the processes of the host share; one it does not keep (too large, or writes pending below the
prefix) is kept by this process for its own revalidations.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiercache import forksafe
from tiercache.metadata.cache import MAX_LISTING_ROWS, KnownInfo, MetadataCache
from tiercache.metadata.freshness import Freshness
from tiercache.metadata.shared import Lister
from tiercache.stats import Stats

# Prefixes whose listing this process keeps itself (those the metadata cache does not keep).
_KEPT_PREFIXES = 16
# A reader's open asks about the object its read-ahead asked about a moment before: that answer
# serves again for this long (at most the ttl), unless a write on this host invalidated the
# prefix since; one stat instead of the object's record and its listing row.
_RECENT_SECONDS = 1.0
_RECENT_KEPT = 4096


@dataclass(frozen=True)
class Listed:
    """What a listing of an object's parent prefix says of it, and when the store was asked."""

    exists: bool
    etag: str | None
    size: int | None
    asked_at: float

    def vouches_for(self, etag: str, size: int) -> bool:
        return self.exists and (self.etag, self.size) == (etag, size)


class ListingRevalidator:
    """One LIST of a prefix per ``ttl`` vouches for every cached object directly below it."""

    def __init__(
        self,
        lister: Lister,
        metadata: MetadataCache,
        freshness: Freshness,
        stats: Stats,
        pending_under: Callable[[str, str], bool],
    ) -> None:
        self._lister = lister
        self._metadata = metadata
        self._freshness = freshness
        self._stats = stats
        self._pending_under = pending_under
        self._reset()
        forksafe.register(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._listing: dict[tuple[str, str], threading.Lock] = {}
        # (bucket, prefix) -> (asked_at, name -> (etag, size)): listings too large to keep.
        self._kept: OrderedDict[tuple[str, str], tuple[float, dict[str, tuple[Any, Any]]]] = (
            OrderedDict()
        )
        # (bucket, key) -> (when it was asked, the answer): see ``_RECENT_SECONDS``.
        self._recent: dict[tuple[str, str], tuple[float, Listed]] = {}

    def after_fork(self) -> None:
        """A child has none of the parent's listing threads: it starts afresh."""
        self._reset()

    def listed(self, bucket: str, key: str) -> Listed | None:
        """The object as a fresh listing of its parent prefix shows it, listing the prefix
        now if no fresh listing is known; None where listings do not revalidate."""
        if not self._freshness.by_listing or not key:
            return None
        prefix = key[: key.rfind("/") + 1]
        noted = self._metadata.now()
        with self._lock:
            recent = self._recent.get((bucket, key))
        if (
            recent is not None
            and 0 <= noted - recent[0] < min(_RECENT_SECONDS, self._freshness.ttl)
            and self._freshness.holds(recent[1].asked_at)
            and not self._metadata.invalidated_since(bucket, prefix, recent[0])
        ):
            return recent[1]
        found = self._known(bucket, key, prefix)
        if found is not None:
            self._note(bucket, key, noted, found)
            return found
        # One LIST per prefix at a time in this process: the others wait and read its answer.
        with self._lock:
            listing = self._listing.setdefault((bucket, prefix), threading.Lock())
        with listing:
            found = self._known(bucket, key, prefix)
            if found is None:
                self._list(bucket, prefix)
                found = self._known(bucket, key, prefix)
        if found is not None:
            self._note(bucket, key, noted, found)
        return found

    def _note(self, bucket: str, key: str, noted: float, found: Listed) -> None:
        with self._lock:
            if len(self._recent) >= _RECENT_KEPT:
                self._recent.clear()
            self._recent[(bucket, key)] = (noted, found)

    def _known(self, bucket: str, key: str, prefix: str) -> Listed | None:
        info = self._metadata.info(bucket, key)
        if info is not None:
            return _from_known(info)
        with self._lock:
            kept = self._kept.get((bucket, prefix))
        if (
            kept is None
            or not self._freshness.holds(kept[0])
            or self._metadata.invalidated_since(bucket, prefix, kept[0])
        ):
            return None
        row = kept[1].get(key)
        if row is None:
            return Listed(False, None, None, kept[0])
        return Listed(True, row[0], row[1], kept[0])

    def _list(self, bucket: str, prefix: str) -> None:
        pending = self._pending_under(bucket, prefix)  # before the LIST: see the filesystem's ls
        rows, asked_at = self._lister.rows(bucket, prefix, recursive=False)
        self._stats.add("revalidation_listings")
        if not pending and len(rows) <= MAX_LISTING_ROWS:
            self._metadata.remember_listing(bucket, prefix, False, rows, asked_at)
            return
        # Not kept for the host (too large, or writes pending below it that would change it):
        # kept for this process's revalidations only, which pending writes do not ask for.
        names = {
            str(row["name"]).split("/", 1)[1]: (row.get("ETag"), row.get("size"))
            for row in rows
            if row.get("type") == "file"
        }
        with self._lock:
            self._kept[(bucket, prefix)] = (asked_at, names)
            self._kept.move_to_end((bucket, prefix))
            while len(self._kept) > _KEPT_PREFIXES:
                self._kept.popitem(last=False)


def _from_known(info: KnownInfo) -> Listed:
    if info.state != "file" or info.row is None:
        return Listed(False, None, None, info.asked_at)
    return Listed(True, info.row.get("ETag"), info.row.get("size"), info.asked_at)
