"""Reconciliation and scrub: what crashes and bad disks leave is repaired or reported.

Nothing is dropped in silence. ``reconcile_journal`` (every ``flush``) looks at the records:
a torn one is rebuilt from the dirty entry it belongs to, a record whose bytes are gone is
relinked from the entry when that holds the same generation, and anything beyond repair
becomes a LOST record that ``pending``, ``status`` and ``flush`` report until discarded.
``reconcile`` (``tiercache fsck``, ``tiercache flush``, and once in the background when a
process starts uploading) also journals dirty entries that have no record, removes what dead
processes left (staging files, bytes no record names, upload links, claim files, multipart
uploads, among them those begun while a dead writer was still writing) and, with ``scrub``,
checks every whole entry against its digest: a corrupt clean entry is evicted, a corrupt dirty
one reported lost.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tiercache.digest import xxh3_file
from tiercache.errors import ObjectNotFoundError, StoreError
from tiercache.store.base import ObjectStore
from tiercache.tiers.entry import read_meta, read_small_file
from tiercache.tiers.local import entry_files, remove_file
from tiercache.write.staged import CLOSED_SUFFIX, StagedObject
from tiercache.write.state import OvertakenError, Record, WriteState, adopt_entry, intact_entry
from tiercache.write.streaming import SIDECAR_SUFFIX, abort_abandoned_upload

log = logging.getLogger("tiercache.write")
_STAGING_GRACE = 10.0  # seconds: a staged file this young may not be locked by its writer yet


@dataclass
class ReconcileReport:
    """What a reconciliation found and did."""

    repaired: list[str] = field(default_factory=list)
    # Pending writes whose tier entry was damaged or gone: published again from the
    # journal's copy of their bytes (or, if that was damaged too, in ``lost``).
    damaged: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    corrupt_evicted: list[str] = field(default_factory=list)
    entries_checked: int = 0
    leftovers_removed: int = 0
    multipart_aborted: int = 0
    closed_committed: int = 0  # staged files closed by a writer that then died
    closed_overtaken: int = 0  # such files older than a version committed since: dropped

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def add(self, other: ReconcileReport) -> None:
        """Count in what another reconciliation (this process's first) found and did."""
        for name, value in dataclasses.asdict(other).items():
            mine = getattr(self, name)
            if isinstance(mine, list):
                mine.extend(n for n in value if n not in mine)
            else:
                setattr(self, name, mine + value)


def reconcile_journal(state: WriteState, report: ReconcileReport | None = None) -> ReconcileReport:
    """Journal what commits killed mid-way published; repair or report records that are torn
    or whose bytes are gone."""
    report = report if report is not None else ReconcileReport()
    _commit_closed_files(state, report)
    _adopt_interrupted_commits(state, report)
    for entry_id in state.record_ids():
        record = state.get(entry_id)
        if record is not None and (
            record.state != "dirty" or os.path.exists(state.bytes_path(entry_id, record.generation))
        ):
            continue
        with state.tier.entry_lock(entry_id, state.lock_timeout) as paths:
            record = state.get(entry_id)
            if not os.path.exists(state.path(entry_id, "json")):
                continue  # uploaded or superseded meanwhile
            entry = read_meta(paths.meta)
            if record is None:
                _rebuild_torn(state, entry_id, entry, report)
            elif record.state != "dirty" or os.path.exists(
                state.bytes_path(entry_id, record.generation)
            ):
                continue
            elif (
                entry is not None
                and entry.state == "dirty"
                and (entry.generation >= record.generation)
            ):
                _report(adopt_entry(state, paths, entry), report)
            else:
                lost = dataclasses.replace(
                    record, state="lost", error="its bytes are no longer in the tier"
                )
                state.write_recovered(lost)
                log.error("pending write of %s is lost: %s", lost.name, lost.error)
                report.lost.append(lost.name)
    return report


def _adopt_interrupted_commits(state: WriteState, report: ReconcileReport) -> None:
    """A commit killed after it published its dirty entry and before it installed its record
    leaves the record's temp file: the entry shows a version no record names (newer than the
    record, if any). Journal it, so that ``flush`` and ``pending`` see it: a write whose
    ``close()`` never returned may land or not, but never after a flush said all was done."""
    for name in os.listdir(state.dir):
        if not (name.endswith(".tmp") and name[64:70] == ".json." and _is_hex(name[:64])):
            continue
        entry_id = name[:64]
        with state.tier.entry_lock(entry_id, state.lock_timeout) as paths:
            # Under the entry lock no commit runs: the temp file is a dead one's.
            remove_file(os.path.join(state.dir, name))
            entry = read_meta(paths.meta)
            if entry is None or entry.state != "dirty":
                continue
            record = state.get(entry_id)
            if record is None or record.generation < entry.generation:
                _report(adopt_entry(state, paths, entry), report)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _rebuild_torn(state: WriteState, entry_id: str, entry: Any, report: ReconcileReport) -> None:
    """A record that cannot be read: rebuild it from its dirty entry, or report it lost."""
    paths = state.tier.paths(entry_id)
    if entry is not None and entry.state == "dirty":
        _report(adopt_entry(state, paths, entry), report)
        return
    try:
        written = os.stat(state.path(entry_id, "json")).st_mtime
    except OSError:
        written = time.time()
    generation, size = _newest_bytes(state, entry_id)
    kept = f"; its bytes are kept in {state.bytes_path(entry_id, generation)}" if size >= 0 else ""
    lost = Record(
        entry_id=entry_id,
        bucket="",
        key="",
        source="",
        namespace="",
        size=max(size, 0),
        digest="",
        generation=generation,
        created_at=written,
        state="lost",
        error="its journal record is unreadable and the tier holds no pending copy" + kept,
    )
    state.write_recovered(lost)
    log.error("a pending write is lost: %s (%s)", lost.name, lost.error)
    report.lost.append(lost.name)


def _newest_bytes(state: WriteState, entry_id: str) -> tuple[int, int]:
    """The newest generation whose bytes the journal holds for ``entry_id``, and their size
    ((0, -1) if none): a LOST record that names them keeps them from removal as leftovers."""
    found = (0, -1)
    for name in os.listdir(state.dir):
        generation, _, suffix = name[65:].partition(".")
        if name[:64] == entry_id and suffix == "bytes" and generation.isdigit():
            try:
                size = os.stat(os.path.join(state.dir, name)).st_size
            except OSError:
                continue
            found = max(found, (int(generation), size))
    return found


def _report(record: Record | None, report: ReconcileReport) -> None:
    if record is None:
        return
    (report.lost if record.state == "lost" else report.repaired).append(record.name)


def reconcile(
    state: WriteState, store: ObjectStore | None = None, scrub: bool = False
) -> ReconcileReport:
    """Everything ``reconcile_journal`` does, plus dirty entries without a record, leftovers
    of dead processes and, with ``scrub``, a digest check of every whole entry."""
    report = reconcile_journal(state)
    for entry_id in state.record_ids():
        _check_pending_entry(state, entry_id, scrub, report)
    for entry_id in _entry_ids(state):
        _check_entry(state, entry_id, scrub, report)
    _remove_leftovers(state, store, report)
    return report


def _check_pending_entry(
    state: WriteState, entry_id: str, scrub: bool, report: ReconcileReport
) -> None:
    """The tier entry of a pending write: its metadata must name exactly the recorded version
    and its data have the recorded size (with ``scrub``, the recorded digest). One that does
    not is published again from the journal's copy of the bytes; if that copy is damaged too,
    the write is reported lost. A LOST record whose journal copy is intact (its tier entry was
    damaged) is pending again."""
    with state.tier.entry_lock(entry_id, state.lock_timeout) as paths:
        record = state.get(entry_id)
        if record is None or not record.bucket:
            return  # uploaded meanwhile, or torn (``reconcile_journal`` reported it)
        meta = read_meta(paths.meta)
        if meta is not None and (
            meta.generation > record.generation
            or (meta.state == "clean" and meta.generation == record.generation)
        ):
            return  # a newer commit's entry, or uploaded and about to lose its record
        if record.state != "lost" and state.unpublished(paths):
            # Committed without an entry (``WriteState.publish_on_demand``), not damaged.
            if scrub and not state.journal_copy_intact(record):
                lost = dataclasses.replace(
                    record, state="lost", error="its journal copy is damaged or gone"
                )
                state.write_recovered(lost)
                log.error("pending write of %s is lost: %s", lost.name, lost.error)
                report.lost.append(lost.name)
            return
        entry = intact_entry(paths, record)
        if entry is not None and scrub:
            report.entries_checked += 1
            try:
                sound = xxh3_file(paths.data) == (record.size, record.digest)
            except OSError:
                sound = False
            entry = entry if sound else None
        if entry is not None and record.state != "lost":
            return
        if not state.journal_copy_intact(record):
            if record.state != "lost":
                lost = dataclasses.replace(
                    record,
                    state="lost",
                    error="its bytes in the tier and their journal copy are damaged or gone",
                )
                state.write_recovered(lost)
                log.error("pending write of %s is lost: %s", lost.name, lost.error)
                report.lost.append(lost.name)
            return
        if entry is None:
            state.republish(paths, record)
            log.warning("restored the damaged tier entry of %s from its journal copy", record.name)
            report.damaged.append(record.name)
        if record.state == "lost":
            state.write_recovered(dataclasses.replace(record, state="dirty", error=""))
            log.warning("pending write of %s is no longer lost: its bytes are intact", record.name)
            report.repaired.append(record.name)


def _entry_ids(state: WriteState) -> list[str]:
    found = []
    objects = state.tier.objects_dir
    for shard in os.listdir(objects):
        try:
            names = os.listdir(os.path.join(objects, shard))
        except (NotADirectoryError, FileNotFoundError):
            continue
        found += [n[:64] for n in names if n.endswith(".meta") and len(n) == 69]
    return found


def _check_entry(state: WriteState, entry_id: str, scrub: bool, report: ReconcileReport) -> None:
    paths = state.tier.paths(entry_id)
    meta = read_meta(paths.meta)
    if meta is None or (meta.state != "dirty" and not scrub):
        return
    with state.tier.entry_lock(entry_id, state.lock_timeout):
        meta = read_meta(paths.meta)
        if meta is None:
            return
        record = state.get(entry_id)
        has_record_file = os.path.exists(state.path(entry_id, "json"))
        if meta.state == "dirty" and not has_record_file:
            _report(adopt_entry(state, paths, meta), report)
            return
        if not scrub or (meta.state == "dirty" and record is not None):
            return  # a pending write's entry: checked against its record above
        report.entries_checked += 1
        try:
            intact = xxh3_file(paths.data) == (meta.size, meta.digest)
        except OSError:
            intact = False
        if intact:
            return
        name = meta.source.removeprefix("s3://")
        if meta.state == "clean":
            for path in entry_files(paths):
                remove_file(path)
            log.error("evicted %s: its cached bytes did not match their digest", name)
            report.corrupt_evicted.append(name)
        elif (
            record is not None and record.generation == meta.generation and (record.state != "lost")
        ):
            lost = dataclasses.replace(
                record, state="lost", error="its cached bytes no longer match their digest"
            )
            state.write_recovered(lost)
            log.error("pending write of %s is lost: %s", lost.name, lost.error)
            report.lost.append(lost.name)


def _remove_leftovers(
    state: WriteState, store: ObjectStore | None, report: ReconcileReport
) -> None:
    """Staging files of dead writers, and journal files no live record or upload needs."""
    now = time.time()
    names = os.listdir(state.tier.staging_dir)
    for name in names:
        path = os.path.join(state.tier.staging_dir, name)
        if name.endswith(CLOSED_SUFFIX) or name + CLOSED_SUFFIX in names:
            continue  # a closed file: ``reconcile_journal`` commits it
        if not _abandoned(path, now):
            continue
        if name.endswith(SIDECAR_SUFFIX):  # an upload begun while a dead writer wrote
            if store is None:
                continue
            try:
                abort_abandoned_upload(store, path)
            except (StoreError, OSError) as exc:
                log.warning("could not abort a dead writer's multipart upload: %s", exc)
                continue
            report.multipart_aborted += 1
        remove_file(path)
        report.leftovers_removed += 1
    by_entry: dict[str, list[str]] = {}
    for name in os.listdir(state.dir):
        if len(name) > 65 and name[64] == "." and not name.endswith(".json"):
            by_entry.setdefault(name[:64], []).append(name[65:])
    for entry_id, suffixes in by_entry.items():
        record = state.get(entry_id)
        if record is None and os.path.exists(state.path(entry_id, "json")):
            # Unreadable (torn): its bytes may be all that is left of the write, and another
            # pass may be rebuilding the record from them right now.
            continue
        live = {f"{record.generation}.bytes", "upload"} if record is not None else set()
        if set(suffixes) <= live:
            continue  # a pending object's own files: nothing to clean, leave its claim alone
        claim = state.try_claim(entry_id)
        if claim is None:
            continue  # an upload or a direct store change is running: its files are live
        try:
            _clean_entry_files(state, store, entry_id, suffixes, report)
        finally:
            state.release(entry_id, claim)


def _clean_entry_files(
    state: WriteState,
    store: ObjectStore | None,
    entry_id: str,
    suffixes: list[str],
    report: ReconcileReport,
) -> None:
    """Hold the claim: no upload of this object is running."""
    if "mpu" in suffixes and store is not None:
        left = state.read_multipart(entry_id)
        if left is not None:
            try:
                store.abort_multipart(*left)
                report.multipart_aborted += 1
            except ObjectNotFoundError:
                pass
            except (StoreError, OSError) as exc:
                log.warning("could not abort a dead multipart upload: %s", exc)
                return
            state.clear_multipart(entry_id)
    with state.tier.entry_lock(entry_id, state.lock_timeout):
        record = state.get(entry_id)
        if record is None and os.path.exists(state.path(entry_id, "json")):
            return  # unreadable: see above
        live = f"{record.generation}.bytes" if record is not None else None
        for suffix in suffixes:
            # Under the entry lock no commit is running: its temp files are a dead one's.
            stale = ".up." in suffix or suffix.endswith((".uploading", ".tmp"))
            if stale or (suffix.endswith(".bytes") and suffix != live):
                remove_file(state.path(entry_id, suffix))
                report.leftovers_removed += 1


def _commit_closed_files(state: WriteState, report: ReconcileReport) -> None:
    """Commit the staged files that their dead writers had closed (``mark_closed``)."""
    try:
        names = os.listdir(state.tier.staging_dir)
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(CLOSED_SUFFIX):
            path = os.path.join(state.tier.staging_dir, name[: -len(CLOSED_SUFFIX)])
            if _abandoned(path, time.time(), grace=0.0):  # its flock tells a live writer
                _commit_closed(state, path, report)


def _commit_closed(state: WriteState, path: str, report: ReconcileReport) -> None:
    """A staged file its writer had closed (a mount's file still open elsewhere) when the
    writer's process died: its bytes become the object's newest version, as a close would
    have made them."""
    mark = path + CLOSED_SUFFIX
    try:
        row = json.loads(read_small_file(mark, 64 * 1024) or b"null")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):
        return
    try:
        os.fsync(fd)  # written on after its last mark, perhaps: commit takes durable bytes
        size, digest = xxh3_file(path)
        staged = StagedObject(
            row["bucket"], row["key"], row["source"], row["entry_id"], path, fd, size, digest
        )
        # Ordered where its writer acknowledged it (a mark without the instant: its last
        # write), so that a write committed since is never overtaken by this older one.
        acknowledged = row.get("acknowledged_ns") or os.fstat(fd).st_mtime_ns
        state.commit(staged, row["namespace"], acknowledged_ns=int(acknowledged))
    except OvertakenError as exc:
        log.info("not committing %s, closed before its writer died: %s", path, exc)
        report.closed_overtaken += 1
    except (OSError, KeyError, TypeError, ValueError) as exc:
        log.warning("could not commit %s, closed before its writer died: %s", path, exc)
        return
    else:
        report.closed_committed += 1
    finally:
        os.close(fd)
    remove_file(mark)
    remove_file(path)


def _abandoned(path: str, now: float, grace: float = _STAGING_GRACE) -> bool:
    """A staged file whose writer is gone: old enough, and nobody holds its lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if now - os.fstat(fd).st_mtime < grace:  # every write moves the mtime
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
