"""``Fetch``: one object streaming from the store into a tier, readable while it arrives.

A fetch runs in its own thread so that it completes (and the entry is published) even when the
reader that started it stops early. It holds the entry's inter-process lock for its whole
life: other processes on the node wait for it and then find the published entry (checked with
a HEAD where the consistency mode wants bytes newer than that fetch's GET). The thread dies
with its process, and the kernel then releases the lock with nothing published: so a reader
gets an object's last bytes only once the fetch has released the lock (``wait_released``),
and a process that ends as soon as it has read an object leaves the object in the tier for
the processes that waited on it. The xxh3 digest is computed while the bytes stream in (parts
that arrive out of order are hashed from the file once the gap before them fills).

A reader that reads sequentially tells the fetch its position and read size; the download then
reads chunks of exactly that size, aligned to the reader's reads, and hands each chunk object to
the reader as it is written to the tier, so the reader copies nothing back from the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from tiercache.errors import CacheCorruptError
from tiercache.extents import Extents
from tiercache.read.ranges import CHUNK, HeldBytes, StreamGovernor, download
from tiercache.stats import Stats
from tiercache.store.base import ObjectInfo, ObjectStore
from tiercache.store.retry import RetryPolicy
from tiercache.tiers.entry import CachedEntry, EntryMeta, EntryPaths
from tiercache.tiers.local import LocalTier, remove_file
from tiercache.tiers.preallocate import preallocate
from tiercache.tiers.reservation import Reservation
from tiercache.verify import Identity, identity

# Read sizes handed over as whole chunks: smaller reads cost more per byte in Python than the
# copy they save; larger ones would hold too much memory per open file.
_HANDOFF_MIN = 512 * 1024
_HANDOFF_MAX = 16 * 1024 * 1024
# Seconds a range-first fetch waits for its reader's first read before fetching the rest.
_DECIDE_WITHIN = 2.0


class BlockModeRequiredError(Exception):
    """The object is big enough to be cached block by block: the whole fetch stops at once."""

    def __init__(self, info: ObjectInfo) -> None:
        super().__init__(f"{info.bucket}/{info.key}: {info.size} bytes, cached by blocks")
        self.info = info


@dataclass(frozen=True)
class FetchRequest:
    """Which object to fetch, into which entry, and how."""

    bucket: str
    key: str
    source: str
    namespace: str
    entry_id: str
    part_size: int
    concurrency: int
    lock_timeout: float
    # Accept an entry another process published while we waited for its lock.
    accept_existing: Callable[[CachedEntry], bool]
    # For an entry ``accept_existing`` refused (its GET began before this reader asked): ask
    # the store whether it still holds those bytes (a HEAD); the entry, or None if it changed
    # (the entry is dropped, and fetched anew). Called without the entry lock.
    revalidate: Callable[[CachedEntry], CachedEntry | None] | None = None
    # Runs once the entry is published (or found published), before readers are told: the
    # shared tier's fetch copies the object into the local tier here.
    after_publish: Callable[[CachedEntry], None] | None = None
    # Objects of at least this size are not fetched whole (see ``BlockModeRequiredError``).
    block_threshold: int | None = None
    # Objects of at least this size wait after their first part for the reader's first reads
    # (see ``Fetch.decide``): a reader away from the start has them read by blocks.
    range_first_above: int | None = None
    # Learns how many of ``concurrency`` streams the link pays for (None: use them all).
    governor: StreamGovernor | None = None


class Fetch:
    """An in-flight fetch; it is also the ``RangeSink`` the download writes into."""

    def __init__(
        self,
        request: FetchRequest,
        tier: LocalTier,
        store: ObjectStore,
        retry: RetryPolicy,
        stats: Stats,
        on_finish: Callable[[Fetch], None] | None = None,
    ) -> None:
        self.request = request
        self._on_finish = on_finish
        self._tier = tier
        self._store = store
        self._retry = retry
        self._stats = stats
        self._cond = threading.Condition()
        self._extents = Extents()
        self._waiting: list[tuple[int, int]] = []
        self._held: set[HeldBytes] = set()  # the streams that hold bytes for the tier file
        self._hash_lock = threading.Lock()
        self._hasher = xxhash.xxh3_64()
        self._hashed = 0
        # The attached reader's next read (offset, size; size 0: none) and the chunks read for
        # it, newest last, until it takes them.
        self._reader_next = 0
        self._reader_size = 0
        self._handoff: deque[tuple[int, bytes]] = deque(maxlen=2)
        self._fd = -1
        self._reservation: Reservation | None = None  # from ``begin``
        self._paths: EntryPaths | None = None
        # Whether ``_paths.part`` names this fetch's part file: from its creation until its
        # publish or removal begins (see ``open_part``).
        self._part_named = False
        self.info: ObjectInfo | None = None
        self.entry: CachedEntry | None = None
        # The data file this fetch published, as hashed while its bytes streamed in (None
        # when another process's entry satisfied it): this process need not check it again.
        self.identity: Identity | None = None
        self.error: BaseException | None = None
        # The entry lock is released: the entry published (or found), or the fetch failed.
        self.released = False
        self.finished = False
        # Range-first (see ``decide``): None while undecided, then True (fetch it
        # whole) or False (stop: the object is read by blocks).
        self._whole: bool | None = None
        # Set before ``run``: hold a shared lock on the bytes as the fetch creates them
        # (``pin_fd``), so that eviction leaves the entry from the moment it is published.
        self.pin = False
        self.pin_fd = -1
        self.started = False

    def start(self) -> None:
        """Run the fetch in a thread of its own (it completes even if its reader stops)."""
        self.started = True
        name = f"tiercache-fetch-{self.request.entry_id[:8]}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def run(self) -> None:
        """Run the fetch in the calling thread (a prefetch worker, which waits for it anyway:
        a thread per small object costs more than its request); ``error`` says how it ended."""
        self.started = True
        self._run()

    # -- the reader's side -------------------------------------------------------------------

    def wait_started(self) -> None:
        """Wait until bytes can be read: the part file exists, or the fetch ended.

        No timeout is needed here: the fetch thread's own waits (entry lock, store requests)
        are bounded, so it always finishes.
        """
        with self._cond:
            self._cond.wait_for(lambda: self.info is not None or self.finished)
            if self.error is not None:
                raise self.error

    def open_part(self) -> int | None:
        """A descriptor on the file this fetch writes, with a shared lock (eviction leaves the
        entry it becomes); None once the fetch publishes it or gives it up, or if it found
        another process's entry instead.

        The file's name is this fetch's only until then: once the entry lock is free, the next
        fetch of the object (this process's or another's) creates a new file under it. A reader
        that opened the name after that read the next fetch's bytes as this one's (an empty
        file: ``b''``, issue 46), so it is opened here, under the lock the publish takes first.
        """
        with self._cond:
            if not self._part_named:
                return None
            assert self._paths is not None
            try:
                fd = os.open(self._paths.part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:  # removed by the next holder of a lease this one lost
                return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def _part_unnamed(self) -> None:
        """The part file is about to be published or removed: readers open it no longer."""
        with self._cond:
            self._part_named = False

    def wait_finished(self) -> CachedEntry:
        """Block until the entry is published; raise the fetch's error."""
        with self._cond:
            self._cond.wait_for(lambda: self.finished)
        if self.error is not None:
            raise self.error
        assert self.entry is not None
        return self.entry

    def wait_released(self) -> None:
        """Block until the fetch released the entry lock: the entry is published (or was
        found published), or the fetch failed. Raises nothing: bytes already read stay good.

        Bounded as ``wait_started`` is; once every byte is in, only the publish is left.
        """
        with self._cond:
            self._cond.wait_for(lambda: self.released)

    def wait_range(self, start: int, end: int) -> None:
        """Block until ``[start, end)`` is in the part file; raise the fetch's error."""
        with self._cond:
            self._waiting.append((start, end))
            held = () if self._extents.covers(start, end) else tuple(self._held)
        try:
            for stream in held:  # bytes that arrived while their stream reads on
                stream.write_for(start, end)
            with self._cond:
                self._cond.wait_for(lambda: self.finished or self._extents.covers(start, end))
        finally:
            with self._cond:
                self._waiting.remove((start, end))
        if self.error is not None:
            raise self.error

    def expect_read(self, start: int, size: int) -> None:
        """A reader reads ``size`` bytes from ``start`` next, and likely the same size after."""
        with self._cond:
            if _HANDOFF_MIN <= size <= _HANDOFF_MAX:
                self._reader_next, self._reader_size = start, size
            else:
                self._reader_size = 0
                self._handoff.clear()

    def take(self, start: int, count: int) -> bytes | None:
        """The chunk ``[start, start + count)`` if it was read for the reader, else None."""
        with self._cond:
            for chunk in self._handoff:
                if chunk[0] == start and len(chunk[1]) == count:
                    self._handoff.remove(chunk)
                    return chunk[1]
        return None

    def detach_reader(self) -> None:
        """The reader closed: read any size again and drop the chunks kept for it."""
        self.expect_read(0, 0)

    @property
    def range_first(self) -> bool:
        """Whether this fetch waits for its reader's first reads before fetching the rest."""
        threshold = self.request.range_first_above
        info = self.info
        return (
            threshold is not None
            and info is not None
            and info.size >= threshold
            and info.size > self.request.part_size
        )

    def first_part_end(self) -> int:
        assert self.info is not None
        return min(self.request.part_size, self.info.size)

    def decide(self, whole: bool) -> bool:
        """Fetch the object whole (True) or stop after the first part (False), unless that
        was decided already; returns what stands."""
        with self._cond:
            if self._whole is None:
                self._whole = whole
                self._cond.notify_all()
            return self._whole

    def _hesitate(self, info: ObjectInfo) -> None:
        """Between the first part and the rest: wait for the reader's decision (see
        ``decide``); a reader that reads nothing for a while gets the whole object."""
        threshold = self.request.range_first_above
        if threshold is None or info.size < threshold:
            return
        with self._cond:
            if not self._cond.wait_for(lambda: self._whole is not None, _DECIDE_WITHIN):
                self._whole = True
        if not self._whole:
            raise BlockModeRequiredError(info)

    # -- the download's side (RangeSink) -----------------------------------------------------

    def next_read(self, offset: int) -> int:
        with self._cond:
            size = self._reader_size
            if not size:
                return 0
            # Chunk ends fall where the reader's reads end, so that its next read is one chunk.
            return size - (offset - self._reader_next) % size

    def begin(self, info: ObjectInfo) -> None:
        threshold = self.request.block_threshold
        if threshold is not None and info.size >= threshold:
            raise BlockModeRequiredError(info)
        self._reservation = self._tier.reservation(info.size)
        preallocate(self._fd, info.size)  # a full disk fails here, before any byte is read
        with self._cond:
            self.info = info
            self._cond.notify_all()

    def holding(self, held: HeldBytes, holds: bool) -> None:
        with self._cond:
            if holds:
                self._held.add(held)
            else:
                self._held.discard(held)

    def awaited_end(self, start: int, end: int) -> int:
        with self._cond:
            return max(
                (wanted for _, wanted in self._waiting if start < wanted <= end), default=start
            )

    def write(self, offset: int, data: memoryview | bytes) -> None:
        if self._whole is False:  # the reader went to blocks: the first part is not needed
            assert self.info is not None
            raise BlockModeRequiredError(self.info)
        written = os.pwrite(self._fd, data, offset)
        if written != len(data):
            raise OSError(f"short write to {self._paths}: {written} of {len(data)} bytes")
        self._stats.add("bytes_fetched", len(data))
        with self._cond:
            self._extents.add(offset, offset + len(data))
            size = self._reader_size
            if (
                isinstance(data, bytes)
                and len(data) == size
                and (offset - self._reader_next) % size == 0
            ):
                self._handoff.append((offset, data))
            prefix = self._extents.prefix_end()
            # Wake readers only when a range one of them waits for is complete: waking a
            # reader for every chunk costs more than the copy it then makes.
            if any(self._extents.covers(*wanted) for wanted in self._waiting):
                self._cond.notify_all()
        self._hash(offset, data, prefix)

    def _hash(self, offset: int, data: memoryview | bytes, prefix: int) -> None:
        with self._hash_lock:
            if offset == self._hashed:
                self._hasher.update(data)
                self._hashed += len(data)
            while self._hashed < prefix:  # parts that arrived before the gap closed
                chunk = os.pread(self._fd, min(CHUNK, prefix - self._hashed), self._hashed)
                self._hasher.update(chunk)
                self._hashed += len(chunk)

    # -- the fetch thread --------------------------------------------------------------------

    def _run(self) -> None:
        req = self.request
        try:
            entry = self._join_or_download()
        except BaseException as exc:
            if not isinstance(exc, BlockModeRequiredError):
                self._stats.add("fetch_errors")
            if self.pin_fd >= 0:
                os.close(self.pin_fd)
                self.pin_fd = -1
            self._finish(error=exc)
            return
        with self._cond:
            self.released = True
            self._cond.notify_all()
        if req.after_publish is not None:
            try:
                req.after_publish(entry)
            except Exception:  # the entry is published: a failed extra copy costs no read
                self._stats.add("promotion_errors")
        self._finish(entry=entry)  # after the lock is released: waiters may evict at once

    def _join_or_download(self) -> CachedEntry:
        """The entry another process published while we waited for its lock, or our own.

        An entry whose GET began before this reader opened the object is not fresh enough
        for ``consistency="always"`` (nor one older than ``ttl``): rather than fetching the
        whole object again, one waiter after the other under the lock, each waiter asks the
        store whether the entry is still current (a HEAD, outside the lock: all at once).
        """
        req = self.request
        revalidate = req.revalidate
        while True:
            with self._tier.entry_lock(req.entry_id, req.lock_timeout) as paths:
                existing = self._tier.lookup(req.entry_id, req.namespace, req.source)
                if existing is not None and not self._tier.is_intact(existing):
                    existing = None
                if existing is not None and req.accept_existing(existing):
                    self._stats.add("fetches_joined_other_process")
                    self._pin_entry(existing)
                    return existing
                if existing is None or revalidate is None:
                    self._paths = paths
                    self._fd = self._tier.create_part(paths)
                    self._part_named = True
                    if self.pin:
                        self.pin_fd = os.open(paths.part, os.O_RDONLY | os.O_CLOEXEC)
                        fcntl.flock(self.pin_fd, fcntl.LOCK_SH)
                    try:
                        return self._download_and_publish(paths)
                    finally:
                        os.close(self._fd)
            current = revalidate(existing)
            if current is not None:
                self._stats.add("fetches_joined_other_process")
                self._pin_entry(current)
                return current
            revalidate = None  # the object changed: the next turn under the lock fetches it

    def _pin_entry(self, entry: CachedEntry) -> None:
        if self.pin:
            with contextlib.suppress(FileNotFoundError):  # evicted since: nothing held
                self.pin_fd = self._tier.open_data(entry)

    def _download_and_publish(self, paths: EntryPaths) -> CachedEntry:
        req = self.request
        started = time.monotonic()
        asked_at = time.time()
        try:
            info = download(
                self._store,
                req.bucket,
                req.key,
                self,
                part_size=req.part_size,
                concurrency=req.concurrency,
                retry=self._retry,
                governor=req.governor,
                hesitate=self._hesitate if req.range_first_above is not None else None,
                hesitate_above=req.range_first_above or 0,
            )
            with self._cond:
                arrived = self._extents.prefix_end()
            self._hash(-1, b"", arrived)
            if self._hashed != info.size or os.fstat(self._fd).st_size != info.size:
                raise CacheCorruptError(
                    f"{req.source}: fetched {self._hashed} bytes, the store said {info.size}"
                )
            meta = EntryMeta.for_object(
                info, req.source, req.namespace, self._hasher.hexdigest(), asked_at
            )
            # The reservation ends as the entry counts as published, in one step: the bytes
            # count once all along (see ``LocalTier.publish``).
            assert self._reservation is not None  # ``begin`` came first
            self._part_unnamed()
            entry = self._reservation.publish(paths, self._fd, meta)
            self.identity = identity(os.fstat(self._fd))
        except BaseException:
            self._part_unnamed()
            with contextlib.suppress(OSError):  # never mask the error being raised
                remove_file(paths.part)
            raise
        finally:
            if self._reservation is not None:
                self._reservation.release()
        self._stats.add("fetches")
        self._stats.add_time("fetch_seconds", time.monotonic() - started)
        return entry

    def _finish(self, entry: CachedEntry | None = None, error: BaseException | None = None) -> None:
        with self._cond:
            self.entry = entry
            self.error = error
            self.released = True
            self.finished = True
            self._cond.notify_all()
        if self._on_finish is not None:
            self._on_finish(self)
