"""``MetadataCache``: object info, listings and known misses kept beside the local tier.

What ``info``/``ls``/``find`` learnt from the store is kept in small files next to the tier,
so that every process of the host (both faces of the filesystem, DataLoader workers, the
mount) answers from them instead of asking again. Layout (names are SHA-256s of store
namespace, bucket and key or prefix, as the tier's entries are)::

    ROOT/metadata/ab/<64 hex>.info   what one key is: a file (its row), a directory, nothing
    ROOT/metadata/ab/<64 hex>.ls     the store's rows directly under one prefix (``ls``)
    ROOT/metadata/ab/<64 hex>.find   the store's rows anywhere under one prefix (``find``)
    ROOT/metadata/ab/stamp           its mtime: when the shard last saw an invalidation

A record is served for ``ttl`` seconds after the store was asked (``ttl`` mode), until it is
invalidated (``immutable``), never (``always``: nothing is read or written). This host's
writes invalidate the key, its parent directories and the listings of every prefix above
it. A record is written only under its shard's stamp lock, and only if no invalidation of
the shard happened since the store was asked: an answer that may predate a write on this
host is never kept (records are read without a lock: each is replaced by a rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from tiercache import forksafe
from tiercache.metadata.freshness import Freshness, wall_clock
from tiercache.tiers.entry import install, prepare_file, shard_dir
from tiercache.tiers.local import LocalTier, make_tier_dir, remove_file
from tiercache.tiers.locks import lock, unlock

Known = Literal["file", "directory", "absent", "no-object"]
Kind = Literal["info", "ls", "find"]

RECORD_VERSION = 1
MAX_LISTING_ROWS = 100_000  # a larger listing is not kept (its record would be tens of MB)
_KNOWN = ("file", "directory", "absent", "no-object")
_STAMP = "stamp"
_TMP_AGE = 3600.0  # a temp file this old was left by a killed writer
_PARSED_LISTINGS = 8


@dataclass(frozen=True)
class KnownInfo:
    """What the store said of one key, and when it was asked.

    ``file`` (``row`` is its ``info`` row), ``directory`` (no object, but keys below it),
    ``absent`` (neither) or ``no-object`` (no object; whether keys lie below it is unknown).
    """

    state: Known
    row: dict[str, Any] | None
    asked_at: float


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass
class _Record:
    """One parsed record file, and the identity (device, inode, mtime, size) it was read at."""

    identity: tuple[int, int, int, int]
    names_of: tuple[Any, Any, Any]  # namespace, bucket, key it claims to be for
    asked_at: float
    body: dict[str, Any]
    _names: dict[str, dict[str, dict[str, Any]]] | None = None
    _rows_checked: tuple[bool, list[dict[str, Any]] | None] | None = None

    @classmethod
    def parse(cls, raw: bytes, identity: tuple[int, int, int, int]) -> _Record | None:
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("v") != RECORD_VERSION:
            return None
        at = body.get("at")
        if not isinstance(at, (int, float)):
            return None
        names = (body.get("ns"), body.get("bucket"), body.get("key"))
        return cls(identity, names, float(at), body)

    def rows(self) -> list[dict[str, Any]] | None:
        """A listing's rows; None if this is no (valid) listing (checked once per parse: a
        record is read for each key it lists, and checking every row each time was
        quadratic in the listing's size)."""
        if self._rows_checked is None:
            rows = self.body.get("rows")
            if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
                self._rows_checked = (True, rows)
            else:
                self._rows_checked = (False, None)
        return self._rows_checked[1]

    def names(self) -> dict[str, dict[str, dict[str, Any]]]:
        """A listing's rows by name, then by type (a key can be a file and a directory)."""
        if self._names is None:
            index: dict[str, dict[str, dict[str, Any]]] = {}
            for row in self.rows() or []:
                index.setdefault(str(row.get("name")), {})[str(row.get("type"))] = row
            self._names = index
        return self._names


def listing_kinds(namespace: str, bucket: str, keys: Iterable[str]) -> set[tuple[str, Kind]]:
    """The listing records a change of ``keys`` makes stale: ``ls`` and ``find`` of every
    prefix above each key, by entry id."""
    records: set[tuple[str, Kind]] = set()
    for key in keys:
        parts = key.split("/")
        for depth in range(len(parts)):
            prefix = "/".join(parts[:depth]) + "/" if depth else ""
            entry_id = LocalTier.entry_id(namespace, bucket, prefix)
            records.update(((entry_id, "ls"), (entry_id, "find")))
    return records


