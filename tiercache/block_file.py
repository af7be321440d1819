"""``BlockFile``: the read-only file object over a block-granular entry (a huge object).

Each read fetches only the blocks it touches (see ``BlockFetcher``); a sequential reader has
the next blocks fetched ahead of it. Each block is checked against its logged digest before
it is first served (per ``verify``, see ``BlockFetcher.check``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tiercache.block_fetch import BlockFetcher, BlockSource
from tiercache.seek import SeekableReader
from tiercache.tiers.blocks import BlockEntry

_MAX_READ = 1 << 30


class BlockFile(SeekableReader):
    """A seekable, read-only binary file over an object cached block by block."""

    def __init__(
        self,
        path: str,
        entry: BlockEntry,
        src: BlockSource,
        fetcher: BlockFetcher,
        on_read: Callable[[int], None],
        verify: bool = False,
    ) -> None:
        super().__init__()
        self.path = path
        self.name = path
        self.mode = "rb"
        self.size = entry.meta.size
        self.etag = entry.meta.etag
        self._entry = entry
        self._src = src
        self._fetcher = fetcher
        self._on_read = on_read
        # verify="always": blocks checked by this file object (else the fetcher's memo).
        self._verified: set[int] | None = set() if verify else None
        self._pos = 0
        self._last_end = -1

    def __repr__(self) -> str:
        return f"<BlockFile {self.path!r} size={self.size} pos={self._pos}>"

    def info(self) -> dict[str, Any]:
        return {"name": self.path, "size": self.size, "type": "file", "ETag": self.etag}

    def _prepare(self, count: int) -> int:
        """Fetch what ``count`` bytes from the position need; return how many to read."""
        count = max(0, min(count, self.size - self._pos, _MAX_READ))
        if not count:
            return 0
        start, end = self._pos, self._pos + count
        self._fetcher.ensure(self._entry, self._src, start, end)
        self._fetcher.check(self._entry, self._src, start, end, self._verified)
        if start == self._last_end:  # sequential: keep the next blocks coming
            self._fetcher.read_ahead(self._entry, self._src, end)
        self._last_end = end
        self._fetcher.maybe_complete(self._entry, self._src)
        return count

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        view = memoryview(buffer).cast("B")
        count = self._prepare(len(view))
        if not count:
            return 0
        got = self._entry.preadv(view[:count], self._pos)
        self._pos += got
        self._on_read(got)
        return got

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        if size is None or size < 0:
            size = self.size - self._pos
        count = self._prepare(size)
        if not count:
            return b""
        data = self._entry.pread(count, self._pos)
        self._pos += len(data)
        self._on_read(len(data))
        return data

    def readall(self) -> bytes:
        chunks = []
        while chunk := self.read(_MAX_READ):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if not self.closed:
            self._entry.touch()
            self._entry.close()
        super().close()
