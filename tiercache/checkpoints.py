"""Committed checkpoints: which directories' commit markers reached the store, newest first.

When an uploader lands a commit marker it records the directory here (one small file per
checkpoint under ``ROOT/checkpoints/``, so no file is rewritten by everyone). Eviction keeps the
entries of the newest ``keep_checkpoints`` of them, so a restart reads them at local speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from tiercache.tiers.entry import EntryMeta, write_atomically


class CheckpointRegistry:
    """The committed checkpoints of one tier."""

    def __init__(self, root: str, keep: int, file_mode: int, dir_mode: int) -> None:
        self.dir = os.path.join(root, "checkpoints")
        os.makedirs(self.dir, mode=dir_mode, exist_ok=True)
        self._keep = keep
        self._file_mode = file_mode
        self._cached: tuple[float, tuple[str, ...]] = (0.0, ())

    def committed(self, bucket: str, directory: str) -> None:
        """Record that the checkpoint in ``s3://bucket/directory/`` is complete in the store."""
        source = f"s3://{bucket}/{directory}/" if directory else f"s3://{bucket}/"
        name = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
        payload = json.dumps({"source": source, "committed_at": time.time()}).encode()
        write_atomically(os.path.join(self.dir, name + ".json"), payload, self._file_mode)
        self._cached = (0.0, ())

    def newest(self) -> tuple[str, ...]:
        """Source prefixes of the newest ``keep`` checkpoints (re-read at most once a second)."""
        stamp, prefixes = self._cached
        if self._keep == 0 or time.monotonic() - stamp < 1.0:
            return prefixes
        found = []
        for name in os.listdir(self.dir):
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    row = json.loads(f.read())
                found.append((float(row["committed_at"]), str(row["source"])))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a torn or foreign file protects nothing
        found.sort(reverse=True)
        prefixes = tuple(source for _, source in found[: self._keep])
        self._cached = (time.monotonic(), prefixes)
        return prefixes

    def keeps(self, meta: EntryMeta) -> bool:
        """True if the entry belongs to one of the newest checkpoints."""
        return meta.source.startswith(self.newest())
