"""Write-through: ``close()`` uploads the staged bytes, then they become the cache entry."""

from __future__ import annotations

from typing import Any

from tiercache.staged_write import StagedObject
from tiercache.stats import Stats
from tiercache.store.base import ObjectStore
from tiercache.tiers.entry import EntryMeta
from tiercache.tiers.local import LocalTier
from tiercache.uploader import DIGEST_METADATA_KEY


class WriteThrough:
    """Committer that returns once the object is in the store (``write_mode="through"``)."""

    def __init__(
        self, store: ObjectStore, tier: LocalTier, stats: Stats, lock_timeout: float
    ) -> None:
        self._store = store
        self._tier = tier
        self._stats = stats
        self._lock_timeout = lock_timeout

    def __call__(self, staged: StagedObject) -> dict[str, Any]:
        info = self._store.upload_file(
            staged.bucket, staged.key, staged.path, metadata={DIGEST_METADATA_KEY: staged.digest}
        )
        self._stats.add("uploads")
        self._stats.add("bytes_written", staged.size)
        meta = EntryMeta.for_object(info, staged.source, self._store.namespace, staged.digest)
        self._tier.reserve(staged.size)
        try:
            with self._tier.entry_lock(staged.entry_id, self._lock_timeout) as paths:
                self._tier.publish(paths, staged.fd, meta, src=staged.path)
        finally:
            self._tier.release(staged.size)
        return {
            "name": f"{staged.bucket}/{staged.key}",
            "size": staged.size,
            "type": "file",
            "ETag": info.etag,
        }
