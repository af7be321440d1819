"""``DirectFile``: a read-only file streamed straight from the store, for when a tier is full.

It reads a range GET pinned to the object's ETag from the current position onwards, resumes a
broken stream where it stopped (bounded retries), and reopens the range after a seek. Nothing
is written to any tier.
"""

from __future__ import annotations

import io
import time
from typing import Any

from tiercache.errors import StoreUnavailableError
from tiercache.seek import seek_target
from tiercache.store.base import ObjectStore, ObjectStream
from tiercache.store.retry import RetryableError, RetryPolicy


class DirectFile(io.RawIOBase):
    """A seekable, read-only binary file over one object version in the store."""

    def __init__(
        self, path: str, store: ObjectStore, bucket: str, key: str, retry: RetryPolicy
    ) -> None:
        super().__init__()
        self.path = self.name = path
        self.mode = "rb"
        self._store, self._bucket, self._key, self._retry = store, bucket, key, retry
        info = store.head(bucket, key)
        self.size, self.etag = info.size, info.etag
        self._pos = 0
        self._stream: ObjectStream | None = None

    def __repr__(self) -> str:
        return f"<DirectFile {self.path!r} size={self.size} pos={self._pos}>"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def info(self) -> dict[str, Any]:
        return {"name": self.path, "size": self.size, "type": "file", "ETag": self.etag}

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        view = memoryview(buffer).cast("B")[: max(0, self.size - self._pos)]
        failures = 0
        while len(view):
            try:
                if self._stream is None:
                    self._stream = self._store.open_range(
                        self._bucket, self._key, self._pos, None, if_match=self.etag
                    )
                count = self._stream.readinto(view)
                if not count:
                    raise RetryableError(f"body ended at byte {self._pos} of {self.size}")
                self._pos += count
                return count
            except RetryableError as exc:
                failures += 1
                self._drop_stream()
                if failures >= self._retry.attempts:
                    raise StoreUnavailableError(
                        f"GetObject s3://{self._bucket}/{self._key} at byte {self._pos} at "
                        f"{self._store.namespace.partition(':')[2]}: "
                        f"failed after {failures} attempts: {exc}"
                    ) from exc
                time.sleep(self._retry.delay(failures))
        return 0

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        remaining = self.size - self._pos
        count = remaining if size is None or size < 0 else min(size, remaining)
        buffer = bytearray(max(0, count))
        got = 0
        while got < count:
            step = self.readinto(memoryview(buffer)[got:])
            if not step:
                break
            got += step
        return bytes(buffer[:got])

    def readall(self) -> bytes:
        return self.read(-1)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        target = seek_target(self._pos, self.size, offset, whence)
        if target != self._pos:
            self._drop_stream()  # the open range starts elsewhere
            self._pos = target
        return self._pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def close(self) -> None:
        self._drop_stream()
        super().close()

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
