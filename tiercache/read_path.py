"""The read path: validate a cached entry, serve a hit, or join/start a single-flight fetch.

``open`` goes: lookup in the local tier → revalidate per consistency mode → open the data
(hit) → or join the fetch of this object already running in this process → or start one
(which waits for another process's fetch of it, see ``Fetch``). The reader of a fetch gets
bytes as they arrive.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from tiercache import forksafe
from tiercache.config import TierCacheConfig
from tiercache.errors import ObjectNotFoundError, TierFullError
from tiercache.fetch import Fetch, FetchRequest
from tiercache.stats import Stats
from tiercache.store.base import ObjectStore
from tiercache.store.retry import RetryPolicy
from tiercache.tiers.entry import CachedEntry
from tiercache.tiers.local import LocalTier


@dataclass(frozen=True)
class OpenedObject:
    """An open file descriptor on an object's bytes: a published entry or a growing fetch."""

    fd: int
    size: int
    etag: str
    fetch: Fetch | None


def source_url(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


class ReadPath:
    """Serves reads of objects through the local tier."""

    def __init__(
        self, config: TierCacheConfig, tier: LocalTier, store: ObjectStore, stats: Stats
    ) -> None:
        self._config = config
        self._tier = tier
        self._store = store
        self._stats = stats
        self._retry = RetryPolicy(attempts=config.retries)
        self._flights: dict[str, Fetch] = {}
        self._flights_lock = threading.Lock()
        forksafe.register(self)

    def after_fork(self) -> None:
        """A child has none of the parent's fetch threads: start with an empty flight table."""
        self._flights = {}
        self._flights_lock = threading.Lock()

    def entry_id(self, bucket: str, key: str) -> str:
        return self._tier.entry_id(self._store.namespace, bucket, key)

    def cached(self, bucket: str, key: str) -> CachedEntry | None:
        """The published entry of an object, without validating it against the store."""
        return self._tier.lookup(
            self.entry_id(bucket, key), self._store.namespace, source_url(bucket, key)
        )

    def open(self, bucket: str, key: str) -> OpenedObject:
        """Open an object for reading through the tier."""
        entry = self.cached(bucket, key)
        if entry is not None and (self._config.verify == "always" or self._tier.needs_check(entry)):
            entry = self._check_digest(entry)
        if entry is not None:
            entry = self._validate(entry, bucket, key)
        if entry is not None:
            try:
                fd = self._tier.open_data(entry)
            except FileNotFoundError:
                pass  # evicted or torn between lookup and open: fetch it again
            else:
                self._stats.add("hits")
                self._tier.touch(entry)
                return OpenedObject(fd, entry.meta.size, entry.meta.etag, None)
        return self._open_through_fetch(bucket, key)

    def warm(self, bucket: str, key: str) -> Fetch | None:
        """Bring an object into the tier without reading it (prefetch).

        Returns None when a valid entry is already there, else the fetch that brings it: the
        one already running in this process for the object (joined), or a new one.
        """
        entry = self.cached(bucket, key)
        if entry is not None:
            entry = self._validate(entry, bucket, key)
        if entry is not None and self._tier.is_intact(entry):
            return None
        return self._join_or_start(bucket, key)

    def in_flight(self, bucket: str, key: str) -> Fetch | None:
        """The fetch of this object running in this process, if any (prefetch reports joins)."""
        with self._flights_lock:
            fetch = self._flights.get(self.entry_id(bucket, key))
        return fetch if fetch is not None and not fetch.finished else None

    def hold(self, fetch: Fetch) -> int:
        """A descriptor with a shared lock on the bytes ``fetch`` brings, taken on the part file
        (which becomes the data file) so that eviction leaves the entry from the moment it is
        published; the prefetcher holds one until a reader opens the object."""
        fetch.wait_started()
        if fetch.info is not None:
            try:
                fd = os.open(fetch.part_path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                pass  # published already: hold the data file
            else:
                fcntl.flock(fd, fcntl.LOCK_SH)
                return fd
        return self._tier.open_data(fetch.wait_finished())

    def wait_idle(self) -> None:
        """Wait until every fetch this process started has published (or failed)."""
        with self._flights_lock:
            running = list(self._flights.values())
        for fetch in running:
            with contextlib.suppress(Exception):
                fetch.wait_finished()

    def invalidate(self, bucket: str, key: str) -> None:
        """Forget a cached object (it was overwritten or deleted through this filesystem)."""
        self._tier.invalidate(self.entry_id(bucket, key), self._config.lock_timeout)

    # -- validation --------------------------------------------------------------------------

    def _validate(self, entry: CachedEntry, bucket: str, key: str) -> CachedEntry | None:
        mode = self._config.consistency
        now = time.time()
        if entry.meta.state == "dirty":
            return entry  # our own write, not yet in the store: the store cannot judge it
        if mode == "immutable" or (
            mode == "ttl" and now - entry.meta.validated_at < self._config.ttl
        ):
            return entry
        try:
            current = self._store.head(bucket, key)
        except ObjectNotFoundError:
            self._drop(entry)
            raise
        if current.etag == entry.meta.etag:
            self._stats.add("revalidations")
            if mode == "ttl":
                return self._tier.replace_meta(entry, replace(entry.meta, validated_at=now))
            return entry
        self._drop(entry)
        return None

    def _check_digest(self, entry: CachedEntry) -> CachedEntry | None:
        checked = self._tier.check_digest(entry)
        if checked is None:
            self._stats.add("corrupt_entries")
            self._drop(entry)
        return checked

    def _drop(self, entry: CachedEntry) -> None:
        self._stats.add("invalidations")
        self._tier.invalidate(entry.entry_id, self._config.lock_timeout)

    # -- fetching ----------------------------------------------------------------------------

    def _open_through_fetch(self, bucket: str, key: str) -> OpenedObject:
        fetch = self._join_or_start(bucket, key)
        try:
            fetch.wait_started()
        except OSError as exc:
            raise self.tier_full_error(exc, bucket, key) or exc from exc
        if fetch.info is None:  # satisfied by an entry another process published
            return self._open_published(fetch)
        try:
            fd = os.open(fetch.part_path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:  # being published: the part file became the data file
            return self._open_published(fetch)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return OpenedObject(fd, fetch.info.size, fetch.info.etag, fetch)

    def tier_full_error(self, exc: OSError, bucket: str, key: str) -> TierFullError | None:
        """A ``TierFullError`` if ``exc`` says the tier's filesystem is out of space."""
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or isinstance(exc, TierFullError):
            return exc if isinstance(exc, TierFullError) else None
        self._stats.add("tier_full")
        return TierFullError(
            exc.errno,
            f"no space left in the local tier for s3://{bucket}/{key}; reading it "
            "straight from the store (free space or lower local_max_bytes)",
            self._tier.root,
        )

    def _open_published(self, fetch: Fetch) -> OpenedObject:
        entry = fetch.wait_finished()
        fd = self._tier.open_data(entry)
        return OpenedObject(fd, entry.meta.size, entry.meta.etag, None)

    def _join_or_start(self, bucket: str, key: str) -> Fetch:
        source = source_url(bucket, key)
        entry_id = self.entry_id(bucket, key)
        with self._flights_lock:
            running = self._flights.get(entry_id)
            if running is not None and not running.finished:
                self._stats.add("fetches_joined")
                return running
            request = FetchRequest(
                bucket=bucket,
                key=key,
                source=source,
                namespace=self._store.namespace,
                entry_id=entry_id,
                part_size=self._config.part_size,
                concurrency=self._config.fetch_concurrency,
                lock_timeout=self._config.lock_timeout,
                accept_existing=self._acceptor(time.time()),
            )
            fetch = Fetch(request, self._tier, self._store, self._retry, self._stats, self._landed)
            self._flights[entry_id] = fetch
        self._stats.add("misses")
        fetch.start()
        return fetch

    def _acceptor(self, asked_at: float) -> Callable[[CachedEntry], bool]:
        """Whether an entry another process published while we waited is fresh enough."""
        mode = self._config.consistency
        ttl = self._config.ttl

        def accept(entry: CachedEntry) -> bool:
            if mode == "immutable":
                return True
            window = ttl if mode == "ttl" else 0.0
            return entry.meta.validated_at >= asked_at - window

        return accept

    def _landed(self, fetch: Fetch) -> None:
        with self._flights_lock:
            if self._flights.get(fetch.request.entry_id) is fetch:
                del self._flights[fetch.request.entry_id]
