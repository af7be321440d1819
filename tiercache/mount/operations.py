"""``MountOperations``: the FUSE operations of a mount, over a ``TierCacheFileSystem``.

Paths are those of the mount ("/a/b"), mapped onto ``bucket/prefix/a/b``. Attributes and
listings come from the store through ``fs.info``/``fs.ls`` and are trusted for a short time
(``AttrCache``); files open for writing are answered from their staged bytes. Every failure
becomes an errno (``errno_map``); nothing here raises past the binding.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tiercache.mount.attrs import DIRECTORY, Attr, AttrCache, attr_from_info
from tiercache.mount.errno_map import errno_for
from tiercache.mount.handles import HandleTable, ReadHandle, ReadObserver, WriteHandle

log = logging.getLogger("tiercache.mount")

F = TypeVar("F", bound=Callable[..., Any])


class FuseError(OSError):
    """An errno answer for the kernel (the binding turns an OSError into ``-errno``)."""

    def __init__(self, number: int) -> None:
        super().__init__(number, os.strerror(number))


def answers_errno(method: F) -> F:
    """Turn any exception of an operation into the errno that fits, logging unexpected ones."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except FuseError:
            raise
        except Exception as exc:
            number = errno_for(exc)
            expected = number in (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY)
            log.log(
                logging.DEBUG if expected else logging.WARNING,
                "%s%r: %s",
                method.__name__,
                args[1:2],
                exc,
            )
            raise FuseError(number) from exc

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class MountOptions:
    """How the operations behave: read-only, attribute lifetime, kernel page cache."""

    read_only: bool = False
    attr_ttl: float = 1.0
    keep_cache: bool = False  # keep the kernel's cached pages across opens (immutable data)
    direct_io: bool = False  # bypass the kernel page cache (every read reaches tiercache)


