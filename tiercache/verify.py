"""Digest checks of cached bytes before they are served (the ``verify`` option).

What this process trusts, the check of one open data file (hashed by a worker ahead of its
reader, ``verify="first"``), and the checks of one read path's whole entries.

A data file is trusted once this process has checked it against the xxh3 digest in its
metadata, or fetched its bytes from the store itself (the digest was computed as they
streamed in), and for as long as the file keeps its identity: any write, truncation or
replacement changes its size, mtime or ctime, or its inode.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

import xxhash

from tiercache import forksafe
from tiercache.buffers import SIZE as BUFFER
from tiercache.buffers import thread_buffer
from tiercache.config import Verify
from tiercache.errors import CacheCorruptError, CacheTimeoutError
from tiercache.stats import Stats
from tiercache.tiers.entry import CachedEntry
from tiercache.tiers.local import LocalTier

# Objects up to this size are checked whole when they are first opened, before any byte is
# handed out: a corrupt copy is refetched (or, dirty, refused) before the first read. xxh3
# hashes about 10 GB/s from the page cache, so this costs a first open at most a few ms; a
# larger object is hashed by a worker ahead of its reader (see ``EntryChecks.at_open``).
CHECK_AT_OPEN_MAX = 64 << 20
_TRUSTED_MAX = 4096
_WORKERS = 2
Identity = tuple[int, int, int, int, int]


def identity(st: os.stat_result) -> Identity:
    """What changes when a file's bytes are changed through the filesystem."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def corrupt_error(source: str, dirty: bool, handed: bool) -> CacheCorruptError:
    """The error a reader gets for cached bytes that failed their digest check."""
    if dirty:
        return CacheCorruptError(
            f"{source}: the cached bytes of a write not yet uploaded no longer match their "
            "digest; they are not served, and the pending upload is kept (not replaced by "
            "the store's version) for `tiercache fsck` and `flush` to report"
        )
    if handed:
        return CacheCorruptError(
            f"{source}: the cached copy failed its digest check after part of it was read; "
            "it was dropped: open the object again to read it from the store"
        )
    return CacheCorruptError(f"{source}: the cached copy failed its digest check")


_workers = forksafe.LazyPool(_WORKERS, "tiercache-verify")  # hash files ahead of readers


class Verifier:
    """This process's digest checks: the files it trusts (bounded, least recently used go
    first) and the workers that hash files ahead of their readers."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._trusted: OrderedDict[Hashable, None] = OrderedDict()
        self._reset()
        forksafe.register(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """A child reads the same files: it keeps the trust, not the parent's workers."""
        self._reset()

    def trusts(self, key: Hashable) -> bool:
        with self._lock:
            if key not in self._trusted:
                return False
            self._trusted.move_to_end(key)
            return True

    def trust(self, key: Hashable) -> None:
        with self._lock:
            self._trusted[key] = None
            self._trusted.move_to_end(key)
            while len(self._trusted) > _TRUSTED_MAX:
                self._trusted.popitem(last=False)

    def forget_all(self) -> None:
        """Trust nothing any more (every file is checked again on its next first open)."""
        with self._lock:
            self._trusted.clear()

    def start(self, check: DigestCheck) -> None:
        """Hash ``check``'s file in a worker; a reader that needs the verdict first runs it."""
        try:
            _workers.submit(check.run)
        except RuntimeError:
            pass  # the interpreter is shutting down: the reader runs the check itself

    def record(self, passed: bool, seconds: float) -> None:
        self.stats.add("verify_checks")
        self.stats.add_time("verify_seconds", seconds)
        if not passed:
            self.stats.add("verify_failures")


