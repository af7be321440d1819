"""The read path: validate a cached entry, serve a hit, or join/start a single-flight fetch.

``open`` goes: lookup in the local tier → revalidate per consistency mode (ETag and size) →
open the data (hit; its bytes are checked against their digest per ``verify``, see
``verify.py``) → else the same in the shared tier, if there is one (served in place, or
promoted into the local tier first) → or join the fetch of this object already running in
this process → or start one (which waits for another process's or host's fetch of it, see
``Fetch``). A fetch fills the shared tier when there is one (so that other hosts find the
object there), then the local tier. The reader of a fetch gets bytes as they arrive.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from tiercache import forksafe
from tiercache.config import TierCacheConfig, fetch_streams
from tiercache.errors import (
    CacheCorruptError,
    CacheTimeoutError,
    ObjectNotFoundError,
    TierFullError,
    is_no_space,
    tier_full,
)
from tiercache.metadata.freshness import Freshness
from tiercache.metadata.revalidate import ListingRevalidator
from tiercache.promote import promote
from tiercache.read.blocks import BlockFetcher, BlockSource
from tiercache.read.fetch import BlockModeRequiredError, Fetch, FetchRequest
from tiercache.read.files import (
    BlockFile,
    CachedFile,
    DirectFile,
    OpenedObject,
    RangeFirstFile,
    SeekableReader,
)
from tiercache.read.ranges import StreamGovernor
from tiercache.stats import Stats
from tiercache.store.base import ObjectInfo, ObjectStore
from tiercache.store.retry import RetryPolicy
from tiercache.tiers.blocks import BlockEntry
from tiercache.tiers.entry import CachedEntry
from tiercache.tiers.local import LocalTier
from tiercache.tiers.shared import SharedTier
from tiercache.verify import EntryChecks, EntryDroppedError, Verifier


def source_url(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


class ReadPath:
    """Serves reads of objects through the local tier and, if there is one, the shared tier."""

    def __init__(
        self,
        config: TierCacheConfig,
        tier: LocalTier,
        store: ObjectStore,
        stats: Stats,
        shared: SharedTier | None = None,
        revalidator: ListingRevalidator | None = None,
        pending_write: Callable[[str, str], CachedEntry | None] | None = None,
        pending_tier: LocalTier | None = None,
    ) -> None:
        """``pending_write``: the dirty entry of a write pending in the journal, restored if
        damaged (by entry id and source), asked on a local miss before the store;
        ``pending_tier``: the tier writes behind wait in (``write_tier``; default ``tier``)."""
        self._config = config
        self._freshness = Freshness(config.consistency, config.ttl)
        self._revalidator = revalidator
        self._tier = tier
        self._shared = shared
        self._fill_tier: LocalTier = shared or tier
        self._store = store
        self._stats = stats
        self._retry = RetryPolicy(attempts=config.retries)
        self._flights: dict[str, Fetch] = {}
        self._flights_lock = threading.Lock()
        self._authorized: dict[str, float] = {}  # entry id -> when the store last said yes
        self._streams = StreamGovernor(fetch_streams(config))  # learned per store
        self.verifier = Verifier(stats)
        self._checks = EntryChecks(self.verifier, config.verify, config.lock_timeout, shared)
        self.blocks = BlockFetcher(config, tier, store, self._retry, stats, self.verifier)
        self.pending_write = pending_write
        self.pending_tier: LocalTier = pending_tier or tier
        forksafe.register(self)

    def after_fork(self) -> None:
        """A child has none of the parent's fetch threads: start with an empty flight table."""
        self._flights = {}
        self._flights_lock = threading.Lock()
        self._authorized = {}

    def entry_id(self, bucket: str, key: str) -> str:
        return self._tier.entry_id(self._store.namespace, bucket, key)

    def cached(self, bucket: str, key: str) -> CachedEntry | None:
        """The published entry of an object, without validating it against the store."""
        return self._lookup(self._tier, bucket, key)

    def cached_or_pending(self, bucket: str, key: str) -> CachedEntry | None:
        """The local entry of an object, else the entry of a write of it that waits for its
        upload in the shared tier (``write_tier="shared"``), published now if its commit
        left that to its first reader; neither is validated."""
        entry = self.cached(bucket, key)
        if entry is None and self.pending_tier is not self._tier:
            entry = self._lookup(self.pending_tier, bucket, key) or self._pending(bucket, key)
            if entry is None or entry.meta.state != "dirty":
                return None
            self._authorize_pending(entry, bucket, key)
        return entry

    def cached_shared(self, bucket: str, key: str) -> CachedEntry | None:
        """The object's entry in the shared tier (None without one), not validated."""
        return None if self._shared is None else self._lookup(self._shared, bucket, key)

    def _lookup(self, tier: LocalTier, bucket: str, key: str) -> CachedEntry | None:
        return tier.lookup(
            self.entry_id(bucket, key), self._store.namespace, source_url(bucket, key)
        )

    def open_file(self, bucket: str, key: str) -> SeekableReader | DirectFile:
        """The file object a reader of the object gets: over a tier (a hit, or a fetch it
        reads as it arrives, or blocks), or straight from the store when the tier is full."""
        path = f"{bucket}/{key}"
        try:
            started = time.monotonic()
            joined = self.in_flight(bucket, key) is not None
            opened = self.open(bucket, key)
            if joined or opened.fetch is not None:  # open waited for a fetch
                self._count_wait(time.monotonic() - started)
        except TierFullError:
            return self._direct_file(bucket, key)
        if opened.blocks is not None:
            return self._block_file(bucket, key, opened.blocks)

        def fall_back(exc: OSError) -> DirectFile | None:
            if self.tier_full_error(exc, bucket, key) is None:
                return None
            return self._direct_file(bucket, key)

        whole = CachedFile(
            path, opened, self._count_read, on_tier_full=fall_back, on_wait=self._count_wait
        )
        if opened.fetch is None or not opened.fetch.range_first:
            return whole

        def by_blocks(info: ObjectInfo) -> BlockFile:
            blocks = self.open_blocks(info).blocks
            assert blocks is not None
            return self._block_file(bucket, key, blocks)

        return RangeFirstFile(whole, opened.fetch, by_blocks)

    def _block_file(self, bucket: str, key: str, blocks: BlockEntry) -> BlockFile:
        return BlockFile(
            f"{bucket}/{key}",
            blocks,
            self.block_source(bucket, key),
            self.blocks,
            self._count_read,
            verify=self._config.verify == "always",
        )

    def _direct_file(self, bucket: str, key: str) -> DirectFile:
        """Read an object straight from the store (its tier has no room for it)."""
        return DirectFile(f"{bucket}/{key}", self._store, bucket, key, self._retry)

    def _count_read(self, nbytes: int) -> None:
        self._stats.add("bytes_read", nbytes)

    def _count_wait(self, seconds: float) -> None:
        self._stats.add_time("reader_wait_seconds", seconds)

    def open(self, bucket: str, key: str) -> OpenedObject:
        """Open an object for reading through the tiers."""
        opened = self._open_hit(self._tier, bucket, key) or self._open_pending(bucket, key)
        if opened is None and self._shared is not None:
            opened = self._open_shared(self._shared, bucket, key)
        by_blocks = (self._config.block_threshold, self._config.range_first_above)
        if opened is None and by_blocks != (None, None):
            opened = self._open_cached_blocks(bucket, key)
        return opened or self._open_through_fetch(bucket, key)

    def _pending(self, bucket: str, key: str) -> CachedEntry | None:
        """On a local miss: the entry of a write of the object still pending in the journal
        (restored from the journal's copy if the tier's was damaged), never the store's
        older version instead; raises ``CacheCorruptError`` if it cannot be restored."""
        if self.pending_write is None:
            return None
        return self.pending_write(self.entry_id(bucket, key), source_url(bucket, key))

    def _open_pending(self, bucket: str, key: str) -> OpenedObject | None:
        entry = self._pending(bucket, key)
        if entry is None:
            return None
        if self.pending_tier is not self._tier:
            self._authorize_pending(entry, bucket, key)
        opened = self._open_entry(self.pending_tier, entry, "hits", bucket, key)
        if opened is None:
            raise CacheCorruptError(
                f"{entry.meta.source}: the restored copy of a write not yet uploaded vanished "
                "or failed its digest check"
            )
        return opened

    def block_source(self, bucket: str, key: str) -> BlockSource:
        return BlockSource(bucket, key, source_url(bucket, key), self._store.namespace)

    def _open_cached_blocks(self, bucket: str, key: str) -> OpenedObject | None:
        """Open the block entry of a huge object read before, if still valid."""
        entry_id = self.entry_id(bucket, key)
        meta = BlockEntry.lookup(
            self._tier, entry_id, self._store.namespace, source_url(bucket, key)
        )
        if meta is None:
            return None
        fresh = self._freshness.holds(meta.validated_at)
        if not fresh and (
            self._vouched(bucket, key, meta.etag, meta.size, self._tier, entry_id) == "changed"
        ):
            self._drop_id(self._tier, entry_id)
            return None
        info = ObjectInfo(bucket, key, meta.size, meta.etag, meta.last_modified)
        opened = self._open_blocks(info, create=False)
        if opened is None:
            # Completed into a whole entry while this reader waited for its lock (or evicted).
            return self._open_hit(self._tier, bucket, key)
        self._stats.add("hits")
        return opened

    def open_blocks(self, info: ObjectInfo) -> OpenedObject:
        opened = self._open_blocks(info, create=True)
        assert opened is not None
        return opened

    def _open_blocks(self, info: ObjectInfo, create: bool) -> OpenedObject | None:
        entry = BlockEntry.open(
            self._tier,
            self.entry_id(info.bucket, info.key),
            info,
            source_url(info.bucket, info.key),
            self._store.namespace,
            self._config.block_size,
            self._config.lock_timeout,
            create=create,
        )
        if entry is None:
            return None
        return OpenedObject(-1, info.size, info.etag, None, blocks=entry)

    def warm(
        self,
        bucket: str,
        key: str,
        local: bool = True,
        limit: int | None = None,
        start: bool = True,
    ) -> Fetch | CachedEntry | None:
        """Bring an object into the tiers without reading it (prefetch).

        Returns the valid entry already in the local tier (checked and validated: the caller
        may hold it), None when the shared tier has it (promoted from there per
        ``shared_policy``, or ``local=False``), else the fetch that brings it: the one
        already running in this process for the object (joined), or a new one. With
        ``local=False`` only the shared tier is filled (the object is not copied locally).
        A new fetch of an object larger than ``limit`` bytes stops at the GET's first reply
        (``BlockModeRequiredError``, which carries the size): no HEAD is needed to ask first.
        With ``start=False`` a new fetch is returned unstarted (``Fetch.started``): the caller
        runs it (``Fetch.run``) at once.
        """
        if local:
            usable = self._usable(self._tier, bucket, key) or self._pending(bucket, key)
            if usable is not None:
                return usable
        if self._shared is not None:
            if local:
                if self._from_shared(self._shared, bucket, key) is not None:
                    return None
            elif self._usable(self._shared, bucket, key) is not None:
                return None
        return self._join_or_start(bucket, key, promote=local, limit=limit, start=start)

    def _usable(self, tier: LocalTier, bucket: str, key: str) -> CachedEntry | None:
        """The tier's entry of the object, checked (digest, per ``verify``) and validated."""
        entry = self._lookup(tier, bucket, key)
        if entry is not None:
            entry = self._checks.before_open(tier, entry)
        if entry is not None:
            entry = self._validate(tier, entry, bucket, key)
        return entry

    def _open_hit(self, tier: LocalTier, bucket: str, key: str) -> OpenedObject | None:
        entry = self._usable(tier, bucket, key)
        if entry is None:
            return None
        return self._open_entry(tier, entry, "hits", bucket, key)

    def _open_entry(
        self, tier: LocalTier, entry: CachedEntry, counter: str | None, bucket: str, key: str
    ) -> OpenedObject | None:
        try:
            fd = tier.open_data(entry)
        except FileNotFoundError:
            return None  # evicted or torn between lookup and open: fetch it again
        try:
            check = self._checks.at_open(tier, entry, fd)
        except EntryDroppedError:
            os.close(fd)
            return None  # failed its digest check and dropped: fetch it again
        except BaseException:
            os.close(fd)
            raise
        if counter is not None:
            self._stats.add(counter)
        tier.touch(entry)
        reopen = None if check is None else functools.partial(self.refetch, bucket, key)
        return OpenedObject(fd, entry.meta.size, entry.meta.etag, None, check=check, reopen=reopen)

    def _open_shared(self, shared: SharedTier, bucket: str, key: str) -> OpenedObject | None:
        """Serve a shared-tier hit, from a local copy (``promote``) or in place (``serve``)."""
        found = self._from_shared(shared, bucket, key)
        if found is None:
            return None
        entry, local = found
        if local is not None:
            opened = self._open_entry(self._tier, local, "hits", bucket, key)
            if opened is not None:
                return opened
        return self._open_entry(shared, entry, "shared_hits", bucket, key)

    def _from_shared(
        self, shared: SharedTier, bucket: str, key: str
    ) -> tuple[CachedEntry, CachedEntry | None] | None:
        """A valid shared entry this reader may read, and its local copy if it was promoted."""
        entry = self._usable(shared, bucket, key)
        if entry is None:
            return None
        self._authorize(entry, bucket, key)
        if self._config.shared_policy != "promote":
            return entry, None
        try:
            return entry, self._promote(entry)
        except (OSError, CacheTimeoutError):
            return entry, None  # no room or no lock in the local tier: read it in place

    def _promote(self, entry: CachedEntry) -> CachedEntry:
        local = promote(entry, self._tier, self._config.lock_timeout)
        self._stats.add("promotions")
        return local

    def _authorize(self, entry: CachedEntry, bucket: str, key: str) -> None:
        """Ask the store whether this reader may read a shared entry (``shared_auth=store``).

        Another user's process may have fetched it: the bytes are served only if the store
        lets this process's credentials read the object (raises ``PermissionError`` if not).
        """
        if self._config.shared_auth_mode == "trust":
            return
        asked = self._authorized.get(entry.entry_id)
        if asked is not None and time.time() - asked < self._config.ttl:
            return
        try:
            self._store.head(bucket, key)
        except ObjectNotFoundError:
            self._drop(self._fill_tier, entry)
            raise
        self._authorized[entry.entry_id] = time.time()

    def _authorize_pending(self, entry: CachedEntry, bucket: str, key: str) -> None:
        """Ask the store whether this reader may read a write pending in the shared tier
        (``shared_auth=store``): another user's host may have written it. Served once the
        store answered this process's HEAD of the key, a 404 included (not uploaded yet: the
        store still judged the credentials); raises ``PermissionError`` on a refusal. At most
        once per ``ttl`` per object and process, as for a shared entry."""
        if self._config.shared_auth_mode == "trust":
            return
        asked = self._authorized.get(entry.entry_id)
        if asked is not None and time.time() - asked < self._config.ttl:
            return
        with contextlib.suppress(ObjectNotFoundError):
            self._store.head(bucket, key)
        self._authorized[entry.entry_id] = time.time()

    def in_flight(self, bucket: str, key: str) -> Fetch | None:
        """The fetch of this object running in this process (or publishing just now: see
        ``_joinable``), if any (prefetch reports joins)."""
        with self._flights_lock:
            fetch = self._flights.get(self.entry_id(bucket, key))
        return fetch if fetch is not None and _joinable(fetch) else None

    def hold(self, fetch: Fetch) -> int:
        """A descriptor with a shared lock on the bytes ``fetch`` brings, taken on the part file
        (which becomes the data file) so that eviction leaves the entry from the moment it is
        published; the prefetcher holds one until a reader opens the object."""
        fetch.wait_started()
        fd = fetch.open_part()
        if fd is not None:
            return fd
        return self._tier.open_data(fetch.wait_finished())  # published already: hold its data

    def wait_idle(self) -> None:
        """Wait until every fetch this process started has published (or failed)."""
        with self._flights_lock:
            running = list(self._flights.values())
        for fetch in running:
            with contextlib.suppress(Exception):
                fetch.wait_finished()
        self.blocks.wait_completions()  # block entries being made whole publish too

    def invalidate_shared(self, bucket: str, key: str) -> None:
        """Drop the shared tier's copy of an object this process is about to replace."""
        if self._shared is not None:
            self._shared.invalidate(self.entry_id(bucket, key), self._config.lock_timeout)

    def drop_clean(self, bucket: str, key: str) -> None:
        """Drop the cached copies of an object, in both tiers, that hold no pending write."""
        entry_id = self.entry_id(bucket, key)
        self._tier.drop_clean(entry_id, self._config.lock_timeout)
        if self._shared is not None:
            self._shared.drop_clean(entry_id, self._config.lock_timeout)

    def invalidate(self, bucket: str, key: str) -> None:
        """Forget a cached object (it was overwritten or deleted through this filesystem)."""
        entry_id = self.entry_id(bucket, key)
        self._tier.invalidate(entry_id, self._config.lock_timeout)
        if self._shared is not None:
            self._shared.invalidate(entry_id, self._config.lock_timeout)

    # -- validation --------------------------------------------------------------------------

    def _validate(
        self, tier: LocalTier, entry: CachedEntry, bucket: str, key: str
    ) -> CachedEntry | None:
        """The entry if the store still holds its bytes (None: it changed, and is dropped);
        raises ``ObjectNotFoundError`` (the entry dropped) if the object is gone."""
        meta = entry.meta
        if meta.state == "dirty":
            return entry  # our own write, not yet in the store: the store cannot judge it
        if self._freshness.holds(meta.validated_at):
            return entry
        vouched = self._vouched(bucket, key, meta.etag, meta.size, tier, entry.entry_id)
        if vouched == "changed":
            self._drop(tier, entry)
            return None
        if vouched == "by_head" and self._config.consistency == "ttl":
            # A listing vouches for as long as it is fresh itself: no stamp to write then.
            return tier.replace_meta(entry, replace(meta, validated_at=time.time()))
        return entry

    def vouched_for(self, entry: CachedEntry, bucket: str, key: str) -> bool:
        """Whether a clean entry may be served unasked: fresh, or its ETag and size shown by a
        fresh listing of its prefix (listed now if none is known). Drops nothing."""
        if self._freshness.holds(entry.meta.validated_at):
            return True
        listed = None if self._revalidator is None else self._revalidator.listed(bucket, key)
        return listed is not None and listed.vouches_for(entry.meta.etag, entry.meta.size)

    def _vouched(
        self, bucket: str, key: str, etag: str, size: int, tier: LocalTier, entry_id: str
    ) -> str:
        """Whether the store still holds the object with this ETag and size, per a fresh
        listing of its prefix (``ttl`` mode: one LIST for every object below it) or else a
        HEAD: ``by_listing``, ``by_head`` or ``changed``. Raises ``ObjectNotFoundError``,
        the entry dropped, if the object is gone."""
        listed = None if self._revalidator is None else self._revalidator.listed(bucket, key)
        if listed is not None:
            if not listed.exists:
                self._drop_id(tier, entry_id)
                raise ObjectNotFoundError(
                    2, "no such object (per a listing of its prefix)", source_url(bucket, key)
                )
            self._stats.add("revalidations")
            return "by_listing" if listed.vouches_for(etag, size) else "changed"
        now = time.time()
        try:
            current = self._store.head(bucket, key)
        except ObjectNotFoundError:
            self._drop_id(tier, entry_id)
            raise
        self._authorized[entry_id] = now
        self._stats.add("revalidations")
        # A size that differs from the HEAD's Content-Length means a damaged copy, whatever
        # its ETag says.
        return "by_head" if (current.etag, current.size) == (etag, size) else "changed"

    def _drop(self, tier: LocalTier, entry: CachedEntry) -> None:
        """Drop the copy a verdict was about, not a newer one another reader fetched since:
        readers that judged the same stale copy at once dropped, each in turn, the copy the
        one before them had just fetched, and fetched it yet again."""
        if tier.drop_version(entry, self._config.lock_timeout):
            self._stats.add("invalidations")

    def _drop_id(self, tier: LocalTier, entry_id: str) -> None:
        self._stats.add("invalidations")
        tier.invalidate(entry_id, self._config.lock_timeout)

    # -- fetching ----------------------------------------------------------------------------

    def refetch(self, bucket: str, key: str) -> OpenedObject:
        """Open an object through a new fetch: its cached copy failed its digest check."""
        return self._open_through_fetch(bucket, key, by_blocks=False, again=False)

    def _open_through_fetch(
        self, bucket: str, key: str, by_blocks: bool = True, again: bool = True
    ) -> OpenedObject:
        fetch = self._join_or_start(bucket, key, by_blocks=by_blocks)
        try:
            fetch.wait_started()
        except BlockModeRequiredError as big:
            return self.open_blocks(big.info)
        except OSError as exc:
            raise self.tier_full_error(exc, bucket, key) or exc from exc
        info = fetch.info  # None: satisfied by an entry another process published
        fd = None if info is None else fetch.open_part()
        try:
            if info is None or fd is None:  # or published, or stopped for blocks (range-first)
                return self._open_published(fetch, by_blocks, again)
        except BlockModeRequiredError as stopped:
            return self.open_blocks(stopped.info)
        return OpenedObject(fd, info.size, info.etag, fetch)

    def tier_full_error(self, exc: OSError, bucket: str, key: str) -> TierFullError | None:
        """A ``TierFullError`` if ``exc`` says the tier's filesystem is out of space."""
        if isinstance(exc, TierFullError) or not is_no_space(exc):
            return exc if isinstance(exc, TierFullError) else None
        self._stats.add("tier_full")
        tier = self._fill_tier
        full = tier_full(
            exc,
            f"no space left in the {tier.name} tier for s3://{bucket}/{key}; reading it "
            f"straight from the store (free space or lower {tier.name}_max_bytes)",
            tier.root,
        )
        assert isinstance(full, TierFullError)
        return full

    def _open_published(self, fetch: Fetch, by_blocks: bool, again: bool) -> OpenedObject:
        entry = fetch.wait_finished()
        bucket, key = fetch.request.bucket, fetch.request.key
        if self._shared is not None:  # promoted by the fetch, or else read in place
            # Published by whoever held the lease, maybe another user: check this reader.
            self._authorize(entry, bucket, key)
            local = self._tier.lookup(entry.entry_id, entry.meta.namespace, entry.meta.source)
            if local is not None and local.meta.etag == entry.meta.etag:
                opened = self._open_entry(self._tier, local, "hits", bucket, key)
                if opened is not None:
                    return opened
        if fetch.identity is not None:  # hashed as it streamed in: already checked
            self.verifier.trust((entry.entry_id, fetch.identity))
        opened = self._open_entry(self._fill_tier, entry, None, bucket, key)
        if opened is not None:
            return opened
        if again:  # evicted, or another process's entry failed its check: fetch it anew
            return self._open_through_fetch(bucket, key, by_blocks, again=False)
        raise CacheCorruptError(
            f"{entry.meta.source}: the cached copy vanished or failed its digest check twice"
        )

    def _join_or_start(
        self,
        bucket: str,
        key: str,
        by_blocks: bool = False,
        promote: bool = True,
        limit: int | None = None,
        start: bool = True,
    ) -> Fetch:
        """Join this process's fetch of the object, or start one (``start=False``: the new
        fetch is the caller's to run).

        ``by_blocks``: a reader asks, so a huge object stops the fetch at its first response
        and is read block by block instead; a prefetch (``warm``) fetches it whole, unless it
        is larger than ``limit``.
        """
        source = source_url(bucket, key)
        entry_id = self.entry_id(bucket, key)
        with self._flights_lock:
            running = self._flights.get(entry_id)
            if running is not None and _joinable(running):
                self._stats.add("fetches_joined")
                if not by_blocks and not running.finished:
                    running.decide(True)  # a prefetch wants it whole, whatever a reader read
                return running
            request = FetchRequest(
                bucket=bucket,
                key=key,
                source=source,
                namespace=self._store.namespace,
                entry_id=entry_id,
                part_size=self._config.range_size,
                concurrency=fetch_streams(self._config),
                governor=self._streams if self._config.fetch_concurrency is None else None,
                lock_timeout=self._config.lock_timeout,
                accept_existing=self._acceptor(time.time()),
                revalidate=functools.partial(
                    self._validate, self._fill_tier, bucket=bucket, key=key
                ),
                after_publish=self._promoter() if promote else None,
                block_threshold=(
                    self._config.block_threshold
                    if by_blocks
                    else (None if limit is None else limit + 1)
                ),
                range_first_above=self._config.range_first_above if by_blocks else None,
            )
            fetch = Fetch(
                request, self._fill_tier, self._store, self._retry, self._stats, self._landed
            )
            self._flights[entry_id] = fetch
        self._stats.add("misses")
        if start:
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

    def _promoter(self) -> Callable[[CachedEntry], None] | None:
        """With a shared tier and ``promote``: a fetch's entry is copied into the local tier."""
        if self._shared is None or self._config.shared_policy != "promote":
            return None

        def copy_to_local(entry: CachedEntry) -> None:
            self._promote(entry)

        return copy_to_local

    def _landed(self, fetch: Fetch) -> None:
        if fetch.entry is not None and fetch.identity is not None:
            self.verifier.trust((fetch.entry.entry_id, fetch.identity))
        with self._flights_lock:
            if self._flights.get(fetch.request.entry_id) is fetch:
                del self._flights[fetch.request.entry_id]


def _joinable(fetch: Fetch) -> bool:
    """Whether a fetch in the table is joined rather than started again: it is running, or it
    published a moment ago and has not left the table yet (a reader whose lookup came just
    before that publish would otherwise start a fetch that finds the entry at once, fetching
    nothing but counting a miss)."""
    return not fetch.finished or fetch.entry is not None
