"""``SharedListings``: prefix listings kept in the shared tier, one LIST per ttl for every host.

Without it each host lists a dataset's prefix itself, and ranks listing at once are a known
cause of throttling (503 SlowDown). With a shared tier, a listing is kept beside it for every
host, and the first host to need it lists while the others wait for its record::

    SHARED/metadata/ab/<64 hex>.ls|.find   the store's rows under one prefix, as the local
                                           metadata cache keeps them (same record format)
    SHARED/metadata/ab/<64 hex>.<kind>.lease  the lease of the host listing it now
    SHARED/metadata/ab/stamp               a random token, replaced at each invalidation

No ``flock`` (a shared filesystem may not honour it across hosts): the single flight is a
lease (``tiers/lease.py``), and a record that races an invalidation is removed by whichever
comes second. The lister reads the shard's stamp token before asking the store and again after
renaming its record into place, and removes the record if the token changed; an invalidation
replaces the token first and removes the records after. Invalidation follows the local cache's
rule: a write of this host (at ``close()``, and when its upload lands) forgets the listings of
every prefix above the key.

Another user's process may have listed it: with ``shared_auth="store"`` a record this process
did not list itself is served only once the store has answered this process's own credentials
for that bucket and prefix within the ``ttl`` (``ListingProofs``), as a shared entry's bytes
are served only after a HEAD of the reader's own.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from typing import Any

from tiercache import forksafe
from tiercache.metadata.cache import MAX_LISTING_ROWS, RECORD_VERSION, Kind, listing_kinds
from tiercache.metadata.freshness import Freshness
from tiercache.metadata.rows import store_rows
from tiercache.store.base import ObjectStore
from tiercache.tiers.entry import install, prepare_file, read_small_file, shard_dir
from tiercache.tiers.local import LocalTier, make_tier_dir, remove_file
from tiercache.tiers.shared import SharedTier

_STAMP = "stamp"
_RECORD_LIMIT = 256 * 1024 * 1024  # bytes read of one record (MAX_LISTING_ROWS rows fit)

Rows = list[dict[str, Any]]


class Lister:
    """Where listings come from: one LIST, through the shared tier's records if there is one."""

    def __init__(
        self, store: ObjectStore, shared: SharedListings | None, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._shared = shared
        self._clock = clock

    def rows(self, bucket: str, prefix: str, recursive: bool) -> tuple[Rows, float]:
        """The store's rows under ``prefix`` (see ``store_rows``) and when it was asked."""

        def list_now() -> Rows:
            return store_rows(self._store, bucket, prefix, recursive)

        if self._shared is None:
            asked_at = self._clock()
            return list_now(), asked_at
        return self._shared.listing(bucket, prefix, recursive, list_now)


class ListingProofs:
    """Which prefixes this process's own credentials may list, as the store said within ``ttl``.

    A listing another user's process kept in the shared tier is served here only after the
    store answered this process for the same bucket and prefix: its own listing of it, or one
    request sent for the purpose, the first page of a LIST of the prefix (the request a direct
    ``ls`` would send first; its refusal is raised as that ``ls`` would raise it). An answer
    holds for ``ttl`` seconds in every consistency mode, as the HEAD that lets a reader have a
    shared entry's bytes does, so a credential the store stops accepting is refused here
    within ``ttl`` seconds. Kept in memory only: nothing derived from a credential is written.
    """

    def __init__(self, store: ObjectStore, ttl: float, clock: Callable[[], float]) -> None:
        self._store = store
        self._ttl = ttl
        self._clock = clock
        self._answered: dict[tuple[str, str], float] = {}  # (bucket, prefix) -> asked at
        self._lock = threading.Lock()
        self._asking: dict[tuple[str, str], threading.Lock] = {}
        forksafe.register(self)

    def after_fork(self) -> None:
        """The child has the parent's credentials, not its threads: it keeps the answers."""
        self._lock = threading.Lock()
        self._asking = {}

    def answered(self, bucket: str, prefix: str, asked_at: float) -> None:
        """The store answered this process's listing of ``prefix`` asked at ``asked_at``."""
        with self._lock:
            if asked_at > self._answered.get((bucket, prefix), float("-inf")):
                self._answered[(bucket, prefix)] = asked_at

    def check(self, bucket: str, prefix: str) -> None:
        """Return if this process may list ``prefix``; else raise what the store raised
        (``AccessDeniedError`` for a refusal). One request per prefix at a time."""
        if self._holds(bucket, prefix):
            return
        with self._lock:
            asking = self._asking.setdefault((bucket, prefix), threading.Lock())
        with asking:
            if self._holds(bucket, prefix):
                return
            asked_at = self._clock()
            next(iter(self._store.list_objects(bucket, prefix, "/")), None)  # one page
            self.answered(bucket, prefix, asked_at)

    def _holds(self, bucket: str, prefix: str) -> bool:
        with self._lock:
            asked_at = self._answered.get((bucket, prefix))
        return asked_at is not None and 0 <= self._clock() - asked_at < self._ttl


class SharedListings:
    """Listings of one store kept in the shared tier for every host that mounts it."""

    def __init__(
        self,
        shared: SharedTier,
        namespace: str,
        freshness: Freshness,
        lock_timeout: float,
        proofs: ListingProofs | None = None,
    ) -> None:
        self.dir = make_tier_dir(shared.root, "metadata", shared.dir_mode)
        self._leases = shared.leases
        self._file_mode = shared.file_mode
        self._dir_mode = shared.dir_mode
        self._namespace = namespace
        self._freshness = freshness
        self._lock_timeout = lock_timeout
        self._proofs = proofs  # None: whoever can read the directory gets its listings
        self._shards_ready: set[str] = set()

    def listing(
        self, bucket: str, prefix: str, recursive: bool, list_now: Callable[[], Rows]
    ) -> tuple[Rows, float]:
        """The rows under ``prefix`` and when the store was asked: a fresh record of any
        host's (served once ``proofs`` let this process list the prefix), else ``list_now()``
        run here (one host at a time) and kept for the others."""
        kind: Kind = "find" if recursive else "ls"
        entry_id = LocalTier.entry_id(self._namespace, bucket, prefix)
        path = self._path(entry_id, kind)
        found = self._read(path, bucket, prefix) or self._list_once(
            path, entry_id, bucket, prefix, list_now
        )
        rows, asked_at, listed_here = found
        if self._proofs is not None:
            if listed_here:
                self._proofs.answered(bucket, prefix, asked_at)
            else:  # outside the lease: the hosts waiting for it wait for no proof of ours
                self._proofs.check(bucket, prefix)
        return rows, asked_at

    def _list_once(
        self, path: str, entry_id: str, bucket: str, prefix: str, list_now: Callable[[], Rows]
    ) -> tuple[Rows, float, bool]:
        """List the prefix under its lease, unless the host we waited for listed it."""
        lease = f"{path}.lease"
        token = self._leases.acquire(lease, self._lock_timeout, "listing the same prefix")
        try:
            found = self._read(path, bucket, prefix)  # listed by the host we waited for
            if found is not None:
                return found
            stamp = self._stamp(entry_id)
            asked_at = self._freshness.clock()
            rows = list_now()
            if len(rows) <= MAX_LISTING_ROWS:
                self._write(path, bucket, prefix, rows, asked_at)
                if self._stamp(entry_id) != stamp:  # invalidated meanwhile: not to be kept
                    remove_file(path)
            return rows, asked_at, True
        finally:
            self._leases.release(lease, token)

    def invalidate(self, bucket: str, keys: Iterable[str]) -> None:
        """This host changed ``keys``: forget the listings of every prefix above them."""
        by_shard: dict[str, list[str]] = {}
        for entry_id, kind in listing_kinds(self._namespace, bucket, keys):
            by_shard.setdefault(entry_id[:2], []).append(self._path(entry_id, kind))
        for shard, paths in sorted(by_shard.items()):
            self._new_stamp(shard)  # first: a lister that renames after this sees it
            for path in paths:
                remove_file(path)

    # -- records -----------------------------------------------------------------------------

    def _read(self, path: str, bucket: str, prefix: str) -> tuple[Rows, float, bool] | None:
        """A fresh record's rows and when the store was asked (and False: not listed here)."""
        raw = read_small_file(path, _RECORD_LIMIT)
        if raw is None:
            return None
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("v") != RECORD_VERSION:
            return None
        if (body.get("ns"), body.get("bucket"), body.get("key")) != (
            self._namespace,
            bucket,
            prefix,
        ):
            return None
        at, rows = body.get("at"), body.get("rows")
        if not isinstance(at, (int, float)) or not isinstance(rows, list):
            return None
        if not self._freshness.holds(float(at)):
            return None
        return [dict(r) for r in rows if isinstance(r, dict)], float(at), False

    def _write(self, path: str, bucket: str, prefix: str, rows: Rows, asked_at: float) -> None:
        record = {
            "v": RECORD_VERSION,
            "ns": self._namespace,
            "bucket": bucket,
            "key": prefix,
            "at": asked_at,
            "rows": rows,
        }
        try:
            payload = json.dumps(record, separators=(",", ":")).encode()
            install(prepare_file(path, payload, self._file_mode, durable=False), path)
        except (OSError, TypeError, ValueError):
            pass  # a cache: no room, or rows JSON cannot hold, only costs a LIST later

    def _stamp(self, entry_id: str) -> bytes | None:
        return read_small_file(os.path.join(self._shard(entry_id[:2]), _STAMP), 64)

    def _new_stamp(self, shard: str) -> None:
        stamp = os.path.join(self._shard(shard), _STAMP)
        install(prepare_file(stamp, secrets.token_hex(16).encode(), self._file_mode), stamp)

    def _path(self, entry_id: str, kind: Kind) -> str:
        return os.path.join(self._shard(entry_id[:2]), f"{entry_id}.{kind}")

    def _shard(self, shard: str) -> str:
        return shard_dir(self.dir, shard, self._dir_mode, self._shards_ready)
