"""``WritePath``: a file opened for writing, from its staged bytes to the commit that ends it.

``open`` stages the file in the tier its committer writes to: the tier of ``write_tier`` for a
write behind (its uploads told of the writer while it writes, and of its parts when they go
to the store as it is written), the local tier for a write-through. Once ``close()``
committed it, the caches that knew the old version forget it: the metadata cache, the shared
tier's copy (before a local staging) or this host's copy (after a shared staging).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tiercache.config import TierCacheConfig
from tiercache.metadata.cache import MetadataCache
from tiercache.read.path import ReadPath, source_url
from tiercache.tiers.local import LocalTier
from tiercache.write.behind import WriteBehind
from tiercache.write.staged import Committer, StagedObject, StagedWriteFile
from tiercache.write.through import WriteThrough
from tiercache.write.uploader import Uploader


class WritePath:
    """Opens the files written through one runtime and wires their commits."""

    def __init__(
        self,
        config: TierCacheConfig,
        tier: LocalTier,
        uploader: Uploader,
        behind: WriteBehind,
        through: WriteThrough,
        read_path: ReadPath,
        metadata: MetadataCache,
    ) -> None:
        self._config = config
        self._tier = tier
        self._uploader = uploader
        self._behind = behind
        self._through = through
        self._read_path = read_path
        self._metadata = metadata

    def open(self, bucket: str, key: str, through: bool = False) -> StagedWriteFile:
        """A new version of ``bucket/key``, written behind per ``write_mode`` (or, with
        ``through``, into the store when it is closed)."""
        if through or self._config.write_mode != "behind":
            return self._staged(bucket, key, self._through, self._tier)
        self._uploader.writer_opened()  # uploads defer to writers on a machine of few cores
        try:
            self._behind.writer_opening()
            stream = None
            if self._config.upload_while_writing != "off":
                stream = self._uploader.streamer(bucket, key)
            return self._staged(
                bucket,
                key,
                self._behind,
                self._behind.staging_tier,
                self._uploader.writer_closed,
                stream,
            )
        except BaseException:
            self._uploader.writer_closed()
            raise

    def _staged(
        self,
        bucket: str,
        key: str,
        commit: Committer,
        staging: LocalTier,
        on_close: Callable[[], None] | None = None,
        stream: Any = None,
    ) -> StagedWriteFile:
        if staging is self._tier:
            # The local tier will hold the new bytes; the shared tier's old copy must not
            # outlive them there (an immutable reader would be served it after eviction).
            self._read_path.invalidate_shared(bucket, key)

        def commit_and_forget(staged: StagedObject) -> dict[str, Any]:
            try:
                done = commit(staged)
            finally:
                # The shared tier's listings (other hosts') change once the store does: at
                # once for a write-through, when the upload lands for a write behind.
                self._metadata.invalidate(bucket, [key], shared=commit is self._through)
            if staging is not self._tier:
                # The shared tier holds the new bytes: this host's copy of the old ones goes
                # (a reader that misses here is served the pending write).
                self._tier.invalidate(staged.entry_id, self._config.lock_timeout)
            return done

        return StagedWriteFile(
            f"{bucket}/{key}",
            bucket,
            key,
            tier=staging,
            entry_id=self._read_path.entry_id(bucket, key),
            source=source_url(bucket, key),
            commit=commit_and_forget,
            on_close=on_close,
            stream=stream,
        )
