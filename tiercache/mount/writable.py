"""``WritableFile``: a file open for writing through the mount, shared by all its descriptors.

Every open of a path for writing, and every open for reading while it is open for writing,
uses the path's one ``WritableFile`` (counted by ``WritableFiles``), so all descriptors see the
same bytes, as on a local filesystem. Until something is written it reads the object through
the cache; the first write or truncate stages the file in the local tier
(``fs.open(path, "wb")``), starting from the object's bytes, and from then on every read,
write and ``mmap`` page is served by the staged file.

It is committed through write-behind when its last descriptor is released, never while it is
open anywhere: FUSE sends ``flush`` at every ``close(2)`` of every duplicated descriptor, so a
flush only makes the staged bytes durable (and reports a failed write to ``close``). Nothing
is committed when nothing was written, when the file was unlinked while open, or when the last
process to close it after its last write was killed by a signal (``caller``): a ``dd`` killed
mid-copy leaves the object as it was.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from tiercache.errors import tier_full
from tiercache.write.staged import StagedWriteFile

log = logging.getLogger("tiercache.mount")

_COPY_CHUNK = 8 << 20


class WritableFile:
    """One path open for writing: staged bytes, open count, and the decision to commit."""

    def __init__(self, fs: Any, path: str, full: str, size_of: Callable[[], int | None]) -> None:
        self.path = path
        self.full = full
        self.opens = 0  # descriptors (FUSE handles); changed by ``WritableFiles`` only
        self.unclosed = 0  # writable handles written to or opened since their last flush
        self.unlinked = False
        self.done = threading.Event()  # set once the last release has committed or discarded
        self.mtime_ns = time.time_ns()
        self._fs = fs
        self._size_of = size_of
        self._base: int | None = None  # the object's size when opened (None: not looked up)
        self._based = False
        self._lock = threading.Lock()
        self._staged: StagedWriteFile | None = None
        self._fd = -1
        self._reader: Any = None
        self._broken: OSError | None = None
        self._dirty = False
        self._synced = True
        self._killed = False

    def __repr__(self) -> str:
        return f"<WritableFile {self.path!r} opens={self.opens} dirty={self._dirty}>"

    # -- what descriptors do -----------------------------------------------------------------

    def count_unclosed(self, delta: int) -> None:
        with self._lock:
            self.unclosed += delta

    def size(self) -> int:
        with self._lock:
            if self._staged is not None:
                return os.fstat(self._fd).st_size
            return self._object_size() or 0

    def read_into(self, buffer: memoryview, offset: int) -> int:
        """Fill ``buffer`` from ``offset`` (short only at the end of the file)."""
        with self._lock:
            if self._staged is not None:
                done = 0
                while done < len(buffer):
                    got = os.preadv(self._fd, [buffer[done:]], offset + done)
                    if not got:
                        break
                    done += got
                return done
            if not self._object_size():
                return 0
            reader = self._open_reader()
            reader.seek(offset)
            done = 0
            while done < len(buffer):
                got = reader.readinto(buffer[done:])
                if not got:
                    break
                done += got
            return done

    def write(self, data: bytes | memoryview, offset: int) -> int:
        with self._lock:
            self._check()
            fd = self._stage(keep=None)
            try:
                done = _pwrite_all(fd, data, offset)
            except OSError as exc:
                raise self._failed(exc) from exc
            self._changed()
            return done

    def truncate(self, length: int) -> None:
        with self._lock:
            self._check()
            fd = self._stage(keep=length)
            try:
                os.ftruncate(fd, length)
            except OSError as exc:
                raise self._failed(exc) from exc
            self._changed()

    def flush(self, killed: bool, closed_by_live_process: bool = False) -> None:
        """A descriptor was closed (``killed``: by a process a signal killed;
        ``closed_by_live_process``: by a close(2) that returns to its caller, whose write must
        then survive a crash of the mount before the last release commits it)."""
        with self._lock:
            self._check()
            if killed and self._dirty:
                self._killed = True
            self._sync()
            if closed_by_live_process:
                self._mark_closed()

    def fsync(self) -> None:
        with self._lock:
            self._check()
            self._sync()
            self._mark_closed()

    def _mark_closed(self) -> None:
        """Should the mount die before the last release, ``reconcile`` commits what was
        staged (what a close or an fsync acknowledged) instead of dropping it."""
        if self._staged is not None and self._dirty and not self._killed:
            try:
                self._staged.mark_closed(self._fs.store.namespace)
            except OSError as exc:
                raise self._failed(exc) from exc

    # -- the end -----------------------------------------------------------------------------

    def commit(self) -> int | None:
        """Publish the staged bytes through write-behind; the committed size, or None.

        Called at the last release (or to publish before a rename of an open file); the file
        stays usable: a later write stages it again from what was committed.
        """
        with self._lock:
            self._close_reader()
            staged, self._staged, self._fd = self._staged, None, -1
            if staged is None:
                return None
            if self._broken is not None or self.unlinked or self._killed or not self._dirty:
                staged.discard()
                if self._broken is not None:
                    raise self._broken
                if self._killed:
                    log.warning(
                        "%s: not committed: the last process to close it after writing was "
                        "killed by a signal (the object is left as it was)",
                        self.path,
                    )
                self._dirty = self._killed = False
                return None
            size = os.fstat(staged.fileno()).st_size
            staged.close()  # fsync, journal, publish: durable once this returns
            self._dirty = False
            self._base, self._based = size, True
            return size

    def discard(self) -> None:
        with self._lock:
            self._close_reader()
            if self._staged is not None:
                self._staged.discard()
                self._staged, self._fd = None, -1

    # -- inside ------------------------------------------------------------------------------

    def _object_size(self) -> int | None:
        if not self._based:
            self._base, self._based = self._size_of(), True
        return self._base

    def _stage(self, keep: int | None) -> int:
        """The staged file's descriptor, staged first with the object's first ``keep`` bytes
        (None: all of them)."""
        if self._staged is not None:
            return self._fd
        staged = self._fs.open(self.full, "wb")
        try:
            fd: int = staged.fileno()
            if (keep is None or keep > 0) and self._object_size():
                self._copy_object(fd, keep)
        except BaseException:
            staged.discard()
            raise
        self._close_reader()
        self._staged, self._fd = staged, fd
        return fd

    def _copy_object(self, fd: int, keep: int | None) -> None:
        reader = self._open_reader()
        reader.seek(0)
        offset = 0
        while keep is None or offset < keep:
            want = _COPY_CHUNK if keep is None else min(_COPY_CHUNK, keep - offset)
            chunk = reader.read(want)
            if not chunk:
                break
            try:
                offset += _pwrite_all(fd, chunk, offset)
            except OSError as exc:
                raise _tier_full(exc, self.path) from exc

    def _open_reader(self) -> Any:
        if self._reader is None:
            self._reader = self._fs.open(self.full, "rb")
        return self._reader

    def _close_reader(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.close()

    def _changed(self) -> None:
        self._dirty = True
        self._synced = False
        self._killed = False
        self.mtime_ns = time.time_ns()

    def _sync(self) -> None:
        if self._staged is not None and not self._synced:
            try:
                os.fsync(self._fd)  # delayed allocation can report ENOSPC only here
            except OSError as exc:
                raise self._failed(exc) from exc
            self._synced = True

    def _check(self) -> None:
        if self._broken is not None:
            raise self._broken

    def _failed(self, exc: OSError) -> OSError:
        full = _tier_full(exc, self.path)
        if full is not exc:
            self._broken = full  # a file missing bytes must never be committed
        return full


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> int:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return done


def _tier_full(exc: OSError, path: str) -> OSError:
    return tier_full(exc, f"no space left in the local tier writing {path}")


class WritableFiles:
    """The ``WritableFile`` of each path open for writing, and those being committed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, WritableFile] = {}
        self._closing: dict[str, WritableFile] = {}

    def acquire(self, path: str, make: Callable[[], WritableFile]) -> WritableFile:
        """The path's open file (``make`` makes it if none), counted as one more open.

        A new one waits for the commit of the path's previous one, so it starts from it.
        """
        while True:
            with self._lock:
                entry = self._live.get(path)
                closing = self._closing.get(path) if entry is None else None
                if entry is None and closing is None:
                    entry = self._live[path] = make()
                if entry is not None:
                    entry.opens += 1
                    return entry
            closing.done.wait()  # type: ignore[union-attr]

    def attach(self, path: str) -> WritableFile | None:
        """The path's open file counted as one more open, or None when it is not open."""
        self.settle(path)
        with self._lock:
            entry = self._live.get(path)
            if entry is not None:
                entry.opens += 1
            return entry

    def release(self, entry: WritableFile) -> bool:
        """One open fewer; True when it was the last (the caller commits, then ``finished``)."""
        with self._lock:
            entry.opens -= 1
            if entry.opens > 0:
                return False
            if self._live.get(entry.path) is entry:
                del self._live[entry.path]
                self._closing[entry.path] = entry
            return True

    def finished(self, entry: WritableFile) -> None:
        with self._lock:
            if self._closing.get(entry.path) is entry:
                del self._closing[entry.path]
        entry.done.set()

    def settle(self, path: str) -> None:
        """Wait while the path's last file is being committed."""
        with self._lock:
            closing = self._closing.get(path)
        if closing is not None:
            closing.done.wait()

    def current(self, path: str) -> WritableFile | None:
        """The path's open file, or the one being committed (it has the path's bytes)."""
        with self._lock:
            return self._live.get(path) or self._closing.get(path)

    def under(self, directory: str) -> list[WritableFile]:
        prefix = directory.rstrip("/") + "/"
        with self._lock:
            entries = {**self._closing, **self._live}
        return [e for path, e in entries.items() if path.startswith(prefix)]

    def detach(self, path: str) -> WritableFile | None:
        """Unlinked (or replaced by a rename) while open: it is never committed."""
        self.settle(path)
        with self._lock:
            entry = self._live.pop(path, None)
            if entry is not None:
                entry.unlinked = True
            return entry

    def move(self, entry: WritableFile, new: str, full: str) -> None:
        """Renamed while open: later writes are committed under the new name."""
        with self._lock:
            if self._live.get(entry.path) is entry:
                del self._live[entry.path]
            entry.path, entry.full = new, full
            self._live[new] = entry

    def everything(self) -> list[WritableFile]:
        with self._lock:
            return list(self._live.values())
