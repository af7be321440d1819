"""``LocalTier``: a directory with a byte budget holding published entries, evicted by LRU.

Where read orders are known, eviction goes by next use instead (``tiers/next_use.py``).

On-disk layout (all names derived from a SHA-256 of store namespace and source URL, so any S3
key is storable and nothing can land outside the root)::

    ROOT/objects/ab/<64 hex>.data   the object's bytes
    ROOT/objects/ab/<64 hex>.meta   EntryMeta JSON; its mtime is the entry's last access
    ROOT/objects/ab/<64 hex>.lock   flock: held by whoever fetches, publishes or evicts it
    ROOT/objects/ab/<64 hex>.part   bytes of a fetch in progress
    ROOT/objects/ab/<64 hex>.pin    present while the entry is pinned (never evicted)
    ROOT/staging/                   files being written before they are uploaded
    ROOT/ledger                     bytes reserved and published by the node's processes

An entry is published when both data and meta exist and agree on the size. Readers hold a
shared ``flock`` on the data file while it is open, so eviction skips it.

The budget is one for the node: every process of the tier counts the others' fetches in
flight and publications through ``ROOT/ledger`` (``tiers/ledger.py``), and eviction makes
room against that total. What the tier holds stays at or below the budget plus the entries
eviction may not take at that moment: open, pinned (prefetched), dirty or kept.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import functools
import hashlib
import itertools
import math
import os
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from tiercache import forksafe
from tiercache.digest import xxh3_file
from tiercache.errors import TierDirError
from tiercache.stats import Stats
from tiercache.tiers.entry import (
    CachedEntry,
    EntryMeta,
    EntryPaths,
    current_boot_id,
    install,
    prepare_file,
    read_meta,
    write_atomically,
)
from tiercache.tiers.ledger import Ledger, ledger_at
from tiercache.tiers.locks import is_shared_locked, lock, try_lock, unlock
from tiercache.tiers.next_use import NextUse
from tiercache.tiers.reservation import Reservation

_SCAN_REUSE_SECONDS = 1.0


@dataclass
class EvictionReport:
    """What an eviction pass removed and what it had to keep."""

    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    kept_busy: int = 0
    kept_pinned: int = 0
    usage_after: int = 0
    # Bytes the pass counted besides what its scan found (``less_reserved``): fetches in
    # flight on the node, and entries published while the scan ran.
    unseen: int = 0


@dataclass(frozen=True)
class BlockPaths:
    """The files of a block-granular entry (see ``tiers/blocks.py``)."""

    data: str
    log: str
    meta: str


def _keep_none(meta: EntryMeta) -> bool:
    return False


# Publications of this process an eviction pass can tell apart from what its scan saw.
_PUBLICATIONS_KEPT = 4096


@dataclass(frozen=True)
class _ScanRow:
    entry_id: str
    size: int
    last_access: float
    pinned: bool = False


class LocalTier:
    """A cache tier on a node-local directory."""

    name = "local"

    def __init__(
        self,
        root: str,
        max_bytes: int,
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
        *,
        high_watermark: float = 1.0,
        low_watermark: float = 0.95,
        min_free_bytes: int = 0,
        ledger: Ledger | None = None,
        stats: Stats | None = None,
        keep: Callable[[EntryMeta], bool] | None = None,
        next_use: NextUse | None = None,
    ):
        """``ledger``: where the node's processes count their fetches in flight (default:
        ``ROOT/ledger``, see ``tiers/ledger.py``). ``stats``: where evictions are counted.
        ``keep``: entries eviction must leave alone besides dirty and open ones (the newest
        checkpoints). ``next_use``: read orders that rank eviction by next use (none for a
        shared tier, whose entries serve other hosts' readers)."""
        self.max_bytes = max_bytes
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark
        self.min_free_bytes = min_free_bytes
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        make_tier_root(root, dir_mode, f"{self.name}_dir")
        self.root = os.path.realpath(root)
        self.objects_dir = make_tier_dir(self.root, "objects", dir_mode)
        self.staging_dir = make_tier_dir(self.root, "staging", dir_mode)
        # Shard directories known to exist as real directories: those already there (one
        # listing, not a mkdir and a walk of the path each, which cost a metadata round
        # trip apiece on a shared filesystem), then each one made here.
        self._shards_ready: set[str] = _real_subdirectories(self.objects_dir)
        self._paths: dict[str, EntryPaths] = {}
        # Parsed metadata by path, with the identity of the file it was read from: a warm
        # open looks an entry up more than once (prefetch, then its reader), and one stat
        # costs less than opening, reading and parsing the file again.
        self._metas: dict[str, tuple[tuple[int, int, int, int], EntryMeta]] = {}
        self.boot_id = current_boot_id()
        self.keep: Callable[[EntryMeta], bool] = keep or _keep_none
        self.next_use = next_use
        self.stats = stats
        self._lock = threading.Lock()
        self._room_lock = threading.Lock()  # one ``make_room`` at a time: check, then reserve
        self._claims: dict[int, int] = {}  # claim -> bytes (``make_room``), oldest first
        self._claim_ids = itertools.count(1)
        # When a scan was made, the published bytes it found, and the ledger's running sum
        # of publications before it began (``_cache_scan``).
        self._scan_cache: tuple[float, int, int] | None = None
        self._scanning = False  # a thread is scanning for ``usage``
        self.ledger = ledger or ledger_at(os.path.join(self.root, "ledger"), file_mode)
        # This process's latest publications, numbered: (number, entry id, bytes). An eviction
        # pass knows which of those its scan saw, and counts them once (see ``evict``).
        self._publications: deque[tuple[int, str, int]] = deque(maxlen=_PUBLICATIONS_KEPT)
        self._publication_count = 0
        forksafe.register(self)

    def after_fork(self) -> None:
        """Reservations belong to the parent's fetches; a child starts with none."""
        self._lock = threading.Lock()
        self._room_lock = threading.Lock()
        self._claims = {}
        self._scanning = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r}, max_bytes={self.max_bytes})"

    # -- naming ------------------------------------------------------------------------------

    @staticmethod
    def entry_id(namespace: str, bucket: str, key: str) -> str:
        """The hash that names an entry's files (NUL cannot occur in a bucket name or a key)."""
        return _entry_id(namespace, bucket, key)

    def paths(self, entry_id: str) -> EntryPaths:
        known = self._paths.get(entry_id)
        if known is not None:
            return known
        if not _ENTRY_ID.fullmatch(entry_id):
            raise ValueError(f"not an entry id: {entry_id!r}")
        shard = os.path.join(self.objects_dir, entry_id[:2])
        if shard not in self._shards_ready:
            self._make_shard(shard)
            self._shards_ready.add(shard)
        base = os.path.join(shard, entry_id)
        paths = EntryPaths(base + ".data", base + ".meta", base + ".lock", base + ".part")
        if len(self._paths) >= _METAS_KEPT:
            self._paths.clear()
        self._paths[entry_id] = paths  # an open names its entry several times
        return paths

    def _make_shard(self, shard: str) -> os.stat_result:
        """Make a shard directory of ``objects/`` (or find it made) and check that it is a
        real directory. A real directory named in the checked ``objects/`` cannot lead out of
        the tier, so one ``lstat`` stands for a walk of the whole path (a metadata round trip
        per component on a shared filesystem)."""
        try:
            os.mkdir(shard, self.dir_mode)
        except FileExistsError:
            pass
        st = os.lstat(shard)
        if not stat.S_ISDIR(st.st_mode):
            raise PermissionError(13, "tier directory is a symlink or escapes the tier root", shard)
        return st

    # -- lookups -----------------------------------------------------------------------------

    def lookup(self, entry_id: str, namespace: str, source: str) -> CachedEntry | None:
        """Return the published entry for ``source``, or None (missing, torn or foreign)."""
        paths = self.paths(entry_id)
        meta = self._read_meta(paths.meta)
        if meta is None or meta.source != source or meta.namespace != namespace:
            return None
        return CachedEntry(entry_id, paths, meta)

    def _read_meta(self, path: str) -> EntryMeta | None:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        # Metadata is replaced by rename, never rewritten in place: a new file, a new identity.
        identity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._metas.get(path)
        if known is not None and known[0] == identity:
            return known[1]
        meta = read_meta(path)
        if meta is not None:
            self._remember_meta(path, identity, meta)
        return meta

    def _remember_meta(
        self, path: str, identity: tuple[int, int, int, int], meta: EntryMeta
    ) -> None:
        if len(self._metas) >= _METAS_KEPT:
            self._metas.clear()
        self._metas[path] = (identity, meta)

    def open_data(self, entry: CachedEntry) -> int:
        """Open an entry's data for reading, holding a shared lock that keeps it from eviction.

        Raises FileNotFoundError when the entry vanished or its size disagrees with its meta.
        """
        try:
            fd = os.open(entry.paths.data, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            # A symlink planted in the tier is never followed; the entry is fetched again.
            raise FileNotFoundError(2, "cache entry is a symlink", entry.paths.data) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.fstat(fd).st_size != entry.meta.size:
                raise FileNotFoundError(2, "cache entry is torn", entry.paths.data)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def is_intact(self, entry: CachedEntry) -> bool:
        """True if the entry's data is a regular file of the size its metadata records."""
        try:
            st = os.stat(entry.paths.data, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == entry.meta.size

    def needs_check(self, entry: CachedEntry) -> bool:
        """True if the entry was published before the last kernel boot (it may be torn)."""
        return entry.meta.boot_id != self.boot_id

    def check_digest(self, entry: CachedEntry) -> CachedEntry | None:
        """Verify an entry's bytes against its xxh3 digest; re-stamp it, or drop it if corrupt."""
        try:
            size, digest = xxh3_file(entry.paths.data)
        except OSError:
            return None
        if (size, digest) != (entry.meta.size, entry.meta.digest):
            return None
        if entry.meta.boot_id == self.boot_id:
            return entry
        return self.replace_meta(entry, dataclasses.replace(entry.meta, boot_id=self.boot_id))

    def drop_version(self, entry: CachedEntry, timeout: float) -> bool:
        """Drop a clean entry judged bad (it failed its digest check, or the store changed
        since its bytes were fetched); True if it was dropped.

        Under the entry lock, and only if the entry is still that clean version: a write
        published meanwhile (dirty: the only copy of its bytes) must not go with it, nor a
        newer version another reader fetched after the verdict.
        """
        with self.entry_lock(entry.entry_id, timeout) as paths:
            meta = read_meta(paths.meta)
            old = entry.meta
            if meta is None or meta.state != "clean" or old.state != "clean":
                return False
            if (meta.digest, meta.etag, meta.size) != (old.digest, old.etag, old.size):
                return False
            for path in entry_files(paths):
                remove_file(path)
            return True

    def touch(self, entry: CachedEntry) -> None:
        """Record an access (the meta file's mtime is the LRU clock).

        The time is set here rather than left to the kernel, so that the parse of this meta
        kept by ``_read_meta`` is kept under its new mtime: left to the kernel, every warm
        open changed the identity it is kept under, and the next open parsed the JSON again
        (a quarter of a warm open through the mount). Only the parse of the file this entry
        was read from is re-keyed: one renamed over it meanwhile has another inode.
        """
        path = entry.paths.meta
        now = time.time_ns()
        try:
            os.utime(path, ns=(now, now), follow_symlinks=False)
        except OSError:
            return  # evicted meanwhile: nothing to record
        known = self._metas.get(path)
        if known is not None and known[1] is entry.meta:
            dev, ino, _, size = known[0]
            self._metas[path] = ((dev, ino, now, size), entry.meta)

    def replace_meta(self, entry: CachedEntry, meta: EntryMeta) -> CachedEntry:
        """Rewrite an entry's metadata (after a revalidation)."""
        write_atomically(entry.paths.meta, meta.to_json(), self.file_mode, durable=False)
        return CachedEntry(entry.entry_id, entry.paths, meta)

    # -- fetch and publish -------------------------------------------------------------------

    @contextmanager
    def entry_lock(self, entry_id: str, timeout: float) -> Iterator[EntryPaths]:
        """Hold the entry's inter-process lock (fetch, publish, invalidate, evict)."""
        paths = self.paths(entry_id)
        fd = lock(paths.lock, self.file_mode, timeout, "fetching the same object")
        try:
            yield paths
        finally:
            unlock(fd)

    def create_part(self, paths: EntryPaths) -> int:
        """Create the part file afresh (a dead fetcher's leftover goes); hold the entry lock."""
        try:
            return create_exclusive(paths.part, self.file_mode)
        except FileExistsError:
            remove_file(paths.part)
            return create_exclusive(paths.part, self.file_mode)

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
    ) -> CachedEntry:
        """Make the part file (or the staged file ``src``) the entry's data; hold the entry lock.

        The meta is removed first and written last, so a crash at any point leaves the old
        entry, no entry, or the new one. A clean entry is fsynced only where there is no boot
        id to detect a power loss with (see ``current_boot_id``); ``durable`` (dirty data
        that exists nowhere else, already fsynced by the writer) fsyncs meta and directory.
        ``keep_src``: ``src`` stays where it is, linked as the data (where the filesystem has
        hard links), so that what it belongs to stays readable until its owner removes it.
        ``prepared_meta``: ``meta`` written already by ``prepare_meta``. ``meta_absent``: the
        caller found no meta file under the entry lock (nothing to remove first).
        ``reserved``: the bytes ``reserve`` counted for this fetch, released in the step that
        counts the entry as published (on failure they stay reserved: the caller releases
        them). Released before, the bytes counted nowhere while the entry was being
        published, and fetches that began meanwhile took the tier over its budget by as many
        objects as were being published at once.
        """
        if not self.boot_id:
            os.fsync(fd)
            durable = True
        meta = dataclasses.replace(meta, boot_id=self.boot_id)
        # The new metadata is written before the old entry is touched: a full disk fails
        # here and leaves the old entry as it was.
        tmp_meta = prepared_meta or self.prepare_meta(paths, meta, durable)
        try:
            if not meta_absent:
                remove_file(paths.meta)
            if not (keep_src and src is not None and _link_over(src, paths.data)):
                os.rename(src or paths.part, paths.data)
        except BaseException:
            remove_file(tmp_meta)
            raise
        install(tmp_meta, paths.meta)
        if durable:
            fsync_dir(os.path.dirname(paths.data))
        with suppress(OSError):  # its reader (often another thread, at once) parses nothing
            st = os.stat(paths.meta, follow_symlinks=False)
            self._remember_meta(
                paths.meta, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size), meta
            )
        entry_id = os.path.basename(paths.data)[:64]
        with self._lock:  # counted and noted in one step (see ``evict``)
            self.count_published(meta.size, reserved)
            self._publication_count += 1
            self._publications.append((self._publication_count, entry_id, meta.size))
        return CachedEntry(entry_id, paths, meta)

    def count_published(self, nbytes: int, reserved: int = 0) -> None:
        """``nbytes`` now take the tier's space as published bytes (an entry, or a pending
        write's journal copy), and ``reserved`` of this process's reservation is released in
        the same step, in the node's ledger: every process's ``usage`` counts them, whether
        or not a scan running now saw them."""
        self.ledger.published(nbytes, reserved)

    def prepare_meta(self, paths: EntryPaths, meta: EntryMeta, durable: bool) -> str:
        """Write ``meta`` to a temp file beside the entry's meta file, for ``publish`` to
        install (a committer writes it while its bytes are still being fsynced)."""
        meta = dataclasses.replace(meta, boot_id=self.boot_id)
        return prepare_file(paths.meta, meta.to_json(), self.file_mode, durable=durable)

    def staging_path(self, entry_id: str) -> str:
        """A fresh path in the staging area, on the tier's filesystem (renames are atomic)."""
        return os.path.join(self.staging_dir, f"{entry_id}.{os.getpid()}.{time.monotonic_ns()}")

    def invalidate(self, entry_id: str, timeout: float) -> None:
        """Drop an entry (its object changed or was deleted)."""
        with self.entry_lock(entry_id, timeout) as paths:
            for path in entry_files(paths):
                remove_file(path)

    def drop_clean(self, entry_id: str, timeout: float) -> None:
        """Drop an entry unless it holds a pending write (``dirty``: its record decides)."""
        with self.entry_lock(entry_id, timeout) as paths:
            meta = read_meta(paths.meta)
            if meta is not None and meta.state == "dirty":
                return
            for path in entry_files(paths):
                remove_file(path)

    # -- space -------------------------------------------------------------------------------

    def usage(self, fresh: bool = False, max_age: float = _SCAN_REUSE_SECONDS) -> int:
        """Bytes held by the tier's entries and fetches in progress, by every process.

        ``fresh`` scans now and counts every part file on disk. Otherwise: published entries
        as scanned at most ``max_age`` seconds ago, plus what any process of the node
        published since (the ledger's running sum; evictions since count only in the next
        scan: usage may run over, never under), plus the bytes the node's processes reserved
        for their fetches (``tiers/ledger.py``). A part file is never counted twice, as on
        disk and as reserved: that started eviction early and took published entries.
        Reading the ledger is reading memory: a usage served from a kept scan makes no
        system call.
        """
        if fresh:
            entries = sum(row.size for row in self._scan(sizes_only=True))
            return entries + self.staging_bytes() + self.unpublished_bytes()
        with self._lock:
            cached = self._scan_cache
            if cached is not None and (
                time.monotonic() - cached[0] < max_age or self._scanning
            ):  # fresh, or another thread is scanning: its predecessor serves meanwhile
                published, reserved = self.ledger.totals()
                return cached[1] + published - cached[2] + reserved
            self._scanning = True
        try:
            before = self.ledger.totals()[0]
            scanned = sum(row.size for row in self._scan(count_parts=False, sizes_only=True))
            scanned += self.staging_bytes() + self.unpublished_bytes()
            self._cache_scan(scanned, before)
        finally:
            with self._lock:
                self._scanning = False
        # Read after the scan: a fetch published meanwhile is no longer reserved, and counts
        # as published since ``before`` (and maybe in the scan too: over, never under).
        published, reserved = self.ledger.totals()
        return scanned + published - before + reserved

    def staging_bytes(self) -> int:
        """Bytes of files being written (or left by killed writers until ``fsck`` removes
        them): they take the tier's space as much as its entries do."""
        total = 0
        try:
            items = list(os.scandir(self.staging_dir))
        except FileNotFoundError:
            return 0
        for item in items:
            with suppress(FileNotFoundError):
                total += item.stat(follow_symlinks=False).st_blocks * 512
        return total

    def unpublished_bytes(self) -> int:
        """Bytes of pending writes held only by the upload journal (``ROOT/journal``): a tier
        that publishes a pending write's entry when first asked for it (``SharedTier``) keeps
        them there until then. A journal copy linked from an entry is counted as the entry."""
        names: dict[int, int] = {}  # inode -> its names in the journal
        files: dict[int, os.stat_result] = {}
        try:
            items = list(os.scandir(os.path.join(self.root, "journal")))
        except FileNotFoundError:
            return 0
        for item in items:
            if not item.name.endswith((".bytes", ".up.claimed")):
                continue
            with suppress(FileNotFoundError):
                st = item.stat(follow_symlinks=False)
                names[st.st_ino] = names.get(st.st_ino, 0) + 1
                files[st.st_ino] = st
        return sum(st.st_size for ino, st in files.items() if st.st_nlink <= names[ino])

    def _cache_scan(self, published: int, published_before: int) -> None:
        """Keep a scan's total with the ledger's running sum of publications from before it
        began: ``usage`` adds every publication since, by any process (those made while the
        scan ran, which it may or may not have seen, count twice rather than not at all, so
        that usage may run over, never under, and eviction starts early rather than late).

        Dropping such a scan instead made every fetch scan the whole tier while others
        published: the cost of a small object grew with the number of objects cached."""
        with self._lock:
            self._scan_cache = (time.monotonic(), published, published_before)

    def fill_limit(self) -> int:
        """Bytes of entries the tier holds before fetching one more starts eviction."""
        return int(self.max_bytes * self.high_watermark)

    def reserve(self, nbytes: int) -> None:
        """Make room for ``nbytes`` about to be fetched; count them until ``release``.

        The bytes are reserved in the node's ledger first, then room is made against every
        process's reservations: two processes reserving at once both see both, so neither
        fetches into room the other promised. Eviction starts when usage would pass the high
        watermark (or free space would drop below ``min_free_bytes``) and goes down to the
        low watermark, so that a stream of fetches does not scan the tier for every object.
        """
        with self._lock:
            # A prefetch's room (``make_room``) counts already: taken over, not counted twice
            # (which fetch's it was does not matter, the bytes reserved come out the same).
            claim = next(iter(self._claims), None)
            taken = 0 if claim is None else self._claims.pop(claim)
        self.ledger.reserve(nbytes - taken)
        free_short = self.free_shortfall(nbytes)
        if self.usage() > self.max_bytes * self.high_watermark or free_short:
            # Part files of fetches in flight are reserved already: counting them again made
            # concurrent fetches evict up to their own size twice over.
            self.evict(
                int(self.max_bytes * self.low_watermark),
                free_needed=free_short,
                count_parts=False,
                start_above=self.fill_limit(),
                less_reserved=True,
            )

    def free_shortfall(self, nbytes: int) -> int:
        """Bytes to free so that writing ``nbytes`` leaves ``min_free_bytes`` free on disk."""
        if not self.min_free_bytes:
            return 0
        st = os.statvfs(self.root)
        return max(0, self.min_free_bytes + nbytes - st.f_bavail * st.f_frsize)

    def make_room(self, nbytes: int, floor: float) -> int | None:
        """Reserve ``nbytes`` about to be prefetched, evicting only entries in no known order
        or read no sooner than ``floor`` (see ``NextUse``); None, reserving nothing, if that
        cannot be had. Else a claim, that the next ``reserve`` takes over: until then another
        fetch's ``reserve`` would see the room free and evict with no floor. ``drop_claim``
        once the fetch has started (or will not).

        Reserved before room is looked for, as ``reserve`` does: a process deciding at the
        same moment sees these bytes, and this one its."""
        with self._room_lock:
            with self._lock:
                claim = next(self._claim_ids)
                self._claims[claim] = nbytes
            self.ledger.reserve(nbytes)
            if self.usage() > self.fill_limit():
                target = int(self.max_bytes * self.low_watermark)
                report = self.evict(target, count_parts=False, floor=floor, less_reserved=True)
                if report.usage_after + report.unseen > self.fill_limit():
                    self.drop_claim(claim)
                    return None
            return claim

    def drop_claim(self, claim: int) -> None:
        """Give back a claim no ``reserve`` took over."""
        with self._lock:
            nbytes = self._claims.pop(claim, 0)
        self.ledger.release(nbytes)

    def reservation(self, nbytes: int) -> Reservation:
        """``reserve`` ``nbytes`` for one entry, handed to it as it is published (see
        ``Reservation``)."""
        return Reservation(self, nbytes)

    def release(self, nbytes: int) -> None:
        """The reserved bytes are now published (and counted by ``usage``) or abandoned."""
        self.ledger.release(nbytes)

    def evict(
        self,
        target_bytes: int,
        dry_run: bool = False,
        free_needed: int = 0,
        count_parts: bool = True,
        floor: float | None = None,
        start_above: int | None = None,
        less_reserved: bool = False,
    ) -> EvictionReport:
        """Remove clean entries until usage is at most ``target_bytes`` (and at least
        ``free_needed`` bytes were freed): least recently used first or, where read orders
        are known (``next_use``), those in no order first, then the ones read furthest ahead
        (none read sooner than ``floor`` objects ahead, if given).

        Entries that are pinned, open (a reader's shared lock), being fetched or published
        (the entry lock), dirty, or chosen by ``keep`` (the newest checkpoints) are kept, and
        so are those this process's prefetch is about to pin.

        ``start_above``: remove nothing unless this pass's own scan finds usage above it (a
        cached usage may count a concurrent publish twice: it only suggests a pass).
        ``less_reserved``: both bounds less what the scan cannot show (``unseen``): the bytes
        every process of the node reserved for its fetches, as reserved once the scan is done,
        and the entries published while it ran that it did not see (a fetch's bytes stop being
        reserved as its publication is counted, after its rename). This process knows which of
        its own publications the scan saw; another process's, seen by the scan, count twice
        for that moment, and eviction goes early rather than late; none goes uncounted.
        """
        with self._lock:  # as ``publish`` counts and notes a publication
            before = self.ledger.totals()[0]
            mark = self._publication_count
        rows = sorted(self._scan(count_parts), key=lambda r: r.last_access)
        hints = self.next_use
        ranked, known = (rows, {}) if hints is None else hints.rank(rows)
        usage = sum(r.size for r in rows)
        report = EvictionReport()
        busy: set[str] = set()
        if less_reserved:
            published, reserved = self.ledger.totals()
            seen = self._published_since(mark, rows)
            report.unseen = reserved + published - before - seen
            target_bytes = max(0, target_bytes - report.unseen)
            start_above = None if start_above is None else start_above - report.unseen
        if (
            start_above is not None
            and not free_needed
            and (usage + self.staging_bytes() <= start_above)
        ):
            ranked = []
        for row in ranked:
            if usage <= target_bytes and report.removed_bytes >= free_needed:
                break
            if floor is not None and known.get(row.entry_id, math.inf) < floor:
                break  # ranked: every row after this one is read sooner still
            protected = hints is not None and hints.is_protected(row.entry_id)
            if row.pinned:
                report.kept_pinned += 1
            elif not protected and (freed := self._evict_one(row, dry_run)) is not None:
                usage -= row.size
                report.removed.append(row.entry_id)
                report.removed_bytes += freed
            else:
                report.kept_busy += 1
                busy.add(row.entry_id)
        report.usage_after = usage
        if self.stats is not None and report.removed and not dry_run:
            self.stats.add("evictions", len(report.removed))
            self.stats.add("bytes_evicted", report.removed_bytes)
        if hints is not None and not dry_run and known:
            hints.account(
                rows,
                known,
                report.removed,
                report.removed_bytes,
                lambda entry_id: entry_id in busy or is_shared_locked(self.paths(entry_id).data),
            )
        if count_parts or dry_run:  # the cache holds published entries only (see ``usage``)
            with self._lock:
                self._scan_cache = None
        else:
            self._cache_scan(usage, before)
        return report

    def _published_since(self, mark: int, rows: list[_ScanRow]) -> int:
        """Bytes of this process's publications after number ``mark`` that ``rows`` (a scan)
        hold; 0 if some of those are no longer noted (then none is taken off)."""
        with self._lock:
            since = [p for p in self._publications if p[0] > mark]
        if not since or since[0][0] != mark + 1:
            return 0
        scanned = {row.entry_id for row in rows}
        return sum(nbytes for _, entry_id, nbytes in since if entry_id in scanned)

    def _evict_one(self, row: _ScanRow, dry_run: bool) -> int | None:
        """Remove one entry, if nothing holds it; the bytes that freed (measured under the
        entry's lock: a fetch may have published it since the scan), or None if kept."""
        paths = self.paths(row.entry_id)
        held = self._try_entry_lock(paths)
        if held is None:
            return None
        try:
            meta = read_meta(paths.meta)
            if meta is not None and (meta.state == "dirty" or self.keep(meta)):
                return None
            blocks = block_paths(paths)
            if (
                is_shared_locked(paths.data)
                or is_shared_locked(blocks.data)
                or os.path.exists(pin_path(paths))
            ):
                return None
            if dry_run:
                return row.size
            present = [path for path in entry_files(paths) if os.path.lexists(path)]
            freed = _entry_bytes(paths.data, blocks.data)
            for path in present:
                remove_file(path)
            freed += self._remove_parts(paths)
            if not present and not freed:
                return None  # another pass removed it since the scan
            return freed
        finally:
            self._release_entry_lock(paths, held, removed=not dry_run)

    def _try_entry_lock(self, paths: EntryPaths) -> object | None:
        return try_lock(paths.lock, self.file_mode)

    def _release_entry_lock(self, paths: EntryPaths, held: object, removed: bool) -> None:
        if removed:
            remove_file(paths.lock)  # waiters on the old inode notice and retry (try_lock)
        assert isinstance(held, int)
        unlock(held)

    def _remove_parts(self, paths: EntryPaths) -> int:
        """Remove the entry's part files (a dead fetcher's); the bytes they took."""
        try:
            size = os.stat(paths.part, follow_symlinks=False).st_size
        except OSError:
            return 0
        remove_file(paths.part)
        return size

    # -- pins --------------------------------------------------------------------------------

    def pin(self, entry_id: str) -> None:
        """Keep the entry (present or future) from eviction until ``unpin``."""
        path = pin_path(self.paths(entry_id))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, self.file_mode)
        os.close(fd)

    def unpin(self, entry_id: str) -> None:
        remove_file(pin_path(self.paths(entry_id)))

    def is_pinned(self, entry_id: str) -> bool:
        return os.path.exists(pin_path(self.paths(entry_id)))

    def _scan(self, count_parts: bool = True, sizes_only: bool = False) -> list[_ScanRow]:
        """One row per entry: data bytes (plus any part file) and last access (not read
        with ``sizes_only``: a usage needs no access times, and half the stats)."""
        rows: dict[str, list[float]] = {}
        pinned: set[str] = set()
        try:
            shards = list(os.scandir(self.objects_dir))
        except FileNotFoundError:
            return []
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            for item in os.scandir(shard.path):
                name, _, suffix = item.name.partition(".")
                kind = suffix.partition(".")[0]  # a shared tier's part files carry a token
                if kind == "pin":
                    pinned.add(name)
                    continue
                if kind not in _SCANNED or kind not in ("part", suffix):
                    continue
                if kind == "part" and not count_parts:
                    continue
                if sizes_only and kind in ("meta", "blkmeta", "blkmap"):
                    continue
                try:
                    st = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                row = rows.setdefault(name, [0.0, 0.0])
                if kind in ("meta", "blkmeta"):
                    row[1] = max(row[1], st.st_mtime)
                elif kind == "blk":
                    row[0] += st.st_blocks * 512  # sparse: only the blocks fetched take space
                elif kind != "blkmap":
                    row[0] += st.st_size
        return [_ScanRow(k, int(v[0]), v[1], k in pinned) for k, v in rows.items() if len(k) == 64]


