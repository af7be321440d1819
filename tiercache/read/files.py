"""The file objects ``open(..., "rb")`` returns, and what they read from.

- ``CachedFile``: a published entry or a fetch still arriving (``OpenedObject``), read with
  ``pread``; it waits only for the bytes it asks for, and checks digests per ``verify``.
- ``RangeFirstFile``: a cold object whose fetch waits after its first part; the first reads
  decide whether it is fetched whole or read by blocks (see ``Fetch.decide``).
- ``BlockFile``: an object cached block by block (``read.blocks``).
- ``DirectFile``: straight from the store, when the tier has no room.

The details of each are in its class.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiercache.read.blocks import BlockFetcher, BlockSource
from tiercache.read.fetch import BlockModeRequiredError, Fetch
from tiercache.read.ranges import RangedGet
from tiercache.store.base import ObjectInfo, ObjectStore
from tiercache.store.retry import RetryPolicy
from tiercache.tiers.blocks import BlockEntry
from tiercache.verify import DigestCheck


@dataclass(frozen=True)
class OpenedObject:
    """An open file descriptor on an object's bytes: a published entry or a growing fetch."""

    fd: int
    size: int
    etag: str
    fetch: Fetch | None
    blocks: BlockEntry | None = None  # a huge object cached block by block (fd is -1)
    # ``verify="first"``: the digest check still running on these bytes, and how to open the
    # object afresh should it fail before the reader had any of them.
    check: DigestCheck | None = None
    reopen: Callable[[], OpenedObject] | None = None


def seek_target(position: int, size: int, offset: int, whence: int) -> int:
    """The absolute position ``seek(offset, whence)`` moves to; ValueError if it is invalid."""
    bases = {io.SEEK_SET: 0, io.SEEK_CUR: position, io.SEEK_END: size}
    if whence not in bases:
        raise ValueError(f"invalid whence {whence}")
    target = bases[whence] + offset
    if target < 0:
        raise ValueError(f"negative seek position {target}")
    return target


