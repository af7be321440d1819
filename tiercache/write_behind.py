"""Write-behind: ``close()`` returns once the bytes are durable in the tier; uploads follow.

The order makes the promise hold at every instant after ``close()`` returns: the staged file
is fsynced, the journal record (naming it) is made durable, then the file is published as a
dirty cache entry (data, meta and directory fsynced) so reads see it at once, and only then is
the upload queued. A crash anywhere leaves a record the next process (or ``tiercache flush``)
uploads, or no record and no promise.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any

from tiercache import forksafe
from tiercache.config import TierCacheConfig
from tiercache.errors import CacheTimeoutError
from tiercache.journal import Journal, JournalRecord
from tiercache.staged_write import StagedObject
from tiercache.stats import Stats
from tiercache.tiers.entry import EntryMeta
from tiercache.tiers.local import LocalTier
from tiercache.uploader import Uploader

_POLL = 0.05
log = logging.getLogger("tiercache.write_behind")


class WriteBehind:
    """Committer for ``write_mode="behind"``, and the barriers that wait for its uploads."""

    def __init__(
        self,
        config: TierCacheConfig,
        tier: LocalTier,
        journal: Journal,
        uploader: Uploader,
        stats: Stats,
        namespace: str,
    ) -> None:
        self._config = config
        self._tier = tier
        self._journal = journal
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
        now = time.time()
        generation = time.time_ns()
        self._journal.write(
            JournalRecord(
                entry_id=staged.entry_id,
                bucket=staged.bucket,
                key=staged.key,
                source=staged.source,
                namespace=self._namespace,
                size=staged.size,
                digest=staged.digest,
                generation=generation,
                created_at=now,
                staged=staged.path,
            )
        )
        meta = EntryMeta(
            source=staged.source,
            namespace=self._namespace,
            size=staged.size,
            etag="",
            digest=staged.digest,
            fetched_at=now,
            validated_at=now,
            last_modified=now,
            state="dirty",
            generation=generation,
        )
        self._tier.reserve(staged.size)
        try:
            with self._tier.entry_lock(staged.entry_id, self._config.lock_timeout) as paths:
                self._tier.publish(paths, staged.fd, meta, src=staged.path, durable=True)
        finally:
            self._tier.release(staged.size)
        with self._lock:
            self._written_here[staged.entry_id] = generation
        self._stats.add("bytes_written", staged.size)
        self._uploader.submit(staged.entry_id)
        return {"name": f"{staged.bucket}/{staged.key}", "size": staged.size, "type": "file"}

    def _wait_for_room(self, staged: StagedObject) -> None:
        """Back-pressure: block (never fail) while too many bytes wait for upload.

        The journal is read at most every half second while there is room (reading every
        record on every close() made many small files quadratic), and on every poll once a
        writer has to wait.
        """
        budget = self._config.dirty_budget
        fresh = False
        waited = False
        while True:
            dirty = self._dirty_bytes(staged.entry_id, fresh)
            if dirty == 0 or dirty + staged.size <= budget:
                break
            if fresh and not waited:
                self._stats.add("writes_throttled")
                self._uploader.start()
                waited = True
            if fresh:
                time.sleep(_POLL)
            fresh = True
        with self._lock:
            self._dirty_seen[1][staged.entry_id] = staged.size

    def _dirty_bytes(self, exclude: str, fresh: bool) -> int:
        with self._lock:
            stamp, sizes = self._dirty_seen
        if fresh or time.monotonic() - stamp > 0.5:
            sizes = {r.entry_id: r.size for r in self._journal.records()}
            with self._lock:
                self._dirty_seen = (time.monotonic(), sizes)
        return sum(size for entry_id, size in sizes.items() if entry_id != exclude)

    @property
    def exit_flush_timeout(self) -> float:
        return self._config.exit_flush_timeout

    def pending(self, path: str = "") -> list[JournalRecord]:
        """Records of ``path``: "" is everything, ``a/b/`` everything below it, ``a/b`` that
        object and everything below ``a/b/`` (so ``step-1`` does not match ``step-10``)."""
        records = self._journal.records(self._namespace)
        if not path or path.endswith("/"):
            return [r for r in records if f"{r.bucket}/{r.key}".startswith(path)]
        return [
            r
            for r in records
            if f"{r.bucket}/{r.key}" == path or f"{r.bucket}/{r.key}".startswith(path + "/")
        ]

    def flush(self, prefix: str = "", timeout: float | None = None) -> None:
        """Upload everything pending under ``prefix`` (see ``pending``) and wait for it.

        Deadlines are ignored: a flush retries what the background uploader gave up on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._uploader.retry_now([r.entry_id for r in self.pending(prefix)])
        while remaining := self.pending(prefix):
            if deadline is not None and time.monotonic() >= deadline:
                raise CacheTimeoutError(
                    f"{len(remaining)} object(s) still pending after {timeout} s, e.g. "
                    f"{remaining[0].source}: {self._uploader.last_error(remaining[0].entry_id)[1]}"
                )
            time.sleep(_POLL)

    def wait_written_here(self, timeout: float) -> int:
        """At exit: wait for the uploads of what this process wrote; return how many remain."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                mine = dict(self._written_here)
            remaining = [
                entry_id
                for entry_id, generation in mine.items()
                if (record := self._journal.get(entry_id)) is not None
                and record.generation == generation
            ]
            if not remaining or time.monotonic() >= deadline:
                return len(remaining)
            time.sleep(_POLL)


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
