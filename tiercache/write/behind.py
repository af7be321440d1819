"""Write-behind: ``close()`` returns once the bytes are durable in the tier; uploads follow.

``WriteBehind`` is the committer of ``write_mode="behind"``: it waits for room in the dirty
budget, hands the staged file to ``WriteState.commit`` (bytes, dirty entry and record made
durable together under the entry lock) and queues the upload. It also owns the barriers:
``flush`` (wait until a path is in the store, or say why not), ``pending`` and ``discard``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from contextlib import ExitStack
from typing import Any

from tiercache import forksafe
from tiercache.config import TierCacheConfig
from tiercache.errors import CacheTimeoutError, UploadFailedError, tier_full
from tiercache.stats import Stats
from tiercache.store.endpoint import canonical_namespace
from tiercache.tiers.local import LocalTier
from tiercache.write.reconcile import reconcile_journal
from tiercache.write.staged import StagedObject
from tiercache.write.state import Record, WriteState
from tiercache.write.uploader import Uploader

_POLL = 0.05
# How old the journal's pending bytes may be when a close() checks the dirty budget: far
# from it (under half), and near it (see ``WriteBehind._wait_for_room``).
_RESCAN_FAR = 5.0
_RESCAN_NEAR = 0.5
log = logging.getLogger("tiercache.write")


class WriteBehind:
    """Committer for ``write_mode="behind"``, and the barriers that wait for its uploads."""

    def __init__(
        self,
        config: TierCacheConfig,
        state: WriteState,
        uploader: Uploader,
        stats: Stats,
        namespace: str,
    ) -> None:
        self._config = config
        self._state = state
        self._uploader = uploader
        self._stats = stats
        self._namespace = namespace
        self._written_here: dict[str, int] = {}  # entry id -> generation, for the exit wait
        self._dirty_seen: tuple[float, dict[str, int]] = (0.0, {})  # pending sizes, when read
        self._lock = threading.Lock()
        _live.add(self)
        forksafe.register(self)

    def after_fork(self) -> None:
        """A child waits at exit only for what it wrote itself."""
        self._written_here = {}
        self._lock = threading.Lock()

    def __call__(self, staged: StagedObject) -> dict[str, Any]:
        self._wait_for_room(staged)
        tier = self._state.tier
        try:
            tier.reserve(staged.size)
        except OSError as exc:
            full = tier_full(exc, f"cannot make room for {staged.key}: {exc}")
            if full is exc:
                raise
            raise full from exc
        try:
            record = self._state.commit(staged, self._namespace)
        finally:
            tier.release(staged.size)
        with self._lock:
            self._written_here[staged.entry_id] = record.generation
        self._stats.add("bytes_written", staged.size)
        if staged.stream is not None:
            self._uploader.adopt_stream(record, staged.stream)
        self._uploader.submit(staged.entry_id)
        # ``generation`` orders this write among the object's commits on this host: the one
        # with the highest is what the store ends with (the close() that returned last may not
        # be: it may have committed first and returned later).
        return {
            "name": f"{staged.bucket}/{staged.key}",
            "size": staged.size,
            "type": "file",
            "generation": record.generation,
        }

    def writer_opening(self) -> None:
        """A file is opened for writing: read the journal's pending bytes now if its
        ``close()`` would have to (see ``_wait_for_room``). On a shared tier the listing is
        metadata round trips, which a ``close()`` would make behind the fsync of its bytes."""
        self._dirty_bytes("", False, 0, self._config.dirty_budget)

    @property
    def staging_tier(self) -> LocalTier:
        """The tier whose journal this committer writes to (``write_tier``)."""
        return self._state.tier

    def _wait_for_room(self, staged: StagedObject) -> None:
        """Back-pressure: block (never fail) while too many bytes wait for upload.

        Only DIRTY records count: a FAILED one waits for the user, not for the store, and
        must not block later writes. Reading the journal is a listing and a read per record
        (metadata round trips on a shared tier, and a ceph-fuse client runs them only after
        the staged file's fsync): it is read at most every ``_RESCAN_FAR`` seconds while the
        pending bytes known here (the last reading plus this process's commits since) stay
        under half the budget, every ``_RESCAN_NEAR`` seconds above that, and on every poll
        once a writer has to wait.
        """
        budget = self._config.dirty_budget
        fresh = False
        waited = False
        with ExitStack() as waiting:
            while True:
                dirty = self._dirty_bytes(staged.entry_id, fresh, staged.size, budget)
                if dirty == 0 or dirty + staged.size <= budget:
                    break
                if fresh and not waited:
                    self._stats.add("writes_throttled")
                    self._uploader.start()
                    waited = True
                    # Blocked here, this close() no longer writes: uploads must not wait
                    # for it to end (they are what it waits for).
                    waiting.enter_context(self._uploader.throttled())
                if fresh:
                    time.sleep(_POLL)
                fresh = True
        with self._lock:
            self._dirty_seen[1][staged.entry_id] = staged.size

    def _dirty_bytes(self, exclude: str, fresh: bool, incoming: int, budget: int) -> int:
        with self._lock:
            stamp, sizes = self._dirty_seen
            known = sum(size for entry_id, size in sizes.items() if entry_id != exclude)
        far = known + incoming <= budget // 2
        if fresh or time.monotonic() - stamp > (_RESCAN_FAR if far else _RESCAN_NEAR):
            sizes = {r.entry_id: r.size for r in self._state.records() if r.state == "dirty"}
            with self._lock:
                self._dirty_seen = (time.monotonic(), sizes)
        with self._lock:  # other writers add their sizes to the dict meanwhile
            sizes = self._dirty_seen[1]
            return sum(size for entry_id, size in sizes.items() if entry_id != exclude)

    @property
    def exit_flush_timeout(self) -> float:
        return self._config.exit_flush_timeout

    # -- barriers ----------------------------------------------------------------------------

    def pending(self, path: str = "") -> list[Record]:
        """Records of ``path`` for this store, in every state: "" is everything, ``a/b/``
        everything below it, ``a/b`` that object and everything below ``a/b/`` (so ``step-1``
        does not match ``step-10``)."""
        return [r for r in self.records_everywhere(path) if self.is_ours(r)]

    def records_everywhere(self, path: str = "") -> list[Record]:
        """Records of ``path`` whatever their store (``tiercache flush`` reports the rest)."""
        return [r for r in self._state.records() if _under(r, path)]

    def is_ours(self, record: Record) -> bool:
        """A record of this store, or one whose store is unknown (torn): every flush of the
        whole tier reports those."""
        if not record.namespace:
            return True
        return canonical_namespace(record.namespace) == canonical_namespace(self._namespace)

    def flush(
        self, prefix: str = "", timeout: float | None = None, retry_failed: bool = False
    ) -> None:
        """Upload everything pending under ``prefix`` (see ``pending``) and wait for it.

        Raises ``UploadFailedError`` naming each object the store refused for good or whose
        bytes were lost (they stay reported until retried or discarded), and
        ``CacheTimeoutError`` after ``timeout`` seconds. Deadlines are ignored: a flush
        retries what the background uploader gave up on.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        # Once per process, what the journal alone does not show (a dirty entry whose record
        # is gone); then, at every flush, torn records and missing bytes.
        if not self._uploader.wait_reconciled(timeout):
            raise CacheTimeoutError(
                f"the reconciliation of the tier with its journal still ran after {timeout} s"
            )
        reconcile_journal(self._state)
        if retry_failed:
            for record in self.pending(prefix):
                if record.state == "failed":
                    self._state.retry(record.entry_id)
        to_upload = [r.entry_id for r in self.pending(prefix) if r.state == "dirty"]
        self._uploader.retry_now(to_upload)
        finished = self._uploader.wait_finished(-1, 0)
        while True:
            remaining = self._owed(prefix)
            dirty = [r for r in remaining if r.state == "dirty"]
            if not dirty:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise CacheTimeoutError(
                    f"{len(dirty)} object(s) still pending after {timeout} s, e.g. "
                    f"{dirty[0].source}: {self._uploader.waiting_for(dirty[0].entry_id)}"
                )
            # Woken as soon as an upload of this process ends; others' are seen by polling.
            finished = self._uploader.wait_finished(finished, _POLL)
        # An upload's record goes before its claim: nothing of what this flush uploaded is
        # left in the journal once it returns (a claim left a moment longer would be taken
        # for an upload still under way by anyone who looks).
        self._uploader.wait_idle(to_upload, deadline)
        if remaining:
            names = [r.name for r in remaining]
            details = "; ".join(f"{r.name} ({r.state}: {r.error})" for r in remaining[:5])
            raise UploadFailedError(
                f"{len(remaining)} object(s) under {prefix or 'the tier'} will not reach the "
                f"store without your action: {details}; {_what_to_do(remaining)}",
                names,
            )

    def _owed(self, prefix: str) -> list[Record]:
        """What a flush of ``prefix`` answers for: the records under it, and those whose
        object is unknown (a torn record with no entry to rebuild it from), which may be."""
        return [
            r
            for r in self._state.records()
            if self.is_ours(r) and (not r.bucket or _under(r, prefix))
        ]

    def discard(self, prefix: str) -> list[Record]:
        """Drop what is pending, failed or lost under ``prefix`` without uploading it."""
        dropped = []
        for record in self.pending(prefix):
            gone = self._state.discard(record.entry_id)
            if gone is not None:
                dropped.append(gone)
                self._stats.add("uploads_cancelled")
        return dropped

    def wait_written_here(self, timeout: float) -> int:
        """At exit: wait for the uploads of what this process wrote; return how many remain."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                mine = dict(self._written_here)
            remaining = [
                entry_id
                for entry_id, generation in mine.items()
                if (record := self._state.get(entry_id)) is not None
                and record.generation == generation
                and record.state == "dirty"
            ]
            if not remaining or time.monotonic() >= deadline:
                return len(remaining)
            time.sleep(_POLL)


def _what_to_do(remaining: list[Record]) -> str:
    """The actions that help the records a flush could not upload (and only those)."""
    actions = []
    if any(r.state == "failed" for r in remaining):
        actions.append(
            "the store refused the failed ones: fix the cause and flush with retry_failed=True "
            "(`tiercache flush --retry-failed`), or drop them"
        )
    if any(r.state == "lost" for r in remaining):
        actions.append(
            "the bytes of the lost ones are gone from the tier and its journal (`tiercache "
            "fsck` restores any it still finds): retrying cannot upload them; drop them"
        )
    return "; ".join(actions) + " with fs.discard(path) (`tiercache discard PATH`)"


def _under(record: Record, path: str) -> bool:
    name = record.name  # a torn record's is "<entry …>": matched by itself or by ""
    if not record.bucket:
        return path in ("", name)
    if not path or path.endswith("/"):
        return name.startswith(path)
    return name == path or name.startswith(path + "/")


_live: weakref.WeakSet[WriteBehind] = weakref.WeakSet()


@atexit.register
def _drain_at_exit() -> None:
    for writer in list(_live):
        left = writer.wait_written_here(writer.exit_flush_timeout)
        if left:
            log.warning(
                "%d upload(s) still pending at exit; they are in the journal and the next "
                "tiercache process or `tiercache flush` will finish them",
                left,
            )
