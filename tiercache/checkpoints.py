"""Checkpoints: whose commit markers reached the store (newest first), whose are held back.

When an uploader lands a commit marker it records the directory here (one small file per
checkpoint under ``ROOT/checkpoints/``, so no file is rewritten by everyone). Eviction keeps the
entries of the newest ``keep_checkpoints`` of them, so a restart reads them at local speed.

A distributed checkpoint's ranks write through several tiers (nodes); the one whose tier holds
the marker cannot see the others' uploads. ``CommitHolds`` keeps its marker from the store
until the ranks agree that every data file is there: one file per held directory under
``ROOT/commit-holds/``, naming the process that holds it. The hold is on disk, not in memory,
so a holder killed before the ranks agreed leaves its marker held (never uploaded by whoever
resumes the journal); the uploader reports such a marker as failed once its holder is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import time

from tiercache.processes import is_alive, start_ticks
from tiercache.tiers.entry import EntryMeta, read_small_file, write_atomically
from tiercache.tiers.lease import is_stale, keep_alive, stop_keeping_alive
from tiercache.tiers.local import fsync_dir, make_tier_dir


def _source(bucket: str, directory: str) -> str:
    return f"s3://{bucket}/{directory}/" if directory else f"s3://{bucket}/"


def _file_name(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest() + ".json"


class CheckpointRegistry:
    """The committed checkpoints of one tier, and the commit markers held back in it."""

    def __init__(
        self, root: str, keep: int, file_mode: int, dir_mode: int, holds: CommitHolds | None = None
    ) -> None:
        self.dir = make_tier_dir(root, "checkpoints", dir_mode)
        self.holds = holds or CommitHolds(root, file_mode, dir_mode)
        self._keep = keep
        self._file_mode = file_mode
        self._cached: tuple[float, tuple[str, ...]] = (0.0, ())

    def committed(self, bucket: str, directory: str) -> None:
        """Record that the checkpoint in ``s3://bucket/directory/`` is complete in the store."""
        source = _source(bucket, directory)
        payload = json.dumps({"source": source, "committed_at": time.time()}).encode()
        write_atomically(os.path.join(self.dir, _file_name(source)), payload, self._file_mode)
        self._cached = (0.0, ())

    def newest(self) -> tuple[str, ...]:
        """Source prefixes of the newest ``keep`` checkpoints (re-read at most once a second)."""
        cached = self._cached
        stamp, prefixes = cached
        if self._keep == 0 or time.monotonic() - stamp < 1.0:
            return prefixes
        found = []
        for name in os.listdir(self.dir):
            try:
                row = json.loads(read_small_file(os.path.join(self.dir, name), 1 << 16) or b"")
                found.append((float(row["committed_at"]), str(row["source"])))
            except (ValueError, KeyError, TypeError):
                continue  # a torn or foreign file protects nothing
        found.sort(reverse=True)
        prefixes = tuple(source for _, source in found[: self._keep])
        if self._cached is cached:  # a commit recorded meanwhile may be missing from this read
            self._cached = (time.monotonic(), prefixes)
        return prefixes

    def keeps(self, meta: EntryMeta) -> bool:
        """True if the entry belongs to one of the newest checkpoints."""
        return meta.source.startswith(self.newest())


class CommitHolds:
    """Directories whose commit marker must not be uploaded yet, by whom they are held.

    Holds live beside the journal that holds the markers. On the shared tier
    (``write_tier="shared"``) every host's uploader honours them, so a hold is kept alive by
    its holder's heartbeat (``stale_after``): one that went ``stale_after`` seconds without a
    heartbeat belongs to a host that is gone, and its marker is reported never committed.
    """

    def __init__(
        self, root: str, file_mode: int, dir_mode: int, stale_after: float | None = None
    ) -> None:
        self.dir = make_tier_dir(root, "commit-holds", dir_mode)
        self._file_mode = file_mode
        self._dir_mode = dir_mode
        self._stale_after = stale_after

    def _path(self, bucket: str, directory: str) -> str:
        return os.path.join(self.dir, _file_name(_source(bucket, directory)))

    def hold(self, bucket: str, directory: str) -> str:
        """Hold the marker of ``s3://bucket/directory/`` (replacing any earlier hold) until
        ``release`` with the token returned. Durable before it returns."""
        make_tier_dir(os.path.dirname(self.dir), "commit-holds", self._dir_mode)  # removed?
        token = secrets.token_hex(8)
        pid = os.getpid()
        row = {
            "source": _source(bucket, directory),
            "token": token,
            "host": socket.gethostname(),
            "pid": pid,
            "started": start_ticks(pid),
            "held_at": time.time(),
        }
        path = self._path(bucket, directory)
        write_atomically(path, json.dumps(row).encode(), self._file_mode)
        fsync_dir(self.dir)  # the hold is on disk before the marker it holds can be
        if self._stale_after is not None:
            keep_alive(path, token, self._stale_after)
        return token

    def release(self, bucket: str, directory: str, token: str | None) -> bool:
        """Lift the hold if it is still ``token``'s (None: whoever holds it); True if lifted."""
        path = self._path(bucket, directory)
        if token is not None:
            row = self._read(path)
            if row is None or row.get("token") != token:
                return False
        stop_keeping_alive(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def held(self, bucket: str, directory: str) -> bool:
        """True while the directory's marker is held."""
        return os.path.lexists(self._path(bucket, directory))

    def orphaned(self, bucket: str, directory: str) -> str | None:
        """The holder, if it is gone (nothing will release its hold): a process of this
        host that died, or (shared holds) one whose heartbeat stopped ``stale_after`` ago."""
        path = self._path(bucket, directory)
        row = self._read(path)
        if row is None:
            return None
        pid, started, host = row.get("pid"), row.get("started"), row.get("host")
        if self._stale_after is not None and is_stale(path, self._stale_after):
            return f"process {pid} of {host}"
        if host != socket.gethostname() or not isinstance(pid, int) or is_alive(pid, started):
            return None
        return f"process {pid}"

    def _read(self, path: str) -> dict[str, object] | None:
        raw = read_small_file(path, 1 << 16)
        if raw is None:
            return None
        try:
            row = json.loads(raw)
        except ValueError:
            return None
        return row if isinstance(row, dict) else None
