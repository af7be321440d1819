"""The mount's open files: read handles (cached or cold objects), entry handles (writable)."""

from __future__ import annotations

import errno
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from tiercache.mount.writable import WritableFile
from tiercache.read.files import ReadPattern
from tiercache.read.ranges import RangedGet
from tiercache.store.retry import RetryPolicy


class ReadObserver(Protocol):
    """Where a read-ahead engine plugs in: told of each file read through the cache, each read.

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

    def settled_fd(self) -> int | None:
        """The tier file's descriptor, where the kernel may read the object itself."""
        settled = getattr(self._file, "settled_fd", None)
        return None if settled is None else settled()

    def close(self) -> None:
        with self._lock:  # a read under way on this handle ends first
            self._file.close()


# A read within this many read sizes of where the last one ended counts as the next one.
_NEAR_READS = 4


class ColdReadHandle:
    """An object not in the tier, opened for reading: nothing is fetched until it is read.

    Reads out of order are served by ranged GETs of just the bytes asked for (pinned to the
    ETag seen at open), so a random reader moves about what it reads. Once the reads run
    sequentially (``ReadPattern.sequential``, the read path's rule), the ranges have moved as
    many bytes as the object holds, or one read asks for all of it (a small file), the object
    is opened through the cache (fetched whole, read as it arrives) and ``on_whole`` is
    called: a random reader moves at most twice what it reads.
    """

    def __init__(
        self,
        path: str,
        size: int,
        read_range: Callable[[int, memoryview], int],
        open_whole: Callable[[], Any],
        on_whole: Callable[[int], None] | None = None,
    ) -> None:
        self.path = path
        self.size = size
        self._read_range = read_range
        self._open_whole = open_whole
        self._on_whole = on_whole
        self._whole: ReadHandle | None = None
        self._lock = threading.Lock()
        # The kernel's read-ahead reorders a sequential reader's requests a little.
        self._pattern = ReadPattern(slack_reads=_NEAR_READS)
        self._ranged_bytes = 0

    def settled_fd(self) -> int | None:
        """None: its bytes are not all in the tier (the mount serves its reads)."""
        return None

    def read(self, size: int, offset: int) -> bytes:
        buffer = bytearray(size)
        done = self.read_into(memoryview(buffer), offset)
        return bytes(buffer[:done])

    def read_into(self, buffer: memoryview, offset: int) -> int:
        with self._lock:
            whole = self._whole
            if whole is None:
                self._pattern.read(offset, len(buffer))
                if (
                    self._pattern.sequential
                    or self._ranged_bytes >= self.size
                    or len(buffer) >= self.size  # one read takes it all: fetch it, keep it
                ):
                    whole = self._whole = ReadHandle(self.path, self._open_whole())
                    if self._on_whole is not None:
                        self._on_whole(self.size)
            if whole is None:
                view = buffer[: max(0, min(len(buffer), self.size - offset))]
                done = self._read_range(offset, view) if len(view) else 0
                self._ranged_bytes += done
                self._pattern.moved_to(offset + done)
                if self._ranged_bytes >= self.size:  # read through once: fetch it, keep it
                    self._whole = ReadHandle(self.path, self._open_whole())
                    if self._on_whole is not None:
                        self._on_whole(self.size)
                return done
        return whole.read_into(buffer, offset)

    def close(self) -> None:
        with self._lock:
            whole, self._whole = self._whole, None
        if whole is not None:
            whole.close()


def ranged_reader(fs: Any, full: str, etag: str | None) -> Callable[[int, memoryview], int]:
    """Read ``[offset, offset + len(view))`` of ``full`` from the store (one ranged GET,
    resumed with backoff where its stream breaks: the read path's ``RangedGet``)."""
    bucket, key = fs.split_path(full)
    retry = RetryPolicy(attempts=max(1, int(fs.config.retries)))

    def read_range(offset: int, view: memoryview) -> int:
        get = RangedGet(fs.store, bucket, key, etag, offset, offset + len(view), retry)
        done = 0
        try:
            while done < len(view):
                got = get.readinto(view[done:])
                if not got:
                    break
                done += got
        finally:
            get.close()
        return done

    return read_range


class KeptPages:
    """Which version of each file the kernel may hold pages of, to keep them on the next open.

    The kernel drops a file's cached pages at each open unless the open says to keep them
    (FOPEN_KEEP_CACHE). They are kept when the object opened is the version (size and ETag)
    opened last time: the pages hold its bytes. A changed object, or one without an ETag,
    drops them.
    """

    def __init__(self, limit: int = 1 << 16) -> None:
        self._seen: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def opened(self, path: str, size: int, etag: str | None) -> bool:
        """Record the version opened; whether the kernel's pages of ``path`` are of it."""
        version = (size, etag.strip('"')) if etag else None
        with self._lock:
            previous = self._seen.pop(path, None)
            if version is None:
                return False
            self._seen[path] = version
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)
        return previous == version


