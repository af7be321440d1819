"""The mount's open files: read handles over cached objects, entry handles over writable files."""

from __future__ import annotations

import errno
import itertools
import threading
from typing import Any, Protocol

from tiercache.mount.writable import WritableFile


class ReadObserver(Protocol):
    """Where a read-ahead engine plugs in: told of every open for reading and every read.

    The mount itself reads only what the kernel asks for (the kernel's own read-ahead and
    large requests keep a sequential reader busy); a prefetch engine given to the operations
    sees the access pattern here and fills the tier ahead of it.
    """

    def opened(self, path: str, size: int) -> None: ...

    def read(self, path: str, offset: int, size: int) -> None: ...


class ReadHandle:
    """An object open for reading: a tiercache file object read at explicit offsets."""

    def __init__(self, path: str, file: Any) -> None:
        self.path = path
        self._file = file
        self._lock = threading.Lock()  # the kernel may send parallel reads on one handle

    def read(self, size: int, offset: int) -> bytes:
        with self._lock:
            self._file.seek(offset)
            data: bytes = self._file.read(size)
            return data

    def read_into(self, buffer: memoryview, offset: int) -> int:
        """Fill ``buffer`` from ``offset`` (short only at the end of the object)."""
        with self._lock:
            self._file.seek(offset)
            done = 0
            while done < len(buffer):
                got = self._file.readinto(buffer[done:])
                if not got:
                    break
                done += got
            return done

    def close(self) -> None:
        self._file.close()


class EntryHandle:
    """A descriptor of a file open for writing: reads and writes go to its ``WritableFile``.

    ``pending`` tracks whether this descriptor wrote (or opened for writing) since its last
    ``flush``; a file none of whose descriptors is pending has been closed by every process
    and only waits for the kernel's release.
    """

    def __init__(self, entry: WritableFile, writable: bool) -> None:
        self.entry = entry
        self.writable = writable
        self.pending = False
        if writable:
            self._mark_pending()

    @property
    def path(self) -> str:
        return self.entry.path

    def _mark_pending(self) -> None:
        if not self.pending:
            self.pending = True
            self.entry.count_unclosed(1)

    def flushed(self) -> None:
        if self.pending:
            self.pending = False
            self.entry.count_unclosed(-1)

    def read(self, size: int, offset: int) -> bytes:
        buffer = bytearray(size)
        done = self.entry.read_into(memoryview(buffer), offset)
        return bytes(buffer[:done])

    def read_into(self, buffer: memoryview, offset: int) -> int:
        return self.entry.read_into(buffer, offset)

    def write(self, data: bytes, offset: int) -> int:
        if not self.writable:
            raise OSError(errno.EBADF, "not open for writing")
        self._mark_pending()
        return self.entry.write(data, offset)


Handle = ReadHandle | EntryHandle


class HandleTable:
    """Open handles by number (the ``fh`` the kernel passes back)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._handles: dict[int, Handle] = {}

    def add(self, handle: Handle) -> int:
        with self._lock:
            number = next(self._numbers)
            self._handles[number] = handle
            return number

    def get(self, number: int) -> Handle:
        with self._lock:
            handle = self._handles.get(number)
        if handle is None:
            raise OSError(errno.EBADF, "no such open file")
        return handle

    def pop(self, number: int) -> Handle | None:
        with self._lock:
            return self._handles.pop(number, None)

    def pop_all(self) -> list[Handle]:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
            return handles

    def __len__(self) -> int:
        with self._lock:
            return len(self._handles)