class MountOperations:
    """The operations a FUSE binding calls; ``raw_fi`` style (``fi`` carries ``fh`` and flags)."""

    use_ns = True  # times in nanoseconds

    def __init__(
        self,
        fs: Any,
        root: str,
        options: MountOptions,
        observer: ReadObserver | None = None,
    ) -> None:
        self.fs = fs
        self.root = root.strip("/")
        self.options = options
        self.observer = observer
        self.handles = HandleTable()
        self.cache = AttrCache(options.attr_ttl)
        # Directories made here that the store has shown no objects in (object stores have
        # no directories: a made one lives in the mount until rmdir).
        self._made_dirs: set[str] = set()
        self._dirs_lock = threading.Lock()
        self._uid, self._gid = os.getuid(), os.getgid()

    # -- paths and attributes ----------------------------------------------------------------

    def _full(self, path: str) -> str:
        return self.root if path in ("", "/") else f"{self.root}{path}"

    def _writable(self) -> None:
        if self.options.read_only:
            raise FuseError(errno.EROFS)

    def _attr(self, path: str) -> Attr:
        if path == "/":
            return DIRECTORY
        writer = self.handles.writer_for(path)
        if writer is not None:
            return Attr(False, writer.size(), time.time())
        with self._dirs_lock:
            if path in self._made_dirs:
                return DIRECTORY
            in_made_dir = posixpath.dirname(path) in self._made_dirs
        known, attr = self.cache.get(path)
        if not known:
            full = self._full(path)
            if in_made_dir and not self.fs.is_cached(full):
                # The store held nothing under a directory this mount made (a new checkpoint
                # directory), so a name not written here does not exist: no round trip needed.
                attr = None
            else:
                try:
                    attr = attr_from_info(self.fs.info(full))
                except FileNotFoundError:
                    attr = None
            self.cache.put(path, attr)
        if attr is None:
            raise FuseError(errno.ENOENT)
        return attr

    def _stat(self, attr: Attr) -> dict[str, Any]:
        return attr.to_stat(self._uid, self._gid, writable=not self.options.read_only)

    @answers_errno
    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        return self._stat(self._attr(path))

    @answers_errno
    def readdir(self, path: str, fh: int) -> list[Any]:
        names = self.cache.listing(path)
        if names is None:
            names = self._list(path)
        return [".", "..", *names]

    def _list(self, path: str) -> list[str]:
        if self._attr(path).is_dir is False:
            raise FuseError(errno.ENOTDIR)
        base = self._full(path)
        children: dict[str, Attr] = {}
        try:
            rows = self.fs.ls(base, detail=True)
        except FileNotFoundError:
            rows = []  # a prefix with nothing under it yet (the mount's root, a new directory)
        if any(not row.get("pending") for row in rows):
            with self._dirs_lock:  # the store has objects here now: ask it from now on
                self._made_dirs.discard(path)
        for row in rows:
            name = posixpath.basename(str(row["name"]).rstrip("/"))
            if name and str(row["name"]).rstrip("/") != base:
                children[self._child(path, name)] = attr_from_info(row)
        for writer in self.handles.writers_under(path):
            rest = writer.path[len(path.rstrip("/")) + 1 :]
            if "/" not in rest:
                children[writer.path] = Attr(False, writer.size(), time.time())
        with self._dirs_lock:
            for made in self._made_dirs:
                if posixpath.dirname(made) == path:
                    children[made] = DIRECTORY
        names = sorted(posixpath.basename(child) for child in children)
        self.cache.put_listing(path, names, children)
        return names

    @staticmethod
    def _child(path: str, name: str) -> str:
        return f"{path.rstrip('/')}/{name}"

    # -- opening, reading, writing -----------------------------------------------------------

    @answers_errno
    def open(self, path: str, fi: Any) -> int:
        mode = fi.flags & os.O_ACCMODE
        if mode == os.O_RDONLY:
            writer = self.handles.writer_for(path)
            if writer is not None:
                writer.commit()  # a reader of a file being written sees what was written
                self.cache.put(path, Attr(False, writer.size(), time.time()))
            file = self.fs.open(self._full(path), "rb")
            fi.fh = self.handles.add(ReadHandle(path, file))
            fi.keep_cache = int(self.options.keep_cache)
            fi.direct_io = int(self.options.direct_io)
            if self.observer is not None:
                self.observer.opened(path, int(getattr(file, "size", 0)))
            return 0
        self._writable()
        if self._attr(path).is_dir:
            raise FuseError(errno.EISDIR)
        truncate = bool(fi.flags & os.O_TRUNC)
        handle = WriteHandle(self.fs, path, self._full(path), keep_contents=not truncate)
        fi.fh = self.handles.add(handle)
        fi.direct_io = int(self.options.direct_io)
        self.cache.forget(path)
        return 0

    @answers_errno
    def create(self, path: str, mode: int, fi: Any) -> int:
        self._writable()
        handle = WriteHandle(self.fs, path, self._full(path), keep_contents=False)
        fi.fh = self.handles.add(handle)
        fi.direct_io = int(self.options.direct_io)
        self.cache.forget(path)
        return 0

    @answers_errno
    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        handle = self.handles.get(fi.fh)
        if self.observer is not None:
            self.observer.read(path, offset, size)
        return handle.read(size, offset)

    @answers_errno
    def read_into(self, path: str, buffer: memoryview, offset: int, fi: Any) -> int:
        """``read`` straight into the binding's buffer: one copy less per request."""
        handle = self.handles.get(fi.fh)
        if self.observer is not None:
            self.observer.read(path, offset, len(buffer))
        return handle.read_into(buffer, offset)

    @answers_errno
    def write(self, path: str, data: bytes, offset: int, fi: Any) -> int:
        handle = self.handles.get(fi.fh)
        if not isinstance(handle, WriteHandle):
            raise FuseError(errno.EBADF)
        return handle.write(data, offset)

    @answers_errno
    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        self._writable()
        writer = self.handles.writer_for(path)
        if writer is not None:
            writer.truncate(length)
            return 0
        if self._attr(path).is_dir:
            raise FuseError(errno.EISDIR)
        # truncate(2) of a file nobody has open: rewrite the object at its new length.
        handle = WriteHandle(self.fs, path, self._full(path), keep_contents=length > 0)
        try:
            handle.truncate(length)
            self._committed(path, handle.commit())
        finally:
            handle.close()
        return 0

    @answers_errno
    def flush(self, path: str, fi: Any) -> int:
        handle = self.handles.get(fi.fh)
        if isinstance(handle, WriteHandle):
            self._committed(path, handle.commit())
        return 0

    @answers_errno
    def fsync(self, path: str, datasync: int, fi: Any) -> int:
        handle = self.handles.get(fi.fh)
        if isinstance(handle, WriteHandle):
            handle.fsync()
        return 0

    @answers_errno
    def release(self, path: str, fi: Any) -> int:
        handle = self.handles.pop(fi.fh)
        if handle is None:
            return 0
        if isinstance(handle, WriteHandle):
            size = handle.commit()
            handle.close()
            self._committed(handle.path, size)
        else:
            handle.close()
        return 0

    def _committed(self, path: str, size: int | None) -> None:
        if size is None:
            return
        self.cache.forget(path)
        self.cache.put(path, Attr(False, size, time.time()))

    # -- the namespace -----------------------------------------------------------------------

    @answers_errno
    def unlink(self, path: str) -> int:
        self._writable()
        if self._attr(path).is_dir:
            raise FuseError(errno.EISDIR)
        self.fs.rm_file(self._full(path))
        self.cache.forget(path)
        self.cache.put(path, None)
        return 0

    @answers_errno
    def mkdir(self, path: str, mode: int) -> int:
        self._writable()
        try:
            self._attr(path)
        except FuseError as exc:
            if exc.errno != errno.ENOENT:
                raise
        else:
            raise FuseError(errno.EEXIST)
        # Object stores have no directories: the mount remembers it until a file lands in it.
        with self._dirs_lock:
            self._made_dirs.add(path)
        self.cache.forget(path)
        return 0

    @answers_errno
    def rmdir(self, path: str) -> int:
        self._writable()
        if path == "/":
            raise FuseError(errno.EBUSY)
        if not self._attr(path).is_dir:
            raise FuseError(errno.ENOTDIR)
        self.cache.forget(path)
        if self._list(path):
            raise FuseError(errno.ENOTEMPTY)
        with self._dirs_lock:
            self._made_dirs.discard(path)
        self.cache.forget(path)
        self.cache.put(path, None)
        return 0

    @answers_errno
    def rename(self, old: str, new: str) -> int:
        self._writable()
        if self._attr(old).is_dir:
            with self._dirs_lock:
                if old in self._made_dirs:  # nothing in the store to move
                    self._made_dirs.discard(old)
                    self._made_dirs.add(new)
                    self.cache.forget(old)
                    self.cache.forget(new)
                    return 0
            raise FuseError(errno.EXDEV)  # mv then copies the tree file by file
        writer = self.handles.writer_for(old)
        if writer is not None:
            writer.commit()
        self.fs.mv(self._full(old), self._full(new))
        for changed in (old, new):
            self.cache.forget(changed)
        self.cache.put(old, None)
        return 0

    @answers_errno
    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.fs.config.local_dir)
        return {
            "f_bsize": st.f_bsize,
            "f_frsize": st.f_frsize,
            "f_blocks": st.f_blocks,
            "f_bfree": st.f_bfree,
            "f_bavail": st.f_bavail,
            "f_files": st.f_files,
            "f_ffree": st.f_ffree,
            "f_favail": st.f_favail,
            "f_namemax": 1024,
        }

    # Object stores keep no owners, modes or times: accept and ignore them so cp -p, touch
    # and tar work on a writable mount.
    @answers_errno
    def chmod(self, path: str, mode: int) -> int:
        self._writable()
        self._attr(path)
        return 0

    @answers_errno
    def chown(self, path: str, uid: int, gid: int) -> int:
        self._writable()
        self._attr(path)
        return 0

    @answers_errno
    def utimens(self, path: str, times: Any = None) -> int:
        self._writable()
        self._attr(path)
        return 0

    def destroy(self, path: str) -> None:
        """Unmounted: commit what is still open (a crash leaves it to the journal's records)."""
        for handle in self.handles.pop_all():
            try:
                handle.close()
            except Exception:
                log.exception("closing %s at unmount", handle.path)