_SCANNED = ("data", "meta", "part", "blk", "blkmap", "blkmeta")


def _entry_bytes(data: str, blocks: str) -> int:
    """The space an entry's data takes, as ``_scan`` counts it (a block file's sparse blocks)."""
    size = 0
    with suppress(OSError):
        size += os.stat(data, follow_symlinks=False).st_size
    with suppress(OSError):
        size += os.stat(blocks, follow_symlinks=False).st_blocks * 512
    return size


_ENTRY_ID = re.compile("[0-9a-f]{64}")


def block_paths(paths: EntryPaths) -> BlockPaths:
    base = paths.data[: -len(".data")]
    return BlockPaths(base + ".blk", base + ".blkmap", base + ".blkmeta")


def entry_files(paths: EntryPaths) -> tuple[str, ...]:
    """The files of a published entry, whole or by blocks; each metadata file before its data."""
    blocks = block_paths(paths)
    return (paths.meta, paths.data, blocks.meta, blocks.log, blocks.data)


def pin_path(paths: EntryPaths) -> str:
    return paths.data[: -len(".data")] + ".pin"


_METAS_KEPT = 1 << 14


def _link_over(src: str, dst: str) -> bool:
    """Make ``dst`` a hard link to ``src``, replacing it atomically; False where the
    filesystem has no hard links (the caller renames instead)."""
    tmp = f"{dst}.{os.getpid()}.{threading.get_ident()}.link"
    remove_file(tmp)
    try:
        os.link(src, tmp)
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            return False
        raise
    try:
        os.rename(tmp, dst)
    except BaseException:
        remove_file(tmp)
        raise
    return True