class MetadataCache:
    """Store answers about keys and prefixes of one store, shared by the processes of a host."""

    def __init__(
        self,
        root: str,
        namespace: str,
        consistency: str,
        ttl: float,
        *,
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
        lock_timeout: float = 60.0,
        clock: Callable[[], float] = wall_clock,
        freshness: Freshness | None = None,
        also_invalidate: Callable[[str, list[str]], None] | None = None,
    ) -> None:
        """``freshness``: how long an answer holds (default: ``consistency`` and ``ttl`` on
        ``clock``). ``also_invalidate``: told what ``invalidate`` forgets, with ``shared``
        (the shared tier's listings, ``SharedListings``)."""
        self.dir = os.path.join(root, "metadata")
        self._namespace = namespace
        self._consistency = consistency
        self._ttl = ttl
        self._file_mode = file_mode
        self._dir_mode = dir_mode
        self._lock_timeout = lock_timeout
        self._clock = clock
        self.freshness = freshness or Freshness(consistency, ttl, clock)
        self.also_invalidate = also_invalidate
        os.makedirs(root, mode=dir_mode, exist_ok=True)
        make_tier_dir(root, "metadata", dir_mode)
        self._shards_ready: set[str] = set()
        # Listings parsed in this process, by path, reused while the file is the same one.
        self._parsed: OrderedDict[str, _Record] = OrderedDict()
        self._parsed_lock = threading.Lock()
        forksafe.register(self)

    def after_fork(self) -> None:
        """Another thread may have held the lock at the fork: the child starts afresh."""
        self._parsed = OrderedDict()
        self._parsed_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """False in ``always`` mode (and with ``ttl=0``): every answer comes from the store."""
        return self._consistency == "immutable" or (self._consistency == "ttl" and self._ttl > 0)

    def now(self) -> float:
        """The time to stamp an answer with: take it *before* asking the store."""
        return self._clock()

    def is_fresh(self, asked_at: float) -> bool:
        """Whether an answer the store gave at ``asked_at`` may still be served."""
        return self.freshness.holds(asked_at)

    # -- reading -----------------------------------------------------------------------------

    def info(self, bucket: str, key: str, from_listing: bool = True) -> KnownInfo | None:
        """What is known of ``key``: its own record, else (``from_listing``) its row in its
        parent's listing."""
        if not self.enabled:
            return None
        found = self._read(bucket, key, "info")
        if found is not None and found.body.get("state") in _KNOWN:
            row = found.body.get("row")
            state = found.body["state"]
            return KnownInfo(state, row if isinstance(row, dict) else None, found.asked_at)
        if not from_listing or not key:
            return None
        listed = self._read(bucket, key[: key.rfind("/") + 1], "ls")
        if listed is None or listed.rows() is None:
            return None
        same = listed.names().get(f"{bucket}/{key}", {})
        states: tuple[Known, ...] = ("file", "directory")
        for state in states:
            if state in same:
                return KnownInfo(state, dict(same[state]), listed.asked_at)
        return KnownInfo("absent", None, listed.asked_at)

    def listing(self, bucket: str, prefix: str, recursive: bool) -> list[dict[str, Any]] | None:
        """The store's rows under ``prefix`` (``recursive``: the ``find`` listing), if fresh."""
        if not self.enabled:
            return None
        found = self._read(bucket, prefix, "find" if recursive else "ls")
        rows = None if found is None else found.rows()
        return None if rows is None else [dict(r) for r in rows]

    def _read(self, bucket: str, key: str, kind: Kind) -> _Record | None:
        """A fresh record of this store, bucket and key."""
        path = self._path(self._id(bucket, key), kind)
        record = None
        if kind != "info":
            # A listing read for each key it lists: one stat tells whether the copy parsed
            # before is still the file's (opened only when it is not).
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                return None
            with self._parsed_lock:
                record = self._parsed.get(path)
            if record is not None and record.identity != _identity(st):
                record = None
        if record is None:
            record = self._parse_file(path)
        if record is None or record.names_of != (self._namespace, bucket, key):
            return None
        if kind != "info":  # listings are large and read often: keep a few parsed
            with self._parsed_lock:
                self._parsed[path] = record
                self._parsed.move_to_end(path)
                while len(self._parsed) > _PARSED_LISTINGS:
                    self._parsed.popitem(last=False)
        return record if self.is_fresh(record.asked_at) else None

    @staticmethod
    def _parse_file(path: str) -> _Record | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                return _Record.parse(f.read(), _identity(os.fstat(f.fileno())))
        except OSError:
            return None

    # -- remembering -------------------------------------------------------------------------

    def remember_info(
        self, bucket: str, key: str, state: Known, row: dict[str, Any] | None, asked_at: float
    ) -> None:
        """Keep what the store said of ``key`` when asked at ``asked_at`` (best effort)."""
        if self.enabled:
            self._write(bucket, key, "info", {"state": state, "row": row}, asked_at)

    def remember_listing(
        self,
        bucket: str,
        prefix: str,
        recursive: bool,
        rows: list[dict[str, Any]],
        asked_at: float,
    ) -> None:
        """Keep the store's rows under ``prefix`` as listed from ``asked_at`` on (best effort)."""
        if self.enabled and len(rows) <= MAX_LISTING_ROWS:
            kind: Kind = "find" if recursive else "ls"
            self._write(bucket, prefix, kind, {"rows": rows}, asked_at)

    def _write(
        self, bucket: str, key: str, kind: Kind, body: dict[str, Any], asked_at: float
    ) -> None:
        entry_id = self._id(bucket, key)
        record = {
            "v": RECORD_VERSION,
            "ns": self._namespace,
            "bucket": bucket,
            "key": key,
            "at": asked_at,
            **body,
        }
        path = self._path(entry_id, kind)
        try:
            payload = json.dumps(record, separators=(",", ":")).encode()
            tmp = prepare_file(path, payload, self._file_mode, durable=False)
        except (OSError, TypeError, ValueError):
            return  # a cache: no room, or a row JSON cannot hold, only costs a request later
        try:
            with self._stamp_lock(entry_id[:2]) as stamp:
                # An invalidation since the store was asked: the answer may predate a write.
                if os.fstat(stamp).st_mtime_ns >= int(asked_at * 1e9) - 1000:
                    remove_file(tmp)
                    return
                install(tmp, path)
        except OSError:
            remove_file(tmp)

    # -- invalidation ------------------------------------------------------------------------

    def invalidated_since(self, bucket: str, prefix: str, asked_at: float) -> bool:
        """Whether a write on this host may have changed the listing of ``prefix`` since the
        store was asked at ``asked_at`` (for listings kept elsewhere than in this cache)."""
        stamp = os.path.join(self._shard(self._id(bucket, prefix)[:2]), _STAMP)
        try:
            changed = os.stat(stamp).st_mtime_ns
        except FileNotFoundError:
            return False  # born with the first invalidation of its shard
        return changed >= int(asked_at * 1e9) - 1000

    def invalidate(self, bucket: str, keys: Iterable[str], shared: bool = True) -> None:
        """This host changed ``keys`` (wrote, deleted, renamed, copied onto them): forget each
        key, its parent directories and the listings of every prefix above it, in every mode
        (and, with ``shared``, in the shared tier's listings: ``also_invalidate``; a write
        behind is not in the store yet, so its upload tells them when it lands)."""
        keys = list(keys)
        files = listing_kinds(self._namespace, bucket, keys)
        for key in keys:
            parts = key.split("/")
            for depth in range(1, len(parts) + 1):
                files.add((self._id(bucket, "/".join(parts[:depth])), "info"))
        self._forget(files)
        if shared and self.also_invalidate is not None:
            self.also_invalidate(bucket, keys)

    def invalidate_bucket(self, bucket: str) -> None:
        """A bucket was created or removed: forget its root listings."""
        entry_id = self._id(bucket, "")
        self._forget([(entry_id, "ls"), (entry_id, "find")])
        if self.also_invalidate is not None:
            self.also_invalidate(bucket, [""])

    def _forget(self, files: Iterable[tuple[str, Kind]]) -> None:
        by_shard: dict[str, list[str]] = {}
        for entry_id, kind in files:
            by_shard.setdefault(entry_id[:2], []).append(self._path(entry_id, kind))
        for shard, paths in sorted(by_shard.items()):  # one order: no two forgetters deadlock
            with self._stamp_lock(shard) as stamp:
                now = int(self._clock() * 1e9)
                os.utime(stamp, ns=(now, now))
                for path in paths:
                    remove_file(path)

    # -- upkeep ------------------------------------------------------------------------------

    def prune(self, everything: bool = False) -> int:
        """Remove records no longer served (all of them with ``everything``); return how many.

        Records are small, but every key asked about leaves one: ``fs.evict`` calls this.
        """
        removed = 0
        now = self._clock()
        for path, name in self._files():
            if name == _STAMP:
                continue
            if name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if now - os.stat(path, follow_symlinks=False).st_mtime > _TMP_AGE:
                        remove_file(path)
                continue
            if not everything:
                try:
                    with open(path, "rb") as f:
                        asked_at = json.loads(f.read()).get("at")
                except (OSError, ValueError, AttributeError):
                    asked_at = None
                if isinstance(asked_at, (int, float)) and self.is_fresh(float(asked_at)):
                    continue
            remove_file(path)
            removed += 1
        return removed

    def _files(self) -> Iterator[tuple[str, str]]:
        try:
            shards = list(os.scandir(self.dir))
        except FileNotFoundError:
            return
        for shard in shards:
            if shard.is_dir(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    for item in os.scandir(shard.path):
                        yield item.path, item.name

    # -- naming and locking ------------------------------------------------------------------

    def _id(self, bucket: str, key: str) -> str:
        return LocalTier.entry_id(self._namespace, bucket, key)

    def _path(self, entry_id: str, kind: Kind) -> str:
        return os.path.join(self._shard(entry_id[:2]), f"{entry_id}.{kind}")

    def _shard(self, shard: str) -> str:
        return shard_dir(self.dir, shard, self._dir_mode, self._shards_ready)

    @contextlib.contextmanager
    def _stamp_lock(self, shard: str) -> Iterator[int]:
        """Hold the shard's stamp file locked; yields its descriptor."""
        path = os.path.join(self._shard(shard), _STAMP)
        try:  # born with mtime 0: it has seen no invalidation yet
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            os.fchmod(fd, self._file_mode)
            os.utime(fd, ns=(0, 0))
            os.close(fd)
        fd = lock(path, self._file_mode, self._lock_timeout, "updating cached metadata")
        try:
            yield fd
        finally:
            unlock(fd)
