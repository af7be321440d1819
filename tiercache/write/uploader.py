"""``Uploader``: background threads that drain the write-behind journal into the store.

Each pending object is uploaded by whoever holds its claim (``WriteState.try_claim``), from a
private link of exactly the generation recorded, after its bytes were checked against the
recorded xxh3 digest; ``WriteState.uploaded`` then makes the entry clean, unless a newer
generation superseded it meanwhile (that one uploads next, after this upload ended). A
commit marker (DCP's ``.metadata`` by default) waits until no other object under its
directory is pending. Errors the store will repeat (4xx other than 408/429: access denied,
no such bucket, a key it refuses) make the record FAILED at once; others are retried with
backoff until they succeed or ``upload_deadline`` passes.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from tiercache import forksafe
from tiercache.checkpoints import CheckpointRegistry
from tiercache.config import TierCacheConfig
from tiercache.digest import xxh3_file
from tiercache.errors import (
    AccessDeniedError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreError,
    StoreUnavailableError,
    TierCacheError,
)
from tiercache.stats import Stats
from tiercache.store.base import ObjectInfo, ObjectStore
from tiercache.store.endpoint import canonical_namespace
from tiercache.store.retry import RetryPolicy
from tiercache.tiers.local import remove_file
from tiercache.write.fence import (
    AlreadyInStoreError,
    ClaimLostError,
    Outcome,
    StoreVersion,
    UploadFence,
    look,
    outcome,
    upload_metadata,
)
from tiercache.write.reconcile import ReconcileReport, reconcile
from tiercache.write.state import Record, WriteState
from tiercache.write.streaming import BytesChangedError, PartStreamer

log = logging.getLogger("tiercache.uploader")

_SCAN_INTERVAL = 1.0
_BUSY_RETRY = 0.1  # seconds before a flushed object whose claim was busy is tried again
# Uploads wait (at most _DEFER_WHILE_WRITING seconds) until this process has written nothing
# behind for _QUIET_AFTER_WRITES seconds: a checkpoint is a burst of files, and uploads racing
# it on a busy host slow the very close() calls write-behind exists to make fast.
_DEFER_WHILE_WRITING = 10.0
_QUIET_AFTER_WRITES = 0.3
# Parts sent while a file is written take CPU (reading back, signing, sending) and the GIL
# from the writer, and on a small machine the store's own CPU too: measured on 2 cores,
# close() blocked 1.4-1.8x a local write with parts sent at once, against 1.1x when uploads
# waited for the burst to end. With upload_while_writing="auto" and fewer than 4 usable
# cores, parts are queued as they are written and sent when uploads would start. Even two
# parts beside the writer, on a store 30 ms away where each goes at 25 MiB/s, made close()
# block 1.3-2.3x a local write + fsync against 1.05x, for no earlier end to the upload
# (s3-region, store on its own core, client on the other).


def few_cores() -> bool:
    """Too few usable cores to send parts beside a writer without slowing it."""
    return len(os.sched_getaffinity(0)) < 4


class _BytesLostError(TierCacheError):
    """The recorded generation's bytes are gone or no longer match their digest."""


@dataclass
class _Attempts:
    count: int = 0
    not_before: float = 0.0
    last_error: str = ""


def is_permanent(exc: BaseException) -> bool:
    """True for a store error that retrying cannot fix (the store said no, not "later")."""
    if isinstance(exc, StoreUnavailableError):
        return False
    return isinstance(exc, (StoreError, AccessDeniedError, ObjectNotFoundError))