class SeekableReader(io.RawIOBase):
    """A read-only binary file of a known ``size`` with a position: readable, seek, tell."""

    size: int
    _pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        self._pos = seek_target(self._pos, self.size, offset, whence)
        return self._pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos


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
        self._check = opened.check
        self._reopen = opened.reopen
        self._next = 0  # where a sequential reader reads next
        self._handed = False  # whether the caller got any byte yet
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

    def settled_fd(self) -> int | None:
        """The descriptor of the whole tier copy, for the kernel to read itself (the mount's
        passthrough); None while its bytes still arrive, a digest check of them runs, or the
        object is read from the store instead. Valid until ``close``."""
        if self._fetch is not None or self._check is not None or self._direct is not None:
            return None
        return self._fd

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
            if start + count == self.size:
                # The object's last bytes: its process may end as soon as the reader has them,
                # and the fetch's thread with it, before the entry is published; the processes
                # waiting on the entry lock would then fetch the object again.
                fetch.wait_released()
            if self._on_wait is not None:
                self._on_wait(time.monotonic() - waited_from)
            if fetch.finished:
                self._fetch = None
        return count

    def _check_before(self, size: int) -> None:
        """Before a read of up to ``size`` bytes: the verdict of the digest check, if the read
        is out of order or the check has ended (see the module)."""
        while (check := self._check) is not None:
            left = self.size - self._pos
            if (min(size, left) if size >= 0 else left) <= 0:
                return
            if not check.finished and self._pos == self._next:
                return  # in order: its bytes are hashed as they are read, if not already
            if self._settle(check):
                return

    def _check_after(self, data: bytes | memoryview) -> bool:
        """Bytes read from the position, before they are handed over: hashed if the check is
        behind them, and the verdict if they are the object's last. False: the entry was
        corrupt and the object fetched again, read it from there."""
        check = self._check
        if check is None:
            return True
        check.feed(self._pos, data)
        if self._pos + len(data) < self.size and not check.finished:
            return True
        return self._settle(check)

    def _settle(self, check: DigestCheck) -> bool:
        """Wait for the verdict: True if the bytes are good; False if the corrupt entry was
        replaced by a fresh fetch (the reader had none of its bytes); else raise."""
        if check.verdict():
            self._check = None
            return True
        if check.dirty or self._handed or self._reopen is None:
            raise check.error(self._handed)
        opened = self._reopen()  # the corrupt entry was dropped: fetched again
        if opened.blocks is not None:  # now too big to be read whole: open it again
            opened.blocks.close()
            raise check.error(handed=False)
        os.close(self._fd)
        self._fd, self._fetch = opened.fd, opened.fetch
        self._check, self._reopen = opened.check, opened.reopen
        self.size, self.etag = opened.size, opened.etag
        self._next = 0
        return False

    def _served(self, count: int) -> None:
        self._pos += count
        self._next = self._pos
        self._handed = self._handed or count > 0
        self._on_read(count)

    def _read_direct(self, buffer: Any) -> int:
        """The tier filled up during the fetch: the rest comes straight from the store."""
        assert self._direct is not None
        self._direct.seek(self._pos)
        got = self._direct.readinto(buffer) or 0
        self._served(got)
        return got

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        view = memoryview(buffer).cast("B")
        self._check_before(min(len(view), _MAX_PREAD))
        count = self._available(self._pos, min(len(view), _MAX_PREAD))
        if count == 0:
            return 0
        if self._direct is not None:
            return self._read_direct(view[:count])
        got = os.preadv(self._fd, [view[:count]], self._pos)
        if not self._check_after(view[:got]):
            return self.readinto(buffer)  # from the object fetched again
        self._served(got)
        return got

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        asked = -1 if size is None else size
        self._check_before(asked)
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
            if not self._check_after(data):
                return self.read(asked)  # from the object fetched again
        else:
            buffer = bytearray(count)
            got = 0
            while got < count:
                got += self.readinto(memoryview(buffer)[got:])
            return bytes(buffer)
        self._served(len(data))
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def peek(self, size: int = 0) -> bytes:
        """Bytes from the current position without consuming them (lets ``readline`` run fast)."""
        self._checkClosed()
        self._check_before(max(size, 64 * 1024))
        count = self._available(self._pos, max(size, 64 * 1024))
        if self._direct is not None or not count:
            return b""  # no look-ahead from the store: readline falls back to read(1)
        data = os.pread(self._fd, count, self._pos)
        if not self._check_after(data):
            return self.peek(size)  # from the object fetched again
        self._handed = self._handed or bool(data)
        return data

    def close(self) -> None:
        if not self.closed:
            if self._fetch is not None:
                self._fetch.detach_reader()
            if self._check is not None:
                self._check.cancel()
            os.close(self._fd)  # also releases the shared lock that guards against eviction
            if self._direct is not None:
                self._direct.close()
        super().close()


class ReadPattern:
    """How a reader of a cold object reads: in order (worth fetching the object whole) or here
    and there (worth reading by ranges or blocks). One rule for the file objects and the mount.
    """

    # Reads in order, in a row, that make a reader sequential. A read away from where the
    # last one ended starts no row: counted as the first of one, a random reader turned
    # sequential whenever one read happened to land near the end of the one before (on the
    # mount, with the kernel's read-ahead, a few times in a thousand reads), and had the
    # object fetched whole for a few KiB read.
    SEQUENTIAL_READS = 2

    def __init__(self, slack_reads: int = 0) -> None:
        # Reads this many read sizes away from where the last one ended still count as in
        # order (the kernel's read-ahead sends a sequential reader's requests in parallel, so
        # they reach the mount a little out of order).
        self._slack = slack_reads
        self._next = 0
        self.in_a_row = 0

    def read(self, offset: int, size: int) -> bool:
        """A read of ``size`` bytes at ``offset`` is about to be served: whether it is in order."""
        in_order = abs(offset - self._next) <= self._slack * size
        self.in_a_row = self.in_a_row + 1 if in_order else 0
        return in_order

    @property
    def sequential(self) -> bool:
        return self.in_a_row >= self.SEQUENTIAL_READS

    def moved_to(self, offset: int) -> None:
        """The reader is now at ``offset`` (its last read ended there, or it seeked)."""
        self._next = offset


