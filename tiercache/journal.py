"""The write-behind journal: one durable record per dirty object, claimed by one uploader at a time.

``ROOT/journal/<entry id>.json`` says "this object's newest bytes are in the tier and not yet
in the store". It is written (fsync, then the directory fsync) before ``close()`` returns and
removed only after the upload of that generation succeeded. ``<entry id>.upload`` is the
flock an uploader holds while it uploads, so processes sharing a cache never upload the same
object twice at once and a dead uploader's claim vanishes with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from tiercache.tiers.entry import write_atomically
from tiercache.tiers.local import fsync_dir
from tiercache.tiers.locks import lock, try_lock, unlock

RECORD_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class JournalRecord:
    """One object waiting to be uploaded."""

    entry_id: str
    bucket: str
    key: str
    source: str
    namespace: str
    size: int
    digest: str
    generation: int
    created_at: float
    staged: str
    version: int = RECORD_VERSION

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> JournalRecord | None:
        try:
            fields: dict[str, Any] = json.loads(raw)
            record = cls(**fields)
        except (ValueError, TypeError):
            return None
        ok = record.version == RECORD_VERSION and len(record.entry_id) == 64
        return record if ok and isinstance(record.size, int) else None


class Journal:
    """The journal directory of one tier."""

    def __init__(self, root: str, file_mode: int, dir_mode: int) -> None:
        self.dir = os.path.join(root, "journal")
        os.makedirs(self.dir, mode=dir_mode, exist_ok=True)
        self._file_mode = file_mode
        self._lock = threading.Lock()  # serialises compare-and-remove within the process

    def _path(self, entry_id: str, suffix: str) -> str:
        if len(entry_id) != 64 or not all(c in "0123456789abcdef" for c in entry_id):
            raise ValueError(f"not an entry id: {entry_id!r}")
        return os.path.join(self.dir, f"{entry_id}.{suffix}")

    def write(self, record: JournalRecord) -> None:
        """Make the record durable (it replaces an older generation of the same object)."""
        write_atomically(self._path(record.entry_id, "json"), record.to_json(), self._file_mode)
        fsync_dir(self.dir)

    def get(self, entry_id: str) -> JournalRecord | None:
        try:
            with open(self._path(entry_id, "json"), "rb") as f:
                return JournalRecord.from_json(f.read())
        except FileNotFoundError:
            return None

    def records(self, namespace: str | None = None) -> list[JournalRecord]:
        """Pending records, oldest first; only those of one store when ``namespace`` is given
        (caches shared by jobs on different endpoints must not upload each other's files)."""
        found = []
        for name in os.listdir(self.dir):
            if name.endswith(".json") and len(name) == 69:
                record = self.get(name[:64])
                if record is not None and namespace in (None, record.namespace):
                    found.append(record)
        return sorted(found, key=lambda r: r.generation)

    def remove(self, entry_id: str, generation: int | None = None) -> bool:
        """Remove the record (only if it is still ``generation``, when given)."""
        with self._lock:
            current = self.get(entry_id)
            if current is None or (generation is not None and current.generation != generation):
                return False
            os.unlink(self._path(entry_id, "json"))
        fsync_dir(self.dir)
        return True

    def try_claim(self, entry_id: str) -> int | None:
        """Take the upload claim of an object without waiting; its fd, or None if held."""
        return try_lock(self._path(entry_id, "upload"), self._file_mode)

    def claim(self, entry_id: str, timeout: float) -> int:
        """Wait for the upload claim (``rm`` waits for an upload in flight to end)."""
        return lock(self._path(entry_id, "upload"), self._file_mode, timeout, "uploading it")

    @staticmethod
    def release(claim: int) -> None:
        unlock(claim)

    def upload_link(self, entry_id: str, generation: int) -> str:
        """A private path for the bytes of one generation while they upload."""
        return self._path(entry_id, f"{generation}.uploading")
