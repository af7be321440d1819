"""``StoredMetadata``: the mtime and mode objects hold as metadata, remembered per object version.

A listing carries no user metadata: only a HEAD reads the ``mtime`` and ``mode`` a read-write
mount keeps in an object's metadata (``kept``). What a HEAD read is remembered (a bounded
number of paths) for the version it saw, and served while the consistency mode allows:

- ``immutable``: whenever the object shows the same ETag;
- ``ttl``: for ``ttl`` seconds after the HEAD, then while a store answer that is itself no older
  than the ttl shows the same ETag, size and LastModified;
- ``always``: only while a store answer of the moment (a HEAD, or the LIST of a ``readdir``
  within the attribute timeout) shows the same ETag, size and LastModified.

New metadata rewrites the object (a CopyObject onto itself, which keeps a single-part object's
ETag but not its LastModified), so an unchanged LastModified vouches for unchanged metadata,
if that LastModified lay ``SETTLED`` seconds before the HEAD: the store gives whole seconds,
and a second change within the same second would keep it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tiercache.metadata.freshness import CLOCK_SLACK, Freshness
from tiercache.store.base import ObjectInfo


@dataclass(frozen=True)
class SetAttrs:
    """An mtime (ns) and permission bits set through the mount; None: not set. ``symlink``:
    the object is a symbolic link (only ever read from, or written with, its object)."""

    mtime_ns: int | None = None
    mode: int | None = None
    symlink: bool = False

    def merged(self, newer: SetAttrs) -> SetAttrs:
        return SetAttrs(
            newer.mtime_ns if newer.mtime_ns is not None else self.mtime_ns,
            newer.mode if newer.mode is not None else self.mode,
            self.symlink or newer.symlink,
        )

    def empty(self) -> bool:
        return self.mtime_ns is None and self.mode is None


# Seconds between an object's LastModified and a HEAD after which a later change must show a
# later LastModified (one whole second, plus the clock difference tolerated between hosts).
SETTLED = 1.0 + CLOCK_SLACK
# Paths whose metadata is remembered (a few hundred bytes each).
REMEMBERED_PATHS = 100_000


@dataclass(frozen=True)
class Version:
    """One version of an object, as a listing or a HEAD shows it."""

    etag: str
    size: int
    modified: int | None  # LastModified in whole seconds (a HEAD says no more); None: unknown

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> Version | None:
        """The version an ``info``/``ls`` row shows; None for a directory or a pending write."""
        etag = row.get("ETag")
        if row.get("type") != "file" or not etag or row.get("pending"):
            return None
        return cls(str(etag), int(row.get("size") or 0), _seconds(row.get("mtime")))

    @classmethod
    def of_info(cls, info: ObjectInfo) -> Version:
        return cls(info.etag, info.size, _seconds(info.last_modified))


def _seconds(stamp: Any) -> int | None:
    return int(stamp) if isinstance(stamp, (int, float)) and stamp > 0 else None


@dataclass(frozen=True)
class _Read:
    version: Version | None  # None: forgotten at ``read_at`` (changed here)
    attrs: SetAttrs | None
    read_at: float
    settled: bool  # a LastModified shown later vouches for ``attrs``


class StoredMetadata:
    """The metadata of the object version each path last showed, served per ``Freshness``."""

    def __init__(self, freshness: Freshness, limit: int = REMEMBERED_PATHS) -> None:
        self._freshness = freshness
        self._limit = limit
        self._lock = threading.Lock()
        self._reads: OrderedDict[str, _Read] = OrderedDict()

    def known(self, path: str, version: Version, vouched: bool) -> SetAttrs | None:
        """The metadata of ``version`` of ``path`` if it may be served without a HEAD.

        ``vouched``: ``version`` comes from a store answer as fresh as the mode requires (its
        LastModified is the store's, not that of an older copy kept in a tier).
        """
        with self._lock:
            read = self._reads.get(path)
            if read is not None:
                self._reads.move_to_end(path)
        if read is None or read.version is None or read.version.etag != version.etag:
            return None
        if self._freshness.holds(read.read_at):
            return read.attrs
        if vouched and read.settled and version.modified is not None and read.version == version:
            return read.attrs
        return None

    def remember(self, path: str, version: Version, attrs: SetAttrs, read_at: float) -> None:
        """What a HEAD begun at ``read_at`` (or a publication then) found; a read begun before
        a newer one, or before the path was forgotten, is dropped."""
        settled = version.modified is not None and read_at - version.modified >= SETTLED
        self._put(path, _Read(version, attrs, read_at, settled))

    def forget(self, *paths: str) -> None:
        """The objects at ``paths`` were replaced, moved or deleted here."""
        now = time.time()
        for path in paths:
            self._put(path, _Read(None, None, now, False))

    def _put(self, path: str, read: _Read) -> None:
        with self._lock:
            old = self._reads.get(path)
            if old is not None and old.read_at > read.read_at:
                return
            self._reads[path] = read
            self._reads.move_to_end(path)
            while len(self._reads) > self._limit:
                self._reads.popitem(last=False)