class DigestCheck:
    """One check of an entry's data file against the digest in its metadata.

    The file is hashed in order, from its start, by whoever gets there first: a worker
    (``Verifier.start``) reading the file ahead of the reader, the reader's own bytes as it
    is handed them (``feed``: no second read when the worker is behind), or a reader that
    needs the ``verdict`` now. ``on_done(passed)`` runs once the last byte is hashed, in that
    thread, before any waiter learns the verdict (it trusts the file, or drops a corrupt
    clean entry).
    """

    def __init__(
        self,
        verifier: Verifier,
        fd: int,
        size: int,
        digest: str,
        on_done: Callable[[bool], None],
        *,
        source: str,
        dirty: bool,
    ) -> None:
        self.source = source
        self.dirty = dirty
        self._verifier = verifier
        self._fd = os.dup(fd)  # the reader may close its descriptor while a worker hashes
        self._size = size
        self._digest = digest
        self._on_done = on_done
        self._stop = False
        # Set while the reader feeds: the worker then lets it have the hasher (a lock alone
        # let the worker take it back step after step while the reader waited).
        self._feeding = False
        self._fed = threading.Event()
        self._start_over()

    def _start_over(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()  # held while the hasher is fed
        self._cond = threading.Condition()
        self._hasher = xxhash.xxh3_64()
        self._hashed = 0  # the prefix of the file hashed so far
        self._short = False
        self._seconds = 0.0
        self._state = "hashing"  # → deciding → done, or cancelled
        self._passed = False

    def _here(self) -> None:
        """In a forked child, hash afresh: the parent's worker may have been mid-update."""
        if self._pid != os.getpid() and self._state in ("hashing", "deciding"):
            self._start_over()

    @property
    def finished(self) -> bool:
        return self._state == "done"

    def error(self, handed: bool) -> CacheCorruptError:
        return corrupt_error(self.source, self.dirty, handed)

    def feed(self, offset: int, data: bytes | memoryview) -> None:
        """Bytes read from ``offset`` for the reader, before they are handed over: hashed if
        they extend the prefix hashed so far (the worker is behind)."""
        self._here()
        if not offset <= self._hashed < offset + len(data):
            return  # the worker is past these bytes (or short of them: nothing to extend)
        self._fed.clear()
        self._feeding = True
        try:
            with self._lock:
                start = self._hashed
                if not offset <= start < offset + len(data) or self._state != "hashing":
                    return
                began = time.monotonic()
                self._hasher.update(memoryview(data)[start - offset :])
                self._hashed = offset + len(data)
                self._seconds += time.monotonic() - began
                complete = self._hashed >= self._size
        finally:
            self._feeding = False
            self._fed.set()
        if complete:
            self._decide()

    def run(self) -> None:
        """A worker's part: hash the file ahead of the reader, until it is all hashed."""
        while not self._stop:
            if self._feeding:
                self._fed.wait(0.01)
            elif not self._step():
                return

    def verdict(self) -> bool:
        """True if the bytes match their digest; hashes what is left here, with any worker."""
        self._here()
        while self._step():
            pass
        with self._cond:
            self._cond.wait_for(lambda: self._state in ("done", "cancelled"))
            return self._passed

    def cancel(self) -> None:
        """The reader is gone: stop hashing (the file stays unchecked)."""
        self._stop = True
        with self._lock:
            self._close()
        with self._cond:
            if self._state == "hashing":
                self._state = "cancelled"
                self._cond.notify_all()

    def _step(self) -> bool:
        """Hash the next piece of the file; False once there is nothing left to hash."""
        with self._lock:
            if self._fd < 0:
                return False  # decided, or cancelled
            if self._hashed < self._size:  # (an empty file has nothing to read)
                self._hash_piece(self._fd)
            complete = self._hashed >= self._size
        if complete:
            self._decide()
        return not complete

    def _hash_piece(self, fd: int) -> None:
        began = time.monotonic()
        view = thread_buffer("verify")[: min(BUFFER, self._size - self._hashed)]
        try:
            got = os.preadv(fd, [view], self._hashed)
        except OSError:
            got = 0  # unreadable: as good as corrupt
        if got:
            self._hasher.update(view[:got])
            self._hashed += got
        else:
            self._short, self._hashed = True, self._size
        self._seconds += time.monotonic() - began

    def _decide(self) -> None:
        with self._cond:
            if self._state != "hashing":
                return
            self._state = "deciding"
        with self._lock:
            passed = not self._short and self._hasher.hexdigest() == self._digest
            self._close()
        self._verifier.record(passed, self._seconds)
        try:
            self._on_done(passed)
        finally:
            with self._cond:
                self._state, self._passed = "done", passed
                self._cond.notify_all()

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class EntryDroppedError(Exception):
    """An entry failed its digest check as it was opened, and was dropped: fetch it again."""


class EntryChecks:
    """The digest checks of one read path's whole entries: before an entry is opened
    (``verify="always"``, and entries from an earlier boot) and at its first open in this
    process (``verify="first"``)."""

    def __init__(
        self, verifier: Verifier, mode: Verify, lock_timeout: float, shared: LocalTier | None
    ) -> None:
        self._verifier = verifier
        self._mode = mode
        self._lock_timeout = lock_timeout
        self._shared = shared

    def before_open(self, tier: LocalTier, entry: CachedEntry) -> CachedEntry | None:
        """The entry if its whole data file matches its digest; None if it was dropped."""
        if not (self._mode == "always" or tier.needs_check(entry)):
            return entry
        before = _file_identity(entry.paths.data)
        started = time.monotonic()
        checked = tier.check_digest(entry)
        self._verifier.record(checked is not None, time.monotonic() - started)
        if checked is None:
            self._corrupt(tier, entry)
            if entry.meta.state == "dirty":
                raise corrupt_error(entry.meta.source, dirty=True, handed=False)
        elif before is not None and before == _file_identity(entry.paths.data):
            self._verifier.trust((entry.entry_id, before))
        return checked

    def at_open(self, tier: LocalTier, entry: CachedEntry, fd: int) -> DigestCheck | None:
        """``verify="first"``: the check of a data file this process has not checked yet.

        An object of up to ``CHECK_AT_OPEN_MAX`` bytes is checked whole here, before any of
        its bytes is read (``EntryDroppedError`` if it failed). A larger one is checked by a
        worker, ahead of its reader: a sequential reader may be handed its first bytes before
        the verdict, but no read of its last bytes, and no read out of order, returns before
        it (see ``CachedFile``).
        """
        if self._mode != "first":
            return None
        trust = (entry.entry_id, identity(os.fstat(fd)))
        if self._verifier.trusts(trust):
            return None
        check = DigestCheck(
            self._verifier,
            fd,
            entry.meta.size,
            entry.meta.digest,
            self._on_checked(tier, entry, trust),
            source=entry.meta.source,
            dirty=entry.meta.state == "dirty",
        )
        if entry.meta.size > CHECK_AT_OPEN_MAX:
            self._verifier.start(check)
            return check
        if check.verdict():
            return None
        if check.dirty:
            raise check.error(handed=False)
        raise EntryDroppedError(entry.meta.source)

    def _on_checked(
        self, tier: LocalTier, entry: CachedEntry, trust: tuple[str, Identity]
    ) -> Callable[[bool], None]:
        def done(passed: bool) -> None:
            if passed:
                self._verifier.trust(trust)
            else:
                self._corrupt(tier, entry)

        return done

    def _corrupt(self, tier: LocalTier, entry: CachedEntry) -> None:
        """An entry failed its check. A clean one is dropped, with the shared copy it may have
        been promoted from; a dirty one is the only copy of a write not yet uploaded: it
        stays, for the uploader and ``tiercache fsck`` to report."""
        stats = self._verifier.stats
        stats.add("corrupt_entries")
        if entry.meta.state == "dirty":
            return
        copies = [(tier, entry)]
        shared = self._shared
        if shared is not None and tier is not shared:
            copy = shared.lookup(entry.entry_id, entry.meta.namespace, entry.meta.source)
            if copy is not None and copy.meta.digest == entry.meta.digest:
                copies.append((shared, copy))
        for copy_tier, copy in copies:
            try:
                if copy_tier.drop_version(copy, self._lock_timeout):
                    stats.add("invalidations")
            except (OSError, CacheTimeoutError):
                pass  # still there: the next reader's check finds it


def _file_identity(path: str) -> Identity | None:
    try:
        return identity(os.stat(path, follow_symlinks=False))
    except OSError:
        return None