class RangeFirstFile(SeekableReader):
    """A cold object whose fetch waits after its first part: the first reads decide the rest.

    Reads within the first part are served from it while nothing is decided. A read in order
    from the start that goes on (``ReadPattern.sequential``, one of ``STREAMING_READ`` bytes
    or more, or past the first part) has the object fetched whole, read as it arrives. A read
    away from the start (a footer, an index) stops the fetch and turns the object into a block
    entry: only the blocks read are fetched (and the rest in the background once
    ``whole_object_after`` of them were read).
    """

    # A first read from the start this large is a reader streaming the object (headers and
    # magic numbers are read in far smaller pieces): the rest is fetched at once.
    STREAMING_READ = 1 << 20

    def __init__(
        self,
        whole: CachedFile,
        fetch: Fetch,
        open_blocks: Callable[[ObjectInfo], SeekableReader],
    ) -> None:
        super().__init__()
        self.path = self.name = whole.path
        self.mode = "rb"
        self.size = whole.size
        self.etag = whole.etag
        self._whole = whole
        self._fetch = fetch
        self._open_blocks = open_blocks
        self._front = fetch.first_part_end()
        self._decided: SeekableReader | None = None
        self._pos = 0
        self._pattern = ReadPattern()

    def __repr__(self) -> str:
        return f"<RangeFirstFile {self.path!r} size={self.size} pos={self._pos}>"

    def info(self) -> dict[str, Any]:
        return self._whole.info()

    def fetch_whole(self) -> None:
        """The caller reads the object through: fetch it whole whatever the first reads."""
        if self._decided is None:
            self._decide(whole=True)

    def _reader(self, size: int) -> SeekableReader:
        """The file object that serves a read of ``size`` bytes (-1: all) from the position."""
        if self._decided is None:
            end = self.size if size < 0 else min(self.size, self._pos + size)
            in_order = self._pattern.read(self._pos, max(size, 0))
            streaming = in_order and (
                self._pattern.sequential or end - self._pos >= self.STREAMING_READ
            )
            if end > self._front or streaming:
                self._decide(whole=in_order)
        reader = self._decided or self._whole
        reader.seek(self._pos)
        return reader

    def _decide(self, whole: bool) -> None:
        if self._fetch.decide(whole):
            self._decided = self._whole
            return
        self._whole.close()
        try:
            self._fetch.wait_finished()  # stops at its next chunk, releasing the entry lock
        except BlockModeRequiredError:
            pass
        assert self._fetch.info is not None
        self._decided = self._open_blocks(self._fetch.info)

    def _moved(self, reader: SeekableReader) -> None:
        self._pos = reader.tell()
        self._pattern.moved_to(self._pos)

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        size = len(memoryview(buffer).cast("B"))
        return int(self._serve(size, lambda reader: reader.readinto(buffer) or 0))

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        count = -1 if size is None else size
        return bytes(self._serve(count, lambda reader: reader.read(count)))

    def _serve(self, size: int, read: Callable[[SeekableReader], Any]) -> Any:
        reader = self._reader(size)
        try:
            result = read(reader)
        except BlockModeRequiredError:  # another reader of this fetch chose blocks
            if self._decided is not None:
                raise
            self._decide(whole=False)
            reader = self._reader(size)
            result = read(reader)
        self._moved(reader)
        return result

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if not self.closed:
            if self._decided is None:
                self._fetch.decide(True)  # opened, never read away from the start: keep it
            self._whole.close()
            if self._decided is not None:
                self._decided.close()
        super().close()


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
        self._get: RangedGet | None = None  # the GET open from ``_pos`` on, if any

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
        if self._get is None:
            self._get = RangedGet(
                self._store, self._bucket, self._key, self.etag, self._pos, self.size, self._retry
            )
        count = self._get.readinto(memoryview(buffer).cast("B"))
        self._pos += count
        return count

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
        get, self._get = self._get, None
        if get is not None:
            get.close()