class ReadOpener:
    """Opens objects for reading: a cached one at once, a cold one lazily (``ColdReadHandle``).

    The observer (the directory read-ahead) hears of an open when the file is read through
    the cache: at once for a cached file, at the first sequential reads for a cold one, so a
    random reader does not make the next files of its directory be fetched.
    """

    def __init__(self, fs: Any, observer: ReadObserver | None, keep_always: bool) -> None:
        self._fs = fs
        self._observer = observer
        self._keep_always = keep_always  # immutable objects: the pages are always good
        self.kept = KeptPages()
        self._lock = threading.Lock()
        self._ranged = {"ranged_reads": 0, "bytes_read": 0, "bytes_fetched": 0}

    def counters(self) -> dict[str, int]:
        """What ranged reads did; the cache's own counters do not see them."""
        with self._lock:
            return dict(self._ranged)

    def _count_range(self, nbytes: int) -> None:
        with self._lock:
            self._ranged["ranged_reads"] += 1
            self._ranged["bytes_read"] += nbytes
            self._ranged["bytes_fetched"] += nbytes

    def open(self, path: str, full: str) -> tuple[ReadHandle | ColdReadHandle, bool]:
        """A handle and whether the kernel may keep the file's cached pages."""
        if self._fs.is_cached(full):
            file = self._fs.open(full, "rb")
            size = int(getattr(file, "size", 0))
            keep = self.kept.opened(path, size, getattr(file, "etag", None))
            self._opened(path, size)
            return ReadHandle(path, file), keep or self._keep_always
        info = self._fs.info(full)
        if info.get("type") != "file":
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        size, etag = int(info["size"]), info.get("ETag")
        read_range = ranged_reader(self._fs, full, etag)

        def read_and_count(offset: int, view: memoryview) -> int:
            done = read_range(offset, view)
            self._count_range(done)
            return done

        def open_whole() -> Any:
            file = self._fs.open(full, "rb")
            fetch_whole = getattr(file, "fetch_whole", None)
            if fetch_whole is not None:  # read in order from here on: no range-first
                fetch_whole()
            return file

        handle = ColdReadHandle(
            path, size, read_and_count, open_whole, lambda size: self._opened(path, size)
        )
        return handle, self.kept.opened(path, size, etag) or self._keep_always

    def _opened(self, path: str, size: int) -> None:
        if self._observer is not None:
            self._observer.opened(path, size)


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


Handle = ReadHandle | ColdReadHandle | EntryHandle


class ReadFollowers:
    """Read handles that follow what this mount writes to their path.

    A descriptor opened for reading before a writer opened the same path holds the version it
    opened; as on a local filesystem it must read what the writer writes (``tail -f``): while
    the path is open for writing its reads are served by the path's ``WritableFile``, and once
    a commit here made a newer version, its next read reopens the path. A handle stops
    following when its name is unlinked or renamed (it keeps the version it has).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened: dict[int, tuple[str, int]] = {}  # handle number -> (path, commits seen)
        self._commits: dict[str, int] = {}  # commits made here, of paths being followed

    def opened(self, number: int, path: str) -> None:
        with self._lock:
            self._opened[number] = (path, self._commits.get(path, 0))

    def closed(self, number: int) -> None:
        with self._lock:
            found = self._opened.pop(number, None)
            if found is not None and not any(p == found[0] for p, _ in self._opened.values()):
                self._commits.pop(found[0], None)

    def path_of(self, number: int) -> str | None:
        """The path a handle follows, or None when it follows none."""
        with self._lock:
            found = self._opened.get(number)
            return None if found is None else found[0]

    def committed(self, path: str) -> None:
        """A newer version of ``path`` was committed here: its followers reopen it."""
        with self._lock:
            if any(p == path for p, _ in self._opened.values()):
                self._commits[path] = self._commits.get(path, 0) + 1

    def stale(self, number: int) -> bool:
        """Whether a commit made here since the handle opened (or reopened) its version."""
        with self._lock:
            found = self._opened.get(number)
            return found is not None and self._commits.get(found[0], 0) != found[1]

    def reopened(self, number: int) -> None:
        with self._lock:
            found = self._opened.get(number)
            if found is not None:
                self._opened[number] = (found[0], self._commits.get(found[0], 0))

    def gone(self, *paths: str) -> None:
        """Unlinked or renamed (or replaced): their handles keep the version they have."""
        with self._lock:
            for number, (path, _) in list(self._opened.items()):
                if any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths):
                    del self._opened[number]
            for path in paths:
                self._commits.pop(path, None)


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

    def replace(self, number: int, handle: Handle) -> Handle | None:
        """Put ``handle`` under ``number``; the one it replaces (None: closed meanwhile, and
        ``handle`` is not kept)."""
        with self._lock:
            old = self._handles.get(number)
            if old is not None:
                self._handles[number] = handle
            return old

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
