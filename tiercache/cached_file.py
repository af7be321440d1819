"""``CachedFile``: the read-only file object ``open(..., "rb")`` returns, backed by a tier file.

It reads with ``pread`` from the entry's data file; while the object is still being fetched it
waits only for the bytes it asks for, so a reader starts before the download ends.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from typing import Any

from tiercache.read_path import OpenedObject
from tiercache.seek import SeekableReader

_MAX_PREAD = 1 << 30  # pread moves at most ~2 GiB per call on Linux; stay well below


class CachedFile(SeekableReader):
    """A seekable, read-only binary file over a cached object."""

    def __init__(
        self,
        path: str,
        opened: OpenedObject,
        on_read: Callable[[int], None],
        details: dict[str, Any] | None = None,
        on_tier_full: Callable[[OSError], io.RawIOBase | None] | None = None,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self.name = path
        self.mode = "rb"
        self.size = opened.size
        self.etag = opened.etag
        self._fd = opened.fd
        self._fetch = opened.fetch
        self._pos = 0
        self._on_read = on_read
        self._details = details or {}
        self._on_tier_full = on_tier_full
        self._direct: io.RawIOBase | None = None  # the store, once the tier filled up
        self._on_wait = on_wait  # seconds a read blocked on bytes still being fetched

    def __repr__(self) -> str:
        return f"<CachedFile {self.path!r} size={self.size} pos={self._pos}>"

    def info(self) -> dict[str, Any]:
        return {
            "name": self.path,
            "size": self.size,
            "type": "file",
            "ETag": self.etag,
            **self._details,
        }

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a cached object has no public file descriptor")

    def _available(self, start: int, count: int) -> int:
        """Wait until ``count`` bytes from ``start`` are on disk; return how many to read."""
        count = max(0, min(count, self.size - start))
        fetch = self._fetch
        if fetch is not None and count:
            waited_from = time.monotonic()
            try:
                fetch.wait_range(start, start + count)
            except OSError as exc:
                self._direct = self._on_tier_full(exc) if self._on_tier_full else None
                if self._direct is None:
                    raise
                self._fetch = None
                return count
            if self._on_wait is not None:
                self._on_wait(time.monotonic() - waited_from)
            if fetch.finished:
                self._fetch = None
        return count

    def _read_direct(self, buffer: Any) -> int:
        """The tier filled up during the fetch: the rest comes straight from the store."""
        assert self._direct is not None
        self._direct.seek(self._pos)
        got = self._direct.readinto(buffer) or 0
        self._pos += got
        self._on_read(got)
        return got

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        view = memoryview(buffer).cast("B")
        count = self._available(self._pos, min(len(view), _MAX_PREAD))
        if count == 0:
            return 0
        if self._direct is not None:
            return self._read_direct(view[:count])
        got = os.preadv(self._fd, [view[:count]], self._pos)
        self._pos += got
        self._on_read(got)
        return got

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        if size is None or size < 0:
            size = self.size - self._pos
        fetch = self._fetch
        if fetch is not None:
            fetch.expect_read(self._pos, max(0, min(size, self.size - self._pos)))
        count = self._available(self._pos, size)
        if count == 0:
            return b""
        if self._direct is not None:
            buffer = bytearray(count)
            got = 0
            while got < count and (step := self._read_direct(memoryview(buffer)[got:])):
                got += step
            return bytes(buffer[:got])
        handed = fetch.take(self._pos, count) if fetch is not None else None
        if handed is not None:
            data = handed  # the chunk the fetch just wrote to the tier: no copy back
        elif count <= _MAX_PREAD:
            data = os.pread(self._fd, count, self._pos)
        else:
            buffer = bytearray(count)
            got = 0
            while got < count:
                got += self.readinto(memoryview(buffer)[got:])
            return bytes(buffer)
        self._pos += len(data)
        self._on_read(len(data))
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def peek(self, size: int = 0) -> bytes:
        """Bytes from the current position without consuming them (lets ``readline`` run fast)."""
        self._checkClosed()
        count = self._available(self._pos, max(size, 64 * 1024))
        if self._direct is not None:
            return b""  # no look-ahead from the store: readline falls back to read(1)
        return os.pread(self._fd, count, self._pos) if count else b""

    def close(self) -> None:
        if not self.closed:
            if self._fetch is not None:
                self._fetch.detach_reader()
            os.close(self._fd)  # also releases the shared lock that guards against eviction
            if self._direct is not None:
                self._direct.close()
        super().close()
