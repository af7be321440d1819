"""``BlockFetcher``: fetches the blocks of block-granular entries, on demand and ahead.

One per read path. A reader asks for a byte range; the blocks it lacks are fetched in
parallel (one ranged GET each, pinned to the entry's ETag), each block once per process (a
second reader waits for the first one's GET). A sequential reader gets ``readahead_blocks``
fetched ahead of it; once ``whole_object_after`` of an object's blocks are present, the rest
is fetched in the background and the entry becomes a whole entry.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import xxhash

from tiercache import forksafe
from tiercache.config import TierCacheConfig, fetch_streams
from tiercache.digest import xxh3_file
from tiercache.errors import ObjectChangedError, StoreUnavailableError
from tiercache.read.ranges import HeldBytes, copy_range
from tiercache.stats import Stats
from tiercache.store.base import ObjectInfo, ObjectStore
from tiercache.store.retry import RetryPolicy
from tiercache.tiers.blocks import BlockEntry
from tiercache.tiers.entry import EntryMeta
from tiercache.tiers.local import LocalTier, remove_file
from tiercache.verify import Verifier


@dataclass(frozen=True)
class BlockSource:
    """Where an entry's blocks come from."""

    bucket: str
    key: str
    source: str
    namespace: str


class BlockFetcher:
    """Fetches blocks into block entries for every reader of one read path."""

    def __init__(
        self,
        config: TierCacheConfig,
        tier: LocalTier,
        store: ObjectStore,
        retry: RetryPolicy,
        stats: Stats,
        verifier: Verifier | None = None,
    ) -> None:
        self._config = config
        self._tier = tier
        self._store = store
        self._retry = retry
        self._stats = stats
        self._verifier = verifier or Verifier(stats)
        self._reset()
        forksafe.register(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, int], threading.Event] = {}
        self._completing: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None

    def after_fork(self) -> None:
        """A child has none of the parent's threads."""
        self._reset()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                workers = max(2, fetch_streams(self._config))
                self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tiercache-block")
            return self._pool

    # -- the reader's side -------------------------------------------------------------------

    def ensure(self, entry: BlockEntry, src: BlockSource, start: int, end: int) -> None:
        """Block until ``[start, end)`` of the object is in the entry."""
        if end <= start:
            return
        first, last = start // entry.meta.block_size, (end - 1) // entry.meta.block_size
        wanted = range(first, last + 1)
        if not all(entry.has(i) for i in wanted):
            entry.refresh()  # another process may have fetched them
        waits: list[threading.Event] = []
        futures: list[Future[None]] = []
        for index in wanted:
            if entry.has(index):
                continue
            event, leader = self._claim(entry, index)
            if leader:
                futures.append(self._executor().submit(self._lead, entry, src, index, event))
            else:
                waits.append(event)
        for future in futures:
            future.result()
        for event in waits:
            event.wait()
        for index in wanted:  # a leader in another reader failed: try once more ourselves
            if not entry.has(index):
                event, leader = self._claim(entry, index)
                if leader:
                    self._lead(entry, src, index, event)
                else:
                    event.wait()
                if not entry.has(index):
                    raise StoreUnavailableError(f"{src.source}: block {index} could not be fetched")

    def check(
        self, entry: BlockEntry, src: BlockSource, start: int, end: int, seen: set[int] | None
    ) -> None:
        """Check each block of ``[start, end)`` against its logged digest before it is served
        for the first time: in this file object (``seen``: ``verify="always"``), or else in
        this process (``verify="first"``). A corrupt block is fetched again over it."""
        if seen is None and self._config.verify != "first":
            return
        block = entry.meta.block_size
        for index in range(start // block, (end - 1) // block + 1):
            trust = self._trust_key(entry, index)
            if index in seen if seen is not None else self._verifier.trusts(trust):
                continue
            if entry.digest(index) == "":
                continue  # completed into a whole entry, whose own digest covers it
            lo, hi = entry.block_range(index)
            started = time.monotonic()
            passed = xxhash.xxh3_64_hexdigest(entry.pread(hi - lo, lo)) == entry.digest(index)
            self._verifier.record(passed, time.monotonic() - started)
            if not passed:
                entry.forget(index)  # corrupt on disk: fetched again over it
                self.ensure(entry, src, lo, hi)
            elif seen is None:
                self._verifier.trust(trust)
            if seen is not None:
                seen.add(index)

    @staticmethod
    def _trust_key(entry: BlockEntry, index: int) -> tuple[str, int, int, int, str | None]:
        """A block is written once where it lies in the entry's file (the file's inode), and
        its digest logged: those name the bytes checked."""
        st = os.fstat(entry.fileno())
        return (entry.entry_id, st.st_dev, st.st_ino, index, entry.digest(index))

    def read_ahead(self, entry: BlockEntry, src: BlockSource, after: int) -> None:
        """Start fetching the blocks that follow byte ``after`` (not waited for)."""
        block = entry.meta.block_size
        first = -(-after // block)
        for index in range(first, min(entry.blocks, first + self._config.readahead_blocks)):
            if entry.has(index):
                continue
            event, leader = self._claim(entry, index)
            if leader:
                self._executor().submit(self._lead_quietly, entry, src, index, event)

    def wait_completions(self, timeout: float = 60.0) -> None:
        """Wait (up to ``timeout`` seconds) until the block entries being completed in the
        background now are whole entries, or have given up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._completing:
                    return
            time.sleep(0.01)

    def maybe_complete(self, entry: BlockEntry, src: BlockSource) -> None:
        """Fetch the rest of the object in the background once enough of it has been read."""
        if not entry.blocks or entry.present_count() < self._config.whole_object_after * (
            entry.blocks
        ):
            return
        with self._lock:
            if entry.entry_id in self._completing:
                return
            self._completing.add(entry.entry_id)
        thread = threading.Thread(
            target=self._complete,
            args=(entry.entry_id, src),
            name="tiercache-complete",
            daemon=True,
        )
        thread.start()

    # -- fetching ----------------------------------------------------------------------------

    def _claim(self, entry: BlockEntry, index: int) -> tuple[threading.Event, bool]:
        key = (entry.entry_id, index)
        with self._lock:
            event = self._in_flight.get(key)
            if event is not None:
                return event, False
            event = self._in_flight[key] = threading.Event()
            return event, True

    def _lead(
        self, entry: BlockEntry, src: BlockSource, index: int, event: threading.Event
    ) -> None:
        try:
            if not entry.has(index):
                self._fetch_block(entry, src, index)
        finally:
            with self._lock:
                self._in_flight.pop((entry.entry_id, index), None)
            event.set()

    def _lead_quietly(
        self, entry: BlockEntry, src: BlockSource, index: int, event: threading.Event
    ) -> None:
        try:
            self._lead(entry, src, index, event)
        except Exception:
            self._stats.add("block_errors")  # read-ahead only: the reader fetches it again

    def _fetch_block(self, entry: BlockEntry, src: BlockSource, index: int) -> None:
        start, end = entry.block_range(index)
        self._tier.reserve(end - start)
        try:
            data = self._get(src, entry, start, end)
            entry.write_block(index, data, xxhash.xxh3_64_hexdigest(data))
        except BaseException:
            self._tier.release(end - start)
            raise
        # Written: counted as the tier's (by every process) in the step that ends the
        # reservation, not only once a scan finds the block.
        self._tier.count_published(end - start, reserved=end - start)
        self._verifier.trust(self._trust_key(entry, index))  # hashed as it arrived
        self._stats.add("blocks_fetched")
        self._stats.add("bytes_fetched", end - start)

    def _get(self, src: BlockSource, entry: BlockEntry, start: int, end: int) -> bytes:
        """One ranged GET pinned to the entry's ETag, resumed where a broken stream stopped."""
        info = ObjectInfo(src.bucket, src.key, entry.meta.size, entry.meta.etag)
        block = _BlockBuffer(start, end - start)
        copy_range(self._store, info, block, start, end, self._retry, None)
        return bytes(block.data)

    def _complete(self, entry_id: str, src: BlockSource) -> None:
        try:
            entry = self._reopen(entry_id, src)
            if entry is None:
                return
            try:
                self.ensure(entry, src, 0, entry.meta.size)  # every block still missing
                entry.refresh()
                if entry.present_count() == entry.blocks:
                    self._graduate(entry)
            finally:
                entry.close()
        except (ObjectChangedError, OSError, StoreUnavailableError):
            self._stats.add("block_errors")
        finally:
            with self._lock:
                self._completing.discard(entry_id)

    def _reopen(self, entry_id: str, src: BlockSource) -> BlockEntry | None:
        meta = BlockEntry.lookup(self._tier, entry_id, src.namespace, src.source)
        if meta is None:
            return None
        info = ObjectInfo(src.bucket, src.key, meta.size, meta.etag, meta.last_modified)
        return BlockEntry.open(
            self._tier,
            entry_id,
            info,
            src.source,
            src.namespace,
            meta.block_size,
            self._config.lock_timeout,
            create=False,  # completed or evicted since the lookup: nothing to reopen
        )

    def _graduate(self, entry: BlockEntry) -> None:
        """Every block is present: publish the file as a whole entry (with its digest)."""
        with self._tier.entry_lock(entry.entry_id, self._config.lock_timeout) as paths:
            current = BlockEntry.lookup(
                self._tier, entry.entry_id, entry.meta.namespace, entry.meta.source
            )
            if current is None or current.etag != entry.meta.etag:
                return
            size, digest = xxh3_file(entry.paths.data)
            if size != entry.meta.size:
                return
            info = ObjectInfo("", "", size, entry.meta.etag, entry.meta.last_modified)
            meta = EntryMeta.for_object(info, entry.meta.source, entry.meta.namespace, digest)
            meta = replace(meta, validated_at=entry.meta.validated_at)
            # The block entry stays whole and readable until the whole entry is published
            # (its data linked, not moved): a reader arriving meanwhile finds one or the
            # other, never neither (it fetched the object again).
            self._tier.publish(paths, entry.fileno(), meta, src=entry.paths.data, keep_src=True)
            for path in (entry.paths.meta, entry.paths.log, entry.paths.data):
                with contextlib.suppress(OSError):
                    remove_file(path)
        self._stats.add("block_entries_completed")


class _BlockBuffer:
    """A ``RangeSink`` that collects the bytes of one block in memory."""

    def __init__(self, start: int, size: int) -> None:
        self.data = bytearray(size)
        self._start = start

    def begin(self, info: ObjectInfo) -> None:
        pass  # the block's object is known already

    def next_read(self, offset: int) -> int:
        return 0  # no reader to hand chunks to: any size will do

    def awaited_end(self, start: int, end: int) -> int:
        return start  # the block is read once it is whole

    def holding(self, held: HeldBytes, holds: bool) -> None:
        pass

    def write(self, offset: int, data: memoryview | bytes) -> None:
        at = offset - self._start
        self.data[at : at + len(data)] = data
