"""``WriteState``: the one owner of an object's write state, from ``close()`` to the upload.

Each object written behind moves through these states; every transition is made under the
entry's inter-process lock (``LocalTier.entry_lock``), so a record and the bytes it names
always come from the same writer::

    (none|CLEAN) ──commit(g)──► DIRTY(g) ──uploaded(g)──► CLEAN
                                  │   └──commit(g+1)──► DIRTY(g+1)   g is SUPERSEDED: never
                                  │                                  uploaded after g+1
                                  ├──failed(g)──► FAILED(g) ──retry──► DIRTY(g)
                                  ├──the store holds a newer version──► none (a note says so)
                                  └──bytes missing or corrupt──► LOST(g)
    store_written (rm, write-through, pipe, put, copy): DIRTY/FAILED/LOST(g) ──► none

On disk, in ``ROOT/journal/``::

    <id>.json            the record: bucket, key, generation, size, digest, state, error
    <id>.<g>.bytes       generation g's bytes: a hard link of the staged file, so a newer
                         write (a new inode) can never change what a record names
    <id>.upload          the claim of the one process changing the object in the store
                         (a flock; a lease when the journal is on the shared tier)
    <id>.<g>.up.claimed the private link the upload holding the claim reads from
    <id>.mpu             a multipart upload in flight (aborted when its uploader died)
    <id>.<g>.superseded  generation g was never uploaded: the store held a newer version
                         (kept a week for ``status`` and ``flush`` to show)

``close()`` is acknowledged once the bytes, the published dirty entry and the record are
durable. On a shared tier, a new object's entry is published later instead, when it is first
read or once it is uploaded (``publish_on_demand``); until then the journal's copy is the
only one. A record is removed only by the upload of exactly its generation, by a newer
generation's commit, or by a change that reached the store directly (``store_written``);
FAILED and LOST records stay until the user retries or discards them.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal

from tiercache import forksafe
from tiercache.digest import xxh3_file
from tiercache.errors import CacheCorruptError, is_no_space, tier_full
from tiercache.store.base import ObjectInfo
from tiercache.tiers.entry import (
    CachedEntry,
    EntryMeta,
    EntryPaths,
    install,
    prepare_file,
    read_meta,
    read_meta_if_present,
    write_atomically,
)
from tiercache.tiers.local import (
    LocalTier,
    create_exclusive,
    entry_files,
    fsync_dir,
    make_tier_dir,
    remove_file,
)
from tiercache.tiers.shared import SharedTier
from tiercache.write.claims import claims_for
from tiercache.write.staged import StagedObject

RECORD_VERSION = 2
SUPERSEDED_SUFFIX = ".superseded"
SUPERSEDED_KEPT = 7 * 24 * 3600.0  # seconds a note of a superseded version is shown
RecordState = Literal["dirty", "failed", "lost"]
log = logging.getLogger("tiercache.write")

# A shared tier's commit sends two of its metadata calls at once (``WriteState.commit``).
_commit_threads = forksafe.LazyPool(1, "tiercache-commit")


@dataclass(frozen=True, kw_only=True)
class Record:
    """One acknowledged version of an object that is not (yet) in the store."""

    entry_id: str
    bucket: str
    key: str
    source: str
    namespace: str
    size: int
    digest: str
    generation: int
    created_at: float
    state: RecordState = "dirty"
    error: str = ""
    host: str = ""  # the host that committed it ("" in records written before hosts were)
    version: int = RECORD_VERSION

    @property
    def name(self) -> str:
        return f"{self.bucket}/{self.key}" if self.bucket else f"<entry {self.entry_id[:16]}>"

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Record | None:
        """Parse a record; a torn or foreign one gives None (``reconcile`` reports it)."""
        try:
            fields: dict[str, Any] = json.loads(raw)
            if not isinstance(fields, dict):
                return None
            if fields.get("version") == 1:  # written before generations had their own bytes
                fields.pop("staged", None)
                fields["version"] = RECORD_VERSION
            record = cls(**fields)
        except (ValueError, TypeError):
            return None
        valid = (
            record.version == RECORD_VERSION
            and _is_entry_id(record.entry_id)
            and isinstance(record.size, int)
            and isinstance(record.generation, int)
            and isinstance(record.digest, str)
            and record.state in ("dirty", "failed", "lost")
        )
        return record if valid else None


class OvertakenError(Exception):
    """A recovered write is older than the version its object already holds: not committed."""


@dataclass(frozen=True)
class StoreWrite:
    """A direct change of one object in the store, made while holding its upload claim."""

    entry_id: str
    superseded: int | None  # the generation pending when the claim was taken


class WriteState:
    """The write-behind journal of one tier (local, or shared by many hosts) and the
    transitions of its records."""

    def __init__(self, tier: LocalTier, lock_timeout: float) -> None:
        self.tier = tier
        self.dir = make_tier_dir(tier.root, "journal", tier.dir_mode)
        self._mode = tier.file_mode
        self._claims = claims_for(tier)
        self.host = tier.host_id if isinstance(tier, SharedTier) else socket.gethostname()
        self.lock_timeout = lock_timeout
        # A commit on a shared tier, where each file made or renamed is a round trip to the
        # metadata server, leaves a new object's entry to be published when it is first read
        # or once it is uploaded (``publish_pending``); a local tier publishes it at once.
        self.publish_on_demand = isinstance(tier, SharedTier)

    # -- names -------------------------------------------------------------------------------

    def path(self, entry_id: str, suffix: str) -> str:
        if not _is_entry_id(entry_id):
            raise ValueError(f"not an entry id: {entry_id!r}")
        return os.path.join(self.dir, f"{entry_id}.{suffix}")

    def bytes_path(self, entry_id: str, generation: int) -> str:
        return self.path(entry_id, f"{generation}.bytes")

    # -- reading -----------------------------------------------------------------------------

    def get(self, entry_id: str) -> Record | None:
        """The object's record; None when it has none (or an unreadable one: a symlink
        planted in its place is never read through)."""
        try:
            fd = os.open(self.path(entry_id, "json"), _READ)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
            raise
        with open(fd, "rb") as f:
            return Record.from_json(f.read())

    def written_by_this_user(self, entry_id: str) -> bool:
        """Whether the object's record file belongs to this process's user (True without
        one). A group-shared journal holds other users' writes: they go to the store with
        their writers' credentials, on their hosts, never with this process's."""
        try:
            st = os.stat(self.path(entry_id, "json"), follow_symlinks=False)
        except FileNotFoundError:
            return True
        return st.st_uid == os.geteuid()

    def record_ids(self) -> list[str]:
        """Entry ids of every record file, readable or not."""
        names = os.listdir(self.dir)
        return [n[:64] for n in names if n.endswith(".json") and len(n) == 69]

    def records(self) -> list[Record]:
        """Readable records of every store, oldest first (callers compare namespaces with
        ``canonical_namespace``: old records hold the endpoint as it was spelled)."""
        found = []
        for entry_id in self.record_ids():
            record = self.get(entry_id)
            if record is not None:
                found.append(record)
        return sorted(found, key=lambda r: (r.created_at, r.generation))

    # -- DIRTY: a new generation -------------------------------------------------------------

    def commit(
        self, staged: StagedObject, namespace: str, acknowledged_ns: int | None = None
    ) -> Record:
        """Make ``staged`` the object's newest version: its own bytes, the dirty cache entry
        and the record, all durable, under the entry lock. The previous generation is
        superseded only once the new record is durable; on any failure it stays as it was.

        A write recovered from a dead writer is ordered where its writer acknowledged it
        (``acknowledged_ns``, a ``time.time_ns()``), not when it is recovered: ``OvertakenError``
        is raised, and nothing changed, when a version committed after that is recorded or
        cached already."""
        with self.tier.entry_lock(staged.entry_id, self.lock_timeout) as paths:
            previous = self.get(staged.entry_id)
            entry, meta_present = read_meta_if_present(paths.meta)
            newest = max(previous.generation if previous else 0, entry.generation if entry else 0)
            if acknowledged_ns is not None and newest >= acknowledged_ns:
                raise OvertakenError(f"{staged.source}: a newer version was committed since")
            generation = max(
                time.time_ns() if acknowledged_ns is None else acknowledged_ns,
                previous.generation + 1 if previous else 0,
                entry.generation + 1 if entry else 0,
            )
            now = time.time()
            record = Record(
                entry_id=staged.entry_id,
                bucket=staged.bucket,
                key=staged.key,
                source=staged.source,
                namespace=namespace,
                size=staged.size,
                digest=staged.digest,
                generation=generation,
                created_at=now,
                host=self.host,
            )
            meta = _dirty_meta(record)
            own_bytes = self.bytes_path(staged.entry_id, generation)
            record_path = self.path(staged.entry_id, "json")
            record_tmp: str | None = None
            meta_tmp: str | None = None
            installed = False
            # With no entry to replace, a shared tier's new version is published when first
            # read or once uploaded (``publish_pending``): seven metadata calls fewer.
            on_demand = self.publish_on_demand and not meta_present
            try:
                # Everything that needs space first, while the bytes are being fsynced (on a
                # shared filesystem, each file made is a round trip); then renames only.
                if on_demand and staged.movable:  # no entry takes the staged file
                    # Two round trips to the shared filesystem's metadata server at once:
                    # the bytes move into the journal while the record's file is made.
                    moving = _commit_threads.submit(os.rename, staged.path, own_bytes)
                    try:
                        record_tmp = prepare_file(record_path, record.to_json(), self._mode)
                    finally:
                        moving.result()
                        staged.moved()  # once moved, even if the record's file failed
                else:
                    try:
                        _link_or_copy(staged.path, own_bytes)
                    except FileExistsError:  # planted (a link?): replaced, not written through
                        remove_file(own_bytes)
                        _link_or_copy(staged.path, own_bytes)
                    record_tmp = prepare_file(record_path, record.to_json(), self._mode)
                if not on_demand:
                    # Not fsynced: the record and the journal's own bytes are the durable
                    # truth of a pending write; a meta a crash left empty is published again.
                    meta_tmp = self.tier.prepare_meta(paths, meta, durable=False)
                staged.wait_durable()  # the bytes are on disk before anything names them
                if not on_demand:
                    self.tier.publish(
                        paths,
                        staged.fd,
                        meta,
                        src=staged.path,
                        durable=True,
                        prepared_meta=meta_tmp,
                        meta_absent=not meta_present,
                    )
                    staged.moved()
                install(record_tmp, record_path)
                installed = True
                fsync_dir(self.dir)
            except BaseException as exc:
                if record_tmp is not None and not installed:
                    remove_file(record_tmp)
                if meta_tmp is not None:
                    remove_file(meta_tmp)  # gone already once publish installed it
                if installed:
                    self._put_back(staged.entry_id, previous)
                remove_file(own_bytes)
                if not on_demand:  # otherwise the entry was not touched
                    self._restore(paths, previous, generation)
                if isinstance(exc, OSError) and is_no_space(exc):
                    raise tier_full(
                        exc,
                        f"no space left in the {self.tier.name} tier to commit {record.name}; "
                        "nothing of this write will be uploaded",
                        self.tier.root,
                    ) from exc
                raise
            if on_demand:
                self.tier.count_published(staged.size)  # its journal copy takes the space
            if previous is not None and previous.generation != generation:
                remove_file(self.bytes_path(staged.entry_id, previous.generation))
            return record

    def _restore(self, paths: EntryPaths, previous: Record | None, failed: int) -> None:
        """After a failed commit of generation ``failed``: the entry shows the previous
        pending version as before, or (none pending) what it held, or nothing."""
        entry = read_meta(paths.meta)
        if previous is None and entry is not None and entry.generation != failed:
            return  # the commit failed before it touched the entry
        if previous is not None and entry is not None and entry.generation == previous.generation:
            return
        try:
            for path in entry_files(paths):
                remove_file(path)
            if previous is not None:
                self._publish_generation(paths, previous)
        except OSError as exc:  # the record is intact: the upload still happens
            log.warning("could not restore the cache entry of %s: %s", previous, exc)

    def _put_back(self, entry_id: str, previous: Record | None) -> None:
        """Undo a record installed by a commit that then failed."""
        try:
            if previous is None:
                remove_file(self.path(entry_id, "json"))
                fsync_dir(self.dir)
            else:
                self._write(previous)
        except OSError as exc:
            log.warning("could not put back the record of %s: %s", previous, exc)

    def _publish_generation(
        self,
        paths: EntryPaths,
        record: Record,
        counted: bool = False,
        meta: EntryMeta | None = None,
    ) -> CachedEntry:
        """Publish a record's own bytes as its entry, dirty unless ``meta`` says otherwise
        (hold the entry lock). ``counted``: the tier counts them already, as a journal copy
        that no entry links (``LocalTier.unpublished_bytes``)."""
        remove_file(paths.part)
        _link_or_copy(self.bytes_path(record.entry_id, record.generation), paths.part)
        fd = os.open(paths.part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            entry = self.tier.publish(paths, fd, meta or _dirty_meta(record), durable=True)
        finally:
            os.close(fd)
        if counted:  # the same bytes, now counted as the entry that links them
            self.tier.count_published(-record.size)
        return entry

    # -- a damaged entry of a pending write ---------------------------------------------------

    def pending_entry(self, entry_id: str, source: str) -> CachedEntry | None:
        """The dirty entry of the write the journal holds for this object, published again
        from the journal's own copy of its bytes when the tier's entry is damaged or gone;
        None when no write of it is pending.

        A reader that found no usable entry asks here before it goes to the store: while a
        newer write is pending, the store's older version must never be served nor cached
        over it. Raises ``CacheCorruptError`` when the pending bytes cannot be recovered.
        """
        record_path = self.path(entry_id, "json")
        if not os.path.exists(record_path):
            return None  # the usual miss: one stat
        with self.tier.entry_lock(entry_id, self.lock_timeout) as paths:
            record = self.get(entry_id)
            if record is None:
                if not os.path.exists(record_path):
                    return None  # uploaded or discarded meanwhile
                raise CacheCorruptError(
                    f"{source}: a write of it is pending, but its journal record is unreadable "
                    "and the tier's copy is damaged; it is not replaced by the store's older "
                    "version: `tiercache fsck` reports it, `tiercache discard` drops it"
                )
            if record.state == "lost":
                raise CacheCorruptError(
                    f"{source}: a write of it is pending but lost ({record.error}); it is not "
                    "replaced by the store's older version until it is discarded "
                    "(`tiercache discard`)"
                )
            entry = intact_entry(paths, record)
            if entry is None and self.unpublished(paths):
                entry = self.publish_pending(paths, record)
            if entry is None:
                entry = self._restore_for_reader(paths, record)
            return entry

    def unpublished(self, paths: EntryPaths) -> bool:
        """A pending write's entry was never published (see ``publish_on_demand``), rather
        than damaged: the tier holds no file of it (hold the entry lock)."""
        return self.publish_on_demand and not any(
            os.path.lexists(path) for path in entry_files(paths)
        )

    def publish_pending(self, paths: EntryPaths, record: Record) -> CachedEntry | None:
        """Publish the entry of a pending write committed without one, from the journal's
        copy of its bytes (hold the entry lock); its bytes are checked when read, per
        ``verify``, as any entry's. None if that copy is gone (the caller reports it)."""
        try:
            return self._publish_generation(paths, record, counted=True)
        except FileNotFoundError:
            return None

    def journal_copy_intact(self, record: Record) -> bool:
        """Whether the journal's own copy of ``record``'s bytes matches its digest."""
        try:
            own = self.bytes_path(record.entry_id, record.generation)
            return xxh3_file(own) == (record.size, record.digest)
        except OSError:
            return False

    def republish(self, paths: EntryPaths, record: Record) -> CachedEntry:
        """Publish ``record``'s journal copy as its dirty entry, replacing whatever the tier
        holds there (hold the entry lock; check the copy first)."""
        for path in entry_files(paths):
            remove_file(path)
        return self._publish_generation(paths, record)

    def _restore_for_reader(self, paths: EntryPaths, record: Record) -> CachedEntry:
        """Publish ``record``'s journal bytes as its entry again, after checking them against
        the recorded digest (hold the entry lock)."""
        if not self.journal_copy_intact(record):
            raise CacheCorruptError(
                f"{record.source}: the tier's copy of a write not yet uploaded is damaged and "
                "its journal copy is gone or no longer matches its digest; it is not replaced "
                "by the store's older version: `tiercache fsck` reports it lost"
            )
        try:
            entry = self.republish(paths, record)
        except OSError as exc:
            raise CacheCorruptError(
                f"{record.source}: the tier's copy of a write not yet uploaded is damaged and "
                f"could not be restored from its journal copy: {exc}"
            ) from exc
        log.warning("restored the damaged tier entry of %s from its journal copy", record.name)
        return entry

    # -- CLEAN, FAILED, LOST -----------------------------------------------------------------

    def uploaded(self, record: Record, info: ObjectInfo) -> bool:
        """The store holds exactly ``record``'s bytes: its entry becomes clean. False when a
        newer generation (or a direct store change) superseded it meanwhile."""
        with self.tier.entry_lock(record.entry_id, self.lock_timeout) as paths:
            current = self.get(record.entry_id)
            if current is None or current.generation != record.generation:
                return False
            entry = read_meta(paths.meta)
            if entry is not None and entry.generation == record.generation:
                clean = _uploaded_meta(entry, info)
                try:
                    write_atomically(paths.meta, clean.to_json(), self._mode, durable=False)
                except OSError as exc:
                    if not is_no_space(exc):
                        raise
                    # No room to mark it clean: the store holds these bytes, so the entry
                    # goes (a reader fetches it again) rather than stay dirty, to be resent.
                    for path in entry_files(paths):
                        remove_file(path)
                    log.warning(
                        "%s is in the store; no room to keep it cached: %s", record.name, exc
                    )
            elif entry is not None and entry.generation < record.generation:
                for path in entry_files(paths):  # older bytes than the store's: drop them
                    remove_file(path)
            elif entry is None and self.unpublished(paths):
                self._publish_uploaded(paths, record, info)
            self._remove(record)
            if entry is not None and entry.generation > record.generation:
                adopt_entry(self, paths, entry)  # a commit died between publish and record
            return True

    def _publish_uploaded(self, paths: EntryPaths, record: Record, info: ObjectInfo) -> None:
        """A write committed without an entry is in the store: its journal copy becomes the
        clean entry other hosts read (hold the entry lock). Where that fails, nothing is
        cached: a reader fetches it."""
        clean = _uploaded_meta(_dirty_meta(record), info)
        try:
            self._publish_generation(paths, record, counted=True, meta=clean)
        except OSError as exc:
            remove_file(paths.part)
            log.warning("%s is in the store; it could not be cached: %s", record.name, exc)

    def failed(self, record: Record, error: str) -> None:
        """The store refused this generation for good: keep it, out of the upload queue."""
        self._set_state(record, "failed", error)
        log.error("upload of %s failed for good: %s", record.name, error)

    def lost(self, record: Record, reason: str) -> None:
        """This generation's bytes are gone or corrupt: say so until the user discards it."""
        self._set_state(record, "lost", reason)
        log.error("pending write of %s is lost: %s", record.name, reason)

    def retry(self, entry_id: str) -> bool:
        """FAILED → DIRTY (``flush(retry_failed=True)``)."""
        with self.tier.entry_lock(entry_id, self.lock_timeout):
            current = self.get(entry_id)
            if current is None or current.state != "failed":
                return False
            self._write(dataclasses.replace(current, state="dirty", error=""))
            return True

    def _set_state(self, record: Record, state: RecordState, error: str) -> None:
        with self.tier.entry_lock(record.entry_id, self.lock_timeout):
            current = self.get(record.entry_id)
            if current is None and os.path.exists(self.path(record.entry_id, "json")):
                # A record only the name of its file survived: rebuild it. (No file at all:
                # another process ended this version meanwhile, and nothing is pending.)
                self._write(dataclasses.replace(record, state=state, error=error))
            elif current is not None and current.generation == record.generation:
                self._write(dataclasses.replace(current, state=state, error=error))

    def superseded(self, record: Record, reason: str) -> None:
        """The store holds a newer version than ``record``'s (another host's, or one made
        outside): its record goes, never uploaded, and a note says so (``superseded_notes``)
        for ``status`` and ``flush``; the cached entry of that version goes too, so readers
        get the store's."""
        with self.tier.entry_lock(record.entry_id, self.lock_timeout) as paths:
            current = self.get(record.entry_id)
            if current is None or current.generation != record.generation:
                return  # ended by another process, or a newer version is pending here
            note = {"name": record.name, "host": record.host, "at": time.time(), "why": reason}
            write_atomically(
                self.path(record.entry_id, f"{record.generation}{SUPERSEDED_SUFFIX}"),
                json.dumps(note).encode(),
                self._mode,
            )
            entry = read_meta(paths.meta)
            if entry is not None and entry.generation == record.generation:
                for path in entry_files(paths):
                    remove_file(path)
            self._remove(record)
        log.warning("pending write of %s superseded, not uploaded: %s", record.name, reason)

    def superseded_notes(self) -> list[dict[str, Any]]:
        """The versions found superseded in the last ``SUPERSEDED_KEPT`` seconds (older notes
        are removed here)."""
        notes = []
        now = time.time()
        for name in os.listdir(self.dir):
            if not name.endswith(SUPERSEDED_SUFFIX):
                continue
            path = os.path.join(self.dir, name)
            try:
                with open(os.open(path, _READ), "rb") as f:
                    note = json.loads(f.read())
                if now - float(note["at"]) > SUPERSEDED_KEPT:
                    remove_file(path)
                    continue
            except (OSError, ValueError, KeyError, TypeError):
                continue
            notes.append(note)
        return sorted(notes, key=lambda n: float(n["at"]))

    # -- direct changes of the store (rm, write-through, pipe, put, copy) --------------------

    @contextmanager
    def store_write(self, entry_id: str) -> Iterator[StoreWrite]:
        """Hold the object's upload claim while the caller changes it in the store, so that
        no upload of an older pending version can land after the caller's change."""
        claim = self.claim(entry_id, self.lock_timeout)
        try:
            before = self.get(entry_id)
            yield StoreWrite(entry_id, before.generation if before else None)
        finally:
            self.release(entry_id, claim)

    def store_written(
        self, change: StoreWrite, paths_hook: Callable[[EntryPaths], None] | None = None
    ) -> bool:
        """The caller's change reached the store: what was pending before is superseded and
        the entry dropped (or, with ``paths_hook``, replaced by the caller's bytes). False,
        touching nothing, when a newer write-behind version was committed meanwhile: it
        keeps its entry and uploads after the caller's change."""
        with self.tier.entry_lock(change.entry_id, self.lock_timeout) as paths:
            current = self.get(change.entry_id)
            if current is not None and current.generation != change.superseded:
                return False
            if current is not None:
                self._remove(current)
            remove_file(self.path(change.entry_id, "json"))  # an unreadable record is moot now
            for path in entry_files(paths):
                remove_file(path)
            if paths_hook is not None:
                paths_hook(paths)
            return True

    def discard(self, entry_id: str) -> Record | None:
        """Drop a pending, failed or lost version without uploading it (``fs.discard``); the
        reader then gets the store's version."""
        with self.store_write(entry_id) as change:
            record = self.get(entry_id)
            return record if self.store_written(change) else None

    # -- the upload claim --------------------------------------------------------------------

    def try_claim(self, entry_id: str) -> object | None:
        return self._claims.try_take(self.path(entry_id, "upload"))

    def claim(self, entry_id: str, timeout: float) -> object:
        return self._claims.take(self.path(entry_id, "upload"), timeout)

    def release(self, entry_id: str, claim: object) -> None:
        self._claims.give_back(self.path(entry_id, "upload"), claim)

    def still_claimed(self, entry_id: str, claim: object) -> bool:
        """False once another host took the claim over (its holder went ``lease_stale_after``
        without a heartbeat: a frozen process, not only a dead one)."""
        return self._claims.still_held(self.path(entry_id, "upload"), claim)

    def upload_holder(self, entry_id: str) -> str | None:
        """The host whose process holds the object's upload claim now, if any."""
        return self._claims.holder(self.path(entry_id, "upload"))

    @property
    def durability(self) -> str:
        """Where an acknowledged write of this journal survives until its upload: ``local``
        (this host's disk) or ``shared`` (the shared filesystem every host mounts)."""
        return self.tier.name

    def whereabouts(self, record: Record) -> dict[str, str | None]:
        """Where a pending write survives until its upload, the host that wrote it and the
        host whose process is uploading it now (None: none is), as ``pending()`` and
        ``tiercache status`` show them."""
        return {
            "durability": self.durability,
            "host": record.host or None,
            "uploading_on": self.upload_holder(record.entry_id),
        }

    def upload_copy(self, record: Record) -> str | None:
        """A private link of exactly ``record``'s bytes to upload from; None if they are gone.
        Hold the claim; remove the link when done. A link of the same name is a dead
        uploader's: the claim it held was taken over (or its process died)."""
        private = self.path(record.entry_id, f"{record.generation}.up.claimed")
        remove_file(private)
        try:
            _link_or_copy(self.bytes_path(record.entry_id, record.generation), private)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(os.lstat(private).st_mode):  # a symlink planted in their place
            remove_file(private)
            return None
        return private

    def write_multipart(self, record: Record, upload_id: str) -> None:
        payload = json.dumps({"bucket": record.bucket, "key": record.key, "upload_id": upload_id})
        write_atomically(self.path(record.entry_id, "mpu"), payload.encode(), self._mode)

    def read_multipart(self, entry_id: str) -> tuple[str, str, str] | None:
        """The multipart upload a dead uploader left (bucket, key, upload id), if any."""
        try:
            with open(os.open(self.path(entry_id, "mpu"), _READ), "rb") as f:
                row = json.loads(f.read())
            return str(row["bucket"]), str(row["key"]), str(row["upload_id"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            remove_file(self.path(entry_id, "mpu"))
            return None

    def clear_multipart(self, entry_id: str) -> None:
        remove_file(self.path(entry_id, "mpu"))

    # -- storage -----------------------------------------------------------------------------

    def _write(self, record: Record) -> None:
        write_atomically(self.path(record.entry_id, "json"), record.to_json(), self._mode)
        fsync_dir(self.dir)

    def _remove(self, record: Record) -> None:
        remove_file(self.path(record.entry_id, "json"))
        remove_file(self.bytes_path(record.entry_id, record.generation))
        fsync_dir(self.dir)

    def write_recovered(self, record: Record) -> None:
        """Write a record rebuilt by ``reconcile`` (hold the entry lock)."""
        self._write(record)


def adopt_entry(state: WriteState, paths: EntryPaths, entry: EntryMeta) -> Record | None:
    """Journal a dirty entry that has no record, from its own bytes (hold the entry lock).

    The bytes are checked against the entry's digest first; a mismatch makes a LOST record.
    """
    entry_id = os.path.basename(paths.data)[:64]
    bucket, _, key = entry.source.removeprefix("s3://").partition("/")
    record = Record(
        entry_id=entry_id,
        bucket=bucket,
        key=key,
        source=entry.source,
        namespace=entry.namespace,
        size=entry.size,
        digest=entry.digest,
        generation=entry.generation,
        created_at=entry.fetched_at,
    )
    try:
        intact = xxh3_file(paths.data) == (entry.size, entry.digest)
        if intact:
            remove_file(state.bytes_path(entry_id, entry.generation))
            _link_or_copy(paths.data, state.bytes_path(entry_id, entry.generation))
    except OSError as exc:
        intact = False
        log.error("cannot read the dirty entry of %s: %s", record.name, exc)
    if not intact:
        record = dataclasses.replace(
            record, state="lost", error="its cached bytes no longer match their digest"
        )
        log.error("pending write of %s is lost: %s", record.name, record.error)
    state.write_recovered(record)
    return record


def intact_entry(paths: EntryPaths, record: Record) -> CachedEntry | None:
    """The tier's entry of ``record`` if its metadata names exactly that pending generation and
    its data file has the recorded size (its bytes are checked when read, per ``verify``)."""
    meta = read_meta(paths.meta)
    if (
        meta is None
        or meta.state != "dirty"
        or meta.generation != record.generation
        or meta.source != record.source
    ):
        return None
    try:
        st = os.stat(paths.data, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size != meta.size:
        return None
    return CachedEntry(os.path.basename(paths.data)[:64], paths, meta)


def _dirty_meta(record: Record) -> EntryMeta:
    """The cache entry that serves a pending version's bytes until it is uploaded."""
    return EntryMeta(
        source=record.source,
        namespace=record.namespace,
        size=record.size,
        etag="",
        digest=record.digest,
        fetched_at=record.created_at,
        validated_at=record.created_at,
        last_modified=record.created_at,
        state="dirty",
        generation=record.generation,
    )


def _uploaded_meta(meta: EntryMeta, info: ObjectInfo) -> EntryMeta:
    """A pending version's entry metadata once the store holds its bytes as ``info``."""
    now = time.time()
    return dataclasses.replace(
        meta,
        state="clean",
        etag=info.etag,
        validated_at=now,
        last_modified=info.last_modified or now,
    )


def _link_or_copy(src: str, dst: str) -> None:
    """Give ``src``'s bytes a second name; copy them where the filesystem has no hard links.

    Neither name is followed if it is a symlink, and ``dst`` is never replaced: a link
    planted there raises ``FileExistsError`` (the caller removes it), never written through.
    """
    try:
        os.link(src, dst, follow_symlinks=False)
    except (FileNotFoundError, FileExistsError):
        raise
    except OSError:
        fd_in = os.open(src, _READ)
        with open(fd_in, "rb") as fin:
            mode = stat.S_IMODE(os.fstat(fd_in).st_mode)  # as private as a link would be
            with open(create_exclusive(dst, mode), "wb") as fout:
                shutil.copyfileobj(fin, fout, 8 << 20)
                fout.flush()
                with suppress(OSError):
                    os.fsync(fout.fileno())


def _is_entry_id(value: Any) -> bool:
    return isinstance(value, str) and _ENTRY_ID.fullmatch(value) is not None


_ENTRY_ID = re.compile("[0-9a-f]{64}")
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC  # a journal file, never through a link
