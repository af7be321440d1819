"""Write-through: ``close()`` uploads the staged bytes, then they become the cache entry.

The upload runs under the object's upload claim (``WriteState.store_write``), so a version
written behind earlier cannot land after it; once the store holds the new bytes, that older
version is superseded. A version written behind *during* the upload is newer: it keeps its
entry and uploads afterwards.
"""

from __future__ import annotations

import os
from typing import Any

from tiercache.stats import Stats
from tiercache.store.base import ObjectStore
from tiercache.tiers.entry import EntryMeta, EntryPaths
from tiercache.write.staged import StagedObject
from tiercache.write.state import WriteState
from tiercache.write.version_metadata import DIGEST_METADATA_KEY


class WriteThrough:
    """Committer that returns once the object is in the store (``write_mode="through"``)."""

    def __init__(self, store: ObjectStore, state: WriteState, stats: Stats) -> None:
        self._store = store
        self._state = state
        self._stats = stats

    def __call__(self, staged: StagedObject) -> dict[str, Any]:
        tier = self._state.tier
        staged.wait_durable()
        with self._state.store_write(staged.entry_id) as change:
            # The old copy goes before the store changes (and is replaced after it): a
            # process killed in between leaves no copy a fresh reader is served over it.
            tier.drop_clean(staged.entry_id, self._state.lock_timeout)
            info = self._store.upload_file(
                staged.bucket,
                staged.key,
                staged.path,
                metadata={DIGEST_METADATA_KEY: staged.digest},
            )
            self._stats.add("uploads")
            self._stats.add("bytes_written", staged.size)
            meta = EntryMeta.for_object(info, staged.source, self._store.namespace, staged.digest)

            with tier.reservation(staged.size) as reserved:

                def publish(paths: EntryPaths) -> None:
                    reserved.publish(paths, staged.fd, meta, src=staged.path)

                if os.path.exists(staged.path):
                    self._state.store_written(change, publish)
        return {
            "name": f"{staged.bucket}/{staged.key}",
            "size": staged.size,
            "type": "file",
            "ETag": info.etag,
        }