class Uploader:
    """Uploads the journal's records from this process, resuming those of dead processes."""

    def __init__(
        self,
        config: TierCacheConfig,
        state: WriteState,
        store: ObjectStore,
        stats: Stats,
        checkpoints: CheckpointRegistry,
        on_landed: Callable[[str, str], None] | None = None,
    ) -> None:
        """``on_landed``: told of each object that reached the store (the listings kept for
        other hosts forget it)."""
        self._config = config
        self._checkpoints = checkpoints
        self.on_landed = on_landed
        self._state = state
        self._store = store
        self._namespace = canonical_namespace(store.namespace)
        self._stats = stats
        self._backoff = RetryPolicy(attempts=1, base_delay=0.2, max_delay=30.0)
        self._hold_parts = config.upload_while_writing == "auto" and few_cores()
        # Creating an upload journals its id: on the shared tier, a file made through that
        # filesystem's client, whose CPU and round trips the writer needs. It waits there.
        self._create_early = config.write_tier == "local"
        self._reset()
        forksafe.register(self)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[str] = []
        self._attempts: dict[str, _Attempts] = {}
        self._forced: set[str] = set()
        self._active: set[str] = set()  # taken by a worker, not finished
        self._began: dict[str, float] = {}  # uploads holding their claim: since when
        self._deferred: set[str] = set()  # commit markers waiting for their directory
        self._writers = 0
        self._throttled = 0  # close() calls waiting for room: they wait for these uploads
        self._last_write = 0.0
        self._finished = 0  # uploads this process ended (landed, failed or given back)
        self._started = False
        self._reconciled = threading.Event()  # the scan's reconciliation of the tier ran
        self._scan_asked = False  # a flush or fsck waits for it: no holding back for writers
        self._first_report: ReconcileReport | None = None  # what it found, until taken
        # Generations in the store whose landing could not be recorded in the tier (a full
        # disk), by entry id: recorded again later, never sent again.
        self._unrecorded: dict[str, tuple[int, ObjectInfo]] = {}
        # Uploads begun while their file was written, by entry id: (generation, streamer).
        self._streams: dict[str, tuple[int, PartStreamer]] = {}

    def after_fork(self) -> None:
        self._reset()  # the parent's threads (and its streamed uploads) do not exist here

    # -- the API -------------------------------------------------------------------------

    def submit(self, entry_id: str) -> None:
        """Upload this object soon (its record is already in the journal)."""
        self.start()
        with self._cond:
            if entry_id not in self._queue:
                self._queue.append(entry_id)
            self._cond.notify_all()

    def start(self) -> None:
        """Start the worker and scanner threads once per process."""
        with self._cond:
            if self._started:
                return
            self._started = True
        for i in range(self._config.upload_workers):
            threading.Thread(target=self._work, name=f"tiercache-upload-{i}", daemon=True).start()
        threading.Thread(target=self._scan, name="tiercache-upload-scan", daemon=True).start()

    def wait_reconciled(self, timeout: float | None) -> bool:
        """Start the uploads, and wait until this process's reconciliation of the tier (dirty
        entries without a record, damaged entries of pending writes: see ``reconcile``) has
        run; False if ``timeout`` seconds passed first."""
        self.start()
        with self._cond:
            self._scan_asked = True  # now, even while this process writes
            self._cond.notify_all()
        return self._reconciled.wait(timeout)

    def take_first_report(self) -> ReconcileReport | None:
        """What this process's first reconciliation found and did (once; ``tiercache fsck``
        reports it with its own, which then finds that damage repaired already)."""
        self.wait_reconciled(None)
        report, self._first_report = self._first_report, None
        return report

    def streamer(self, bucket: str, key: str) -> Callable[[str], PartStreamer] | None:
        """What a new staged file of ``bucket/key`` sends its parts with while written; None
        where nothing of it would go before the writes end (staged on the shared tier on few
        cores): the upload after ``close()`` does as well, without a descriptor opened
        through that filesystem and a thread per part beside the writer."""
        if self._hold_parts and not self._create_early:
            return None
        return partial(PartStreamer, self._store, bucket, key, file_mode=self._state.tier.file_mode)

    def adopt_stream(self, record: Record, stream: PartStreamer) -> None:
        """``record``'s parts are on their way: its upload finishes that upload."""
        if not stream.streamed_parts:
            stream.close()  # smaller than a part: uploaded whole, like any other
            return
        with self._cond:
            old = self._streams.get(record.entry_id)
            self._streams[record.entry_id] = (record.generation, stream)
        stream.send_rest(record.size)
        if old is not None:
            old[1].abort()  # an older generation's upload, superseded before it finished

    def _take_stream(self, record: Record) -> PartStreamer | None:
        """The streamed upload of exactly ``record``'s generation; older ones are aborted."""
        with self._cond:
            held = self._streams.get(record.entry_id)
            if held is None or held[0] > record.generation:
                return None  # a newer generation's upload stays for its own turn
            del self._streams[record.entry_id]
        if held[0] == record.generation:
            return held[1]
        held[1].abort()
        return None

    def _drop_streams_without_record(self) -> None:
        """Abort streamed uploads whose record is gone or moved on (uploaded by another
        process, removed, discarded, superseded)."""
        with self._cond:
            entry_ids = list(self._streams)
        for entry_id in entry_ids:
            self._drop_stream_without_record(entry_id)

    def _drop_stream_without_record(self, entry_id: str) -> None:
        with self._cond:
            held = self._streams.get(entry_id)
        if held is None:
            return
        generation, stream = held
        record = self._state.get(entry_id)
        if record is not None and record.generation == generation and record.state == "dirty":
            return
        with self._cond:
            if self._streams.get(entry_id) != held:
                return
            del self._streams[entry_id]
        stream.abort()

    def writer_opened(self) -> None:
        """A file is being written behind in this process: uploads hold back meanwhile (and,
        on a machine with few cores, so do the parts of the files being written)."""
        with self._cond:
            self._writers += 1
            if self._writers == 1 and self._hold_parts:
                self._store.hold_parts(True, _DEFER_WHILE_WRITING, self._create_early)

    def writer_closed(self) -> None:
        with self._cond:
            self._writers -= 1
            self._last_write = time.monotonic()
            self._cond.notify_all()
            quiet = self._writers == 0 and self._hold_parts
        if quiet:  # the parts go once the burst of writes is over, like the uploads
            release = threading.Timer(_QUIET_AFTER_WRITES, self._release_parts_if_quiet)
            release.daemon = True
            release.start()

    @contextmanager
    def throttled(self) -> Iterator[None]:
        """A ``close()`` waits for room in the dirty budget meanwhile: uploads (and held
        parts) go at once, as the waiting writer needs them to, instead of holding back for
        it as for a writer still writing."""
        with self._cond:
            self._throttled += 1
            self._cond.notify_all()
        if self._hold_parts:
            self._store.hold_parts(False)
        try:
            yield
        finally:
            with self._cond:
                self._throttled -= 1

    def _release_parts_if_quiet(self) -> None:
        with self._cond:
            quiet = time.monotonic() - self._last_write >= _QUIET_AFTER_WRITES * 0.9
            if self._writers == 0 and quiet:
                self._store.hold_parts(False)

    def _wait_for_quiet(self, entry_id: str) -> None:
        """Hold an upload back while this process writes (called with the condition held).

        A flush cuts the wait short: it asked for these uploads now; so does a ``close()``
        blocked on back-pressure (``throttled``): it waits for them.
        """
        if entry_id in self._streams and not self._hold_parts:
            return  # its parts went while it was written: only the tail is left
        self._hold_back_while_writing(
            lambda: entry_id in self._forced or any(e in self._forced for e in self._queue)
        )

    def _hold_back_while_writing(self, asked: Callable[[], bool]) -> None:
        """Wait (with the condition held, at most ``_DEFER_WHILE_WRITING`` seconds) until
        this process has written nothing behind for ``_QUIET_AFTER_WRITES`` seconds, unless
        the work is ``asked`` for or a ``close()`` waits for room that only uploads make."""
        give_up = time.monotonic() + _DEFER_WHILE_WRITING
        while (now := time.monotonic()) < give_up:
            if asked() or self._throttled:
                return
            if self._writers == 0 and now - self._last_write >= _QUIET_AFTER_WRITES:
                return
            self._cond.wait(min(give_up - now, _QUIET_AFTER_WRITES))

    def wait_finished(self, seen: int, timeout: float) -> int:
        """Wait until an upload of this process ends after the ``seen``-th (at most
        ``timeout`` seconds); return how many have ended."""
        with self._cond:
            self._cond.wait_for(lambda: self._finished != seen, timeout)
            return self._finished

    def wait_idle(self, entry_ids: Iterable[str], deadline: float | None) -> bool:
        """Wait until no upload of ``entry_ids`` runs in this process: each landed, failed or
        gave up, and gave its claim back (by ``deadline``, a ``time.monotonic()``); False if
        one still ran then."""
        wanted = set(entry_ids)
        with self._cond:
            return self._cond.wait_for(
                lambda: not (self._active & wanted),
                None if deadline is None else max(0.0, deadline - time.monotonic()),
            )

    def last_error(self, entry_id: str) -> tuple[int, str]:
        """Attempts so far and the last error of one object, as seen by this process."""
        with self._cond:
            attempts = self._attempts.get(entry_id, _Attempts())
            return attempts.count, attempts.last_error

    def waiting_for(self, entry_id: str) -> str:
        """What the upload of one object waits for, in words, for a message that must say
        why it is not done: its last error, else the attempt under way or why none is."""
        with self._cond:
            attempts = self._attempts.get(entry_id, _Attempts())
            began = self._began.get(entry_id)
            queued = entry_id in self._queue or entry_id in self._active
        if attempts.last_error:
            return f"{attempts.last_error} (attempt {attempts.count})"
        if began is not None:
            return (
                f"an upload attempt has had no answer from the store for "
                f"{time.monotonic() - began:.1f} s"
            )
        if queued:
            return "queued behind other uploads of this process"
        return "uploaded by another process holding its claim, or waiting for its next retry"

    def retry_now(self, entry_ids: list[str]) -> None:
        """Forget backoff and deadlines for these objects and queue them (a flush asked)."""
        self.start()
        with self._cond:
            for entry_id in entry_ids:
                attempts = self._attempts.get(entry_id)
                if attempts is not None:
                    attempts.not_before = 0.0
                if entry_id in self._queue:
                    self._queue.remove(entry_id)
                self._queue.insert(0, entry_id)  # ahead of uploads nobody is waiting for
            self._forced.update(entry_ids)
            self._cond.notify_all()
            writing = self._writers > 0
        if self._hold_parts and not writing:
            self._store.hold_parts(False)  # a flush waits for these parts: no quiet period

    # -- threads -------------------------------------------------------------------------

    def _scan(self) -> None:
        """Pick up records this process did not write: crashed writers, earlier runs.

        Like the uploads, the scans hold back while this process writes: on a shared
        filesystem their listings and entry locks are metadata round trips that the
        ``close()`` calls of a checkpoint would otherwise wait behind."""
        self._hold_scan_back()
        try:
            # Once per process: what crashes left.
            self._first_report = reconcile(self._state, self._store)
        except FileNotFoundError:
            return
        except Exception as exc:  # a repair that fails must not stop the uploads
            log.warning("reconciling the journal failed: %s", exc)
        finally:
            self._reconciled.set()
        while True:
            now = time.time()
            try:
                records = self._ours(self._state.records())
            except FileNotFoundError:
                return  # the cache directory was removed: nothing left to upload here
            self._drop_streams_without_record()
            for record in records:
                if record.state != "dirty":
                    continue
                with self._cond:
                    attempts = self._attempts.get(record.entry_id)
                    due = attempts is None or attempts.not_before <= now
                    queued = record.entry_id in self._queue or record.entry_id in self._active
                    if due and not queued:
                        self._queue.append(record.entry_id)
                        self._cond.notify_all()
            time.sleep(_SCAN_INTERVAL)
            self._hold_scan_back()

    def _hold_scan_back(self) -> None:
        with self._cond:
            self._hold_back_while_writing(lambda: self._scan_asked or bool(self._forced))
            self._scan_asked = False

    def _ours(self, records: list[Record]) -> list[Record]:
        return [r for r in records if canonical_namespace(r.namespace) == self._namespace]

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue))
                entry_id = self._queue.pop(0)
                self._active.add(entry_id)
                self._wait_for_quiet(entry_id)
            try:
                handled = self._upload_one(entry_id)
            except Exception as exc:  # recorded and retried: an upload error is never fatal
                self._failed(entry_id, exc)
            else:
                with self._cond:
                    if handled and entry_id not in self._deferred:
                        self._attempts.pop(entry_id, None)
                        self._forced.discard(entry_id)
            finally:
                with self._cond:
                    self._active.discard(entry_id)
                    self._finished += 1
                    self._cond.notify_all()

    def _failed(self, entry_id: str, exc: Exception) -> None:
        self._stats.add("upload_errors")
        with self._cond:
            attempts = self._attempts.setdefault(entry_id, _Attempts())
            attempts.count += 1
            attempts.last_error = f"{type(exc).__name__}: {exc}"
            attempts.not_before = time.time() + self._backoff.delay(min(attempts.count, 10))
        log.warning("upload of %s failed (attempt %d): %s", entry_id[:12], attempts.count, exc)

    # -- one upload ----------------------------------------------------------------------

    def _upload_one(self, entry_id: str) -> bool:
        """Upload one object if its claim is free; False when it was not."""
        if not self._state.written_by_this_user(entry_id):
            return True  # another user's write: not this process's to upload, fail or abort
        claim = self._state.try_claim(entry_id)
        if claim is None:  # another thread or process is uploading it (maybe an older version)
            with self._cond:
                waited_for = entry_id in self._forced
            if waited_for:  # a flush waits: look again soon rather than at the next scan
                again = threading.Timer(_BUSY_RETRY, self.submit, (entry_id,))
                again.daemon = True
                again.start()
            return False
        with self._cond:
            self._began[entry_id] = time.monotonic()
        try:
            self._abort_dead_multipart(entry_id)
            record = self._state.get(entry_id)
            if record is None or record.state != "dirty" or not self._ours([record]):
                self._drop_stream_without_record(entry_id)
                return True
            if self._past_deadline(record):
                self._give_up(entry_id)
                return True
            if self._waits_for_siblings(record):
                self._defer_or_fail_marker(record)
                return True
            try:
                info = self._landed_before(record) or self._upload_generation(record, claim)
            except _BytesLostError as exc:
                if self._state.still_claimed(entry_id, claim):
                    self._state.lost(record, str(exc))
                    self._stats.add("uploads_lost")
                return True
            except (ClaimLostError, AlreadyInStoreError, ObjectChangedError) as exc:
                return self._refused(record, claim, exc)
            except Exception as exc:
                if not self._state.still_claimed(entry_id, claim):
                    # Another host took the claim over meanwhile (an upload it aborted
                    # answers "no such upload"): the outcome is its to record, not this one's.
                    self._stats.add("uploads_claim_lost")
                    return True
                if not is_permanent(exc):
                    raise
                self._state.failed(record, f"{type(exc).__name__}: {exc}")
                self._stats.add("uploads_failed")
                return True
            self._landed(record, info)
            return True
        finally:
            with self._cond:
                self._began.pop(entry_id, None)
            self._state.release(entry_id, claim)

    def _refused(self, record: Record, claim: object, exc: Exception) -> bool:
        """The upload stopped at its fence: another host holds the claim, or the store holds
        another version than the one the upload was made against. Neither is a failure."""
        if isinstance(exc, ClaimLostError):
            self._stats.add("uploads_claim_lost")
            log.warning("%s: %s; that host finishes it", record.name, exc)
            return True
        held = (
            exc.held
            if isinstance(exc, AlreadyInStoreError)
            else look(self._store, record.bucket, record.key)
        )
        verdict = outcome(record, held)
        if verdict is Outcome.RETRY:
            raise StoreUnavailableError(
                f"{record.name}: the store's version changed while it was uploaded; again"
            ) from exc
        if not self._state.still_claimed(record.entry_id, claim):
            self._stats.add("uploads_claim_lost")
            return True
        if verdict is Outcome.DELIVERED:
            assert held.info is not None
            self._stats.add("uploads_delivered_elsewhere")
            self._landed(record, held.info, counted=False)
            return True
        self._state.superseded(record, _superseded_reason(held))
        self._stats.add("uploads_superseded")
        self._requeue_deferred()
        return True

    def _abort_dead_multipart(self, entry_id: str) -> None:
        """A multipart upload recorded by an uploader that died holding this claim."""
        left = self._state.read_multipart(entry_id)
        if left is not None:
            bucket, key, upload_id = left
            try:
                self._store.abort_multipart(bucket, key, upload_id)
            except ObjectNotFoundError:
                pass  # aborted or completed already
            self._state.clear_multipart(entry_id)
            self._stats.add("multipart_aborted")

    def _past_deadline(self, record: Record) -> bool:
        deadline = self._config.upload_deadline
        with self._cond:
            forced = record.entry_id in self._forced
        return not forced and deadline is not None and time.time() - record.created_at > deadline

    def _waits_for_siblings(self, record: Record) -> bool:
        """A commit marker goes last: wait while anything else under its directory is pending,
        or while the directory is held (other tiers' files of the checkpoint, not seen here)."""
        if posixpath.basename(record.key) != self._config.commit_marker:
            return False
        directory = posixpath.dirname(record.key)
        if self._checkpoints.holds.held(record.bucket, directory):
            return True
        prefix = f"{directory}/" if directory else ""
        return any(
            other.bucket == record.bucket
            and other.key.startswith(prefix)
            and posixpath.basename(other.key) != self._config.commit_marker
            for other in self._ours(self._state.records())
        )

    def _give_up(self, entry_id: str) -> None:
        """Past the deadline: stop retrying here; the record stays for ``flush`` to finish."""
        with self._cond:
            attempts = self._attempts.setdefault(entry_id, _Attempts())
            attempts.not_before = float("inf")
            attempts.last_error = (
                f"upload deadline passed ({attempts.last_error or 'no error recorded'}); "
                "the object stays dirty until `tiercache flush` uploads it"
            )

    def _defer_or_fail_marker(self, record: Record) -> None:
        """Park a waiting marker, unless its hold outlived its holder: then nothing will lift
        it, and the marker is reported failed (never uploaded)."""
        directory = posixpath.dirname(record.key)
        holder = self._checkpoints.holds.orphaned(record.bucket, directory)
        if holder is None:
            self._defer(record.entry_id)
            return
        self._state.failed(
            record,
            f"its checkpoint was never committed: {holder}, which held it until every "
            "rank's files were in the store, is gone; save the checkpoint again, or discard it",
        )
        self._stats.add("uploads_failed")

    def _defer(self, entry_id: str) -> None:
        """Park a commit marker; every finished upload puts the parked ones back in line."""
        with self._cond:
            attempts = self._attempts.setdefault(entry_id, _Attempts())
            attempts.last_error = "waiting for the other files of its directory"
            self._deferred.add(entry_id)

    def _requeue_deferred(self) -> None:
        with self._cond:
            for entry_id in self._deferred:
                if entry_id not in self._queue:
                    self._queue.append(entry_id)
            self._deferred.clear()
            self._cond.notify_all()

    def _upload_generation(self, record: Record, claim: object) -> ObjectInfo:
        """Upload exactly the recorded generation's bytes (hold the claim), fenced: the claim
        is checked before every request, and the object is sent on the condition that the
        store still holds what it held while the claim was held (``write/fence.py``)."""
        fence = UploadFence(self._state, self._store, record, claim)
        fence.check()
        link = self._state.upload_copy(record)
        stream = self._take_stream(record)
        if link is None:
            if stream is not None:
                stream.abort()
            raise _BytesLostError("the bytes of this version are no longer in the tier")
        try:
            if stream is not None:
                streamed = self._finish_stream(stream, record, link, fence)
                if streamed is not None:
                    return streamed
            if xxh3_file(link) != (record.size, record.digest):
                raise _BytesLostError("its bytes in the tier no longer match their digest")
            try:
                info = self._store.upload_file(
                    record.bucket,
                    record.key,
                    link,
                    metadata=upload_metadata(record),
                    on_multipart=lambda upload_id: self._state.write_multipart(record, upload_id),
                    fence=fence,
                )
            except ObjectChangedError as exc:
                if not fence.misjudged():
                    raise
                # The store refused a condition that held: it cannot fence, so its writes go
                # without conditions from now on (claim checks still fence them).
                self._store.conditions_refused(record.bucket)
                raise StoreUnavailableError(
                    f"{record.name}: the store refused a condition that held; sent again "
                    "without conditions"
                ) from exc
            # On failure the record of a multipart upload stays: the next claimant aborts it
            # again, in case the store's own abort did not reach the store.
            self._state.clear_multipart(record.entry_id)
            return info
        finally:
            remove_file(link)

    def _finish_stream(
        self, stream: PartStreamer, record: Record, link: str, fence: UploadFence
    ) -> ObjectInfo | None:
        """Complete the upload begun while the file was written; None: upload it whole."""
        try:
            info = stream.finish(link, record.size, record.digest, fence)
        except BytesChangedError as exc:
            raise _BytesLostError(str(exc)) from exc
        self._stats.add("uploads_streamed" if info is not None else "streams_restarted")
        return info

    def _landed_before(self, record: Record) -> ObjectInfo | None:
        """What the store answered when this very generation landed, if recording that in
        the tier failed: it is recorded now instead of being sent again."""
        with self._cond:
            landed = self._unrecorded.get(record.entry_id)
        return landed[1] if landed is not None and landed[0] == record.generation else None

    def _landed(self, record: Record, info: ObjectInfo, counted: bool = True) -> None:
        if posixpath.basename(record.key) == self._config.commit_marker:
            # The marker is in the store: recorded before its journal record goes, so that a
            # flush that returns finds the checkpoint among the newest (retention keeps it).
            self._checkpoints.committed(record.bucket, posixpath.dirname(record.key))
        with self._cond:  # counted once, when the store first had it
            landed_before = self._unrecorded.get(record.entry_id, (None, None))[0]
        if landed_before != record.generation and counted:
            # Before the journal record goes: a flush that returns has it counted.
            self._stats.add("uploads")
            self._stats.add("bytes_uploaded", record.size)
        try:
            superseded = not self._state.uploaded(record, info)
        except BaseException:
            with self._cond:  # retried with backoff: recorded then, not uploaded again
                self._unrecorded[record.entry_id] = (record.generation, info)
            raise
        with self._cond:
            self._unrecorded.pop(record.entry_id, None)
        if superseded:
            self.submit(record.entry_id)  # superseded meanwhile: the newer version goes next
        if self.on_landed is not None:
            self.on_landed(record.bucket, record.key)
        self._requeue_deferred()


def _superseded_reason(held: StoreVersion) -> str:
    if held.generation is None:
        return f"the store holds a version written outside tiercache since (ETag {held.etag})"
    return f"the store holds a newer acknowledged version (generation {held.generation})"
