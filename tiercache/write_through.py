"""``WriteThroughFile``: ``open(..., "wb")`` stages bytes in the tier, uploads on ``close()``.

The staged file then becomes the cache entry (read-your-writes without a download). If the
``with`` block raises, nothing is uploaded: a half-written object never reaches the store.
"""

from __future__ import annotations

import io
import os
from types import TracebackType
from typing import Any

import xxhash

from tiercache.stats import Stats
from tiercache.store.base import ObjectStore
from tiercache.tiers.entry import EntryMeta
from tiercache.tiers.local import LocalTier

DIGEST_METADATA_KEY = "tiercache-xxh3"


class WriteThroughFile(io.RawIOBase):
    """A write-only binary file whose ``close()`` returns once the object is in the store."""

    def __init__(
        self,
        path: str,
        bucket: str,
        key: str,
        *,
        store: ObjectStore,
        tier: LocalTier,
        entry_id: str,
        source: str,
        lock_timeout: float,
        stats: Stats,
    ) -> None:
        super().__init__()
        self.path = path
        self.name = path
        self.mode = "wb"
        self._bucket = bucket
        self._key = key
        self._store = store
        self._tier = tier
        self._entry_id = entry_id
        self._source = source
        self._lock_timeout = lock_timeout
        self._stats = stats
        self._staged = tier.staging_path(entry_id)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd = os.open(self._staged, flags, tier.file_mode)
        self._hasher = xxhash.xxh3_64()
        self._size = 0
        self.info: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<WriteThroughFile {self.path!r} written={self._size}>"

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._size

    def write(self, data: Any) -> int:
        self._checkClosed()
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        self._hasher.update(view)
        self._size += done
        return done

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._commit()
        finally:
            self._cleanup()
            super().close()

    def discard(self) -> None:
        """Close without uploading anything."""
        if not self.closed:
            self._cleanup()
            super().close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.discard()
        else:
            self.close()

    def _commit(self) -> None:
        os.fsync(self._fd)
        digest = self._hasher.hexdigest()
        info = self._store.upload_file(
            self._bucket, self._key, self._staged, metadata={DIGEST_METADATA_KEY: digest}
        )
        self._stats.add("uploads")
        self._stats.add("bytes_written", self._size)
        meta = EntryMeta.for_object(info, self._source, self._store.namespace, digest)
        self._tier.reserve(self._size)
        try:
            with self._tier.entry_lock(self._entry_id, self._lock_timeout) as paths:
                self._tier.publish(paths, self._fd, meta, src=self._staged)
        finally:
            self._tier.release(self._size)
        self.info = {"name": self.path, "size": self._size, "type": "file", "ETag": info.etag}

    def _cleanup(self) -> None:
        os.close(self._fd)
        try:
            os.unlink(self._staged)
        except FileNotFoundError:
            pass  # published: the staged file became the entry