@functools.lru_cache(maxsize=1 << 16)
def _entry_id(namespace: str, bucket: str, key: str) -> str:
    # Remembered: an open of a warm object names its entry several times (tier, metadata,
    # prefetch, hints), a SHA-256 each.
    raw = f"{namespace}\0{bucket}\0{key}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()


def create_exclusive(path: str, mode: int) -> int:
    """Create ``path`` (never following a link) with exactly ``mode``; open it read-write."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    os.fchmod(fd, mode)
    return fd


def remove_file(path: str) -> None:
    """Unlink ``path`` if it exists."""
    with suppress(FileNotFoundError):
        os.unlink(path)


def fsync_dir(path: str) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _real_subdirectories(path: str) -> set[str]:
    """The directories directly in ``path`` (a checked tier directory); symlinks excluded."""
    try:
        with os.scandir(path) as entries:
            return {e.path for e in entries if e.is_dir(follow_symlinks=False)}
    except FileNotFoundError:
        return set()


def make_tier_root(root: str, mode: int, option: str) -> None:
    """Make the tier's directory and its ``objects`` and ``staging`` if missing; a
    ``TierDirError`` that names ``option``, the path and what is in the way if they cannot
    be (a bare ``OSError`` would name neither the option nor which part of the path)."""
    try:
        os.makedirs(root, mode=mode, exist_ok=True)
        for name in ("objects", "staging"):
            with suppress(FileExistsError):  # ``make_tier_dir`` then checks what is there
                os.mkdir(os.path.join(root, name), mode)
    except OSError as exc:
        raise TierDirError(
            exc.errno,
            f"{option} {root} cannot be created or used: {_in_the_way(root, exc)}; set {option} "
            f"(TIERCACHE_{option.upper()}, --{option.replace('_', '-')}) to a directory this "
            "user can create and write",
            exc.filename or root,
        ) from exc


def _in_the_way(root: str, exc: OSError) -> str:
    """What stops ``root`` from being made: a part of its path that is no directory, or the
    error's own words about the path it names."""
    path = os.path.abspath(root)
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        if os.path.lexists(path):
            if not os.path.isdir(path):
                return f"{path} is not a directory"
            break
    if exc.errno == errno.EEXIST and not os.path.isdir(root):
        return f"{root} is not a directory"
    where = exc.filename if isinstance(exc.filename, str) else root
    return f"{exc.strerror or exc} ({where})"


def make_tier_dir(root: str, name: str, mode: int) -> str:
    """``root/name``, a directory of the tier at ``root``, made if missing (``root`` never
    is: a removed tier is not made again). Raises ``PermissionError`` if it is a symlink (or
    no directory) or resolves outside the tier: what is written there would land elsewhere."""
    path = os.path.join(root, name)
    with suppress(FileExistsError):
        os.mkdir(path, mode)
    inside = (os.path.realpath(path) + os.sep).startswith(os.path.realpath(root) + os.sep)
    if not stat.S_ISDIR(os.lstat(path).st_mode) or not inside:
        raise PermissionError(13, "tier directory is a symlink or escapes the tier root", path)
    return path
