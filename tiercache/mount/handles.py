"""The mount's open files: read handles over cached objects, write handles over staged files.

A FUSE write arrives as ``(bytes, offset)``. A write handle stages the object with
``fs.open(path, "wb")`` and writes to the staged file's descriptor with ``pwrite``, so
sequential writers (``cp``, ``dd``) and writers that seek back (a header patched at the end)
both work; each ``flush`` (every ``close()`` of a descriptor) commits what was written through
write-behind, so once ``close()`` returns the bytes are durable in the local tier and queued.
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
from typing import Any, Protocol

from tiercache.errors import TierFullError
from tiercache.write.staged import StagedWriteFile

_COPY_CHUNK = 8 << 20


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


class WriteHandle:
    """An object open for writing, staged in the local tier and committed on flush."""

    def __init__(self, fs: Any, path: str, full: str, keep_contents: bool) -> None:
        self.path = path
        self.full = full
        self._fs = fs
        self._lock = threading.Lock()
        self._file: StagedWriteFile | None = None
        self._broken: OSError | None = None
        self.dirty = not keep_contents  # a new or truncated file is committed even if empty
        self._committed_size = 0
        self._stage(copy_existing=keep_contents)

    def _stage(self, copy_existing: bool) -> None:
        """Open a fresh staged file, starting from the object's bytes when they are kept."""
        staged = self._fs.open(self.full, "wb")
        try:
            fd = staged.fileno()
            if copy_existing:
                with self._fs.open(self.full, "rb") as src:
                    offset = 0
                    while chunk := src.read(_COPY_CHUNK):
                        offset += self._pwrite_all(fd, chunk, offset)
        except FileNotFoundError:
            pass  # nothing to keep: the object does not exist (yet)
        except BaseException:
            staged.discard()
            raise
        self._file = staged

    @staticmethod
    def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> int:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)
        return done

    def _fd(self) -> int:
        if self._file is None:  # written again after a commit (a dup'ed descriptor)
            self._stage(copy_existing=True)
        assert self._file is not None
        return self._file.fileno()

    def write(self, data: bytes, offset: int) -> int:
        with self._lock:
            if self._broken is not None:
                raise self._broken
            try:
                done = self._pwrite_all(self._fd(), data, offset)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    # A file missing bytes must never be committed.
                    self._broken = TierFullError(
                        errno.ENOSPC, f"no space left in the local tier writing {self.path}"
                    )
                    raise self._broken from exc
                raise
            self.dirty = True
            return done

    def read(self, size: int, offset: int) -> bytes:
        with self._lock:
            return os.pread(self._fd(), size, offset)

    def read_into(self, buffer: memoryview, offset: int) -> int:
        with self._lock:
            return os.preadv(self._fd(), [buffer], offset)

    def truncate(self, length: int) -> None:
        with self._lock:
            os.ftruncate(self._fd(), length)
            self.dirty = True

    def size(self) -> int:
        with self._lock:
            if self._file is None:
                return self._committed_size
            return os.fstat(self._file.fileno()).st_size

    def fsync(self) -> None:
        with self._lock:
            if self._file is not None:
                os.fsync(self._file.fileno())

    def commit(self) -> int | None:
        """Hand what was written to write-behind; returns the committed size (None: nothing)."""
        with self._lock:
            if self._broken is not None:
                self._discard()
                raise self._broken
            if self._file is None:
                return None
            if not self.dirty:
                self._discard()
                return None
            size = os.fstat(self._file.fileno()).st_size
            staged, self._file = self._file, None
            staged.close()  # fsync, journal, publish: durable before close() returns
            self.dirty = False
            self._committed_size = size
            return size

    def close(self) -> None:
        """Commit anything not yet committed (release without a flush)."""
        try:
            self.commit()
        finally:
            with self._lock:
                self._discard()

    def _discard(self) -> None:
        if self._file is not None:
            self._file.discard()
            self._file = None


Handle = ReadHandle | WriteHandle


class HandleTable:
    """Open handles by number (the ``fh`` the kernel passes back), and writers by path."""

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

    def writer_for(self, path: str) -> WriteHandle | None:
        """The newest handle writing ``path`` (its size is the file's size while it is open)."""
        with self._lock:
            writers = [h for h in self._handles.values() if isinstance(h, WriteHandle)]
        for handle in reversed(writers):
            if handle.path == path:
                return handle
        return None

    def writers_under(self, directory: str) -> list[WriteHandle]:
        prefix = directory.rstrip("/") + "/"
        with self._lock:
            return [
                h
                for h in self._handles.values()
                if isinstance(h, WriteHandle) and h.path.startswith(prefix)
            ]

    def pop_all(self) -> list[Handle]:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
            return handles

    def __len__(self) -> int:
        with self._lock:
            return len(self._handles)
