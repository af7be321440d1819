"""``MountOperations``: the FUSE operations of a mount, over a ``TierCacheFileSystem``.

Paths are those of the mount ("/a/b"), mapped onto ``bucket/prefix/a/b``. Attributes and
listings come from the store through ``fs.info``/``fs.ls`` and are trusted for a short time
(``AttrCache``); files open for writing are answered by their ``WritableFile``, which every
descriptor of the path shares and which is committed at the last release. Every failure
becomes an errno (``errno_map``); nothing here raises past the binding.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tiercache.mount.attrs import DIRECTORY, Attr, AttrCache, attr_from_info
from tiercache.mount.caller import closing_state
from tiercache.mount.errno_map import errno_for
from tiercache.mount.handles import (
    EntryHandle,
    Handle,
    HandleTable,
    ReadFollowers,
    ReadHandle,
    ReadObserver,
    ReadOpener,
)
from tiercache.mount.kept import DEFAULT_FILE_MODE, AttrKeeper
from tiercache.mount.kernel_opens import PathReaders
from tiercache.mount.links import MAX_TARGET, target_bytes, target_text
from tiercache.mount.lookahead import MetadataLookAhead
from tiercache.mount.moves import TreeMoveError, move_tree, objects_under
from tiercache.mount.passthrough import Passthrough
from tiercache.mount.stored import SetAttrs, Version
from tiercache.mount.writable import WritableFile, WritableFiles

log = logging.getLogger("tiercache.mount")

F = TypeVar("F", bound=Callable[..., Any])

# How long a rename waits for the release of a file every process has closed (the kernel
# sends the release after close(2) returns, so ``close; rename`` can overtake it).
RELEASE_WAIT = 2.0
# How long this mount's own deletes outrank a listing that still shows the names (a store
# whose listings lag its deletes would otherwise show them, and refuse rmdir with ENOTEMPTY).
GONE_TRUST = 60.0
# How long an unmount waits to save the times and modes set just before it.
ATTRS_DRAIN = 30.0


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
    passthrough: bool = True  # the kernel reads warm read-only opens from the tier file
    # Opens need no request (read-only, immutable): see ``kernel_opens``.
    kernel_opens: bool = False


def _with_metadata(attr: Attr, meta: SetAttrs) -> Attr:
    """A stored file's attributes with the mtime, mode and type its object metadata holds."""
    mtime_ns = attr.mtime_ns if meta.mtime_ns is None else meta.mtime_ns
    is_link = meta.symlink and attr.size <= MAX_TARGET
    return Attr(False, attr.size, mtime_ns, meta.mode, is_link)


class MountOperations:
    """The operations a FUSE binding calls; ``raw_fi`` style (``fi`` carries ``fh`` and flags)."""

    use_ns = True  # times in nanoseconds
    # Operations on an open file find it by its handle, so libfuse need not look up a path
    # for them; it has none for a file unlinked while open (which stays usable until closed).
    flag_nopath = True
    flag_nullpath_ok = True

    def __init__(
        self,
        fs: Any,
        root: str,
        options: MountOptions,
        observer: ReadObserver | None = None,
        caller: Callable[[], int] | None = None,
    ) -> None:
        self.fs = fs
        self.caller = caller  # the pid behind the current request (None: unknown)
        self.root = root.strip("/")
        self.options = options
        self.observer = observer
        self.handles = HandleTable()
        self.followers = ReadFollowers()
        self._reopen_lock = threading.Lock()
        self.readers = ReadOpener(fs, observer, options.keep_cache)
        if options.kernel_opens and not options.read_only:
            raise ValueError("opens answered by the kernel need a read-only mount")
        # Reads of files the kernel opened itself come with a path: libfuse must give it.
        self.flag_nullpath_ok = not options.kernel_opens
        self.by_path = PathReaders(lambda path: self.readers.open(path, self._full(path))[0])
        self.passthrough = Passthrough(options.passthrough and not options.direct_io)
        self.writables = WritableFiles()
        self.cache = AttrCache(options.attr_ttl)
        # Directories made here (object stores have no directories: a made one lives in the
        # mount until rmdir, whatever the store holds under it, so a name ``ls`` lists never
        # stats as missing), and those of them the store has shown nothing under yet.
        self._made_dirs: set[str] = set()
        self._fresh_dirs: set[str] = set()
        self._dirs_lock = threading.Lock()
        self._open_dirs: dict[int, str] = {}  # opendir's handles (readdir gets no path)
        self._dir_numbers = itertools.count(1)
        self._gone: dict[str, float] = {}  # deleted here (under _dirs_lock): when
        self._open_requests = 0
        self._count_lock = threading.Lock()
        self._uid, self._gid = os.getuid(), os.getgid()
        self.kept = AttrKeeper(
            fs, self._full, lambda path: self.writables.current(path) is not None, self.cache.forget
        )
        self.lookahead = MetadataLookAhead(self._read_listed)

    def counters(self) -> dict[str, int]:
        """The mount's own counters: its ranged reads, open requests and files the kernel opened
        itself (``kernel_opens``), and opens read through passthrough."""
        with self._count_lock:
            opens = self._open_requests
        return {
            **self.readers.counters(),
            **self.passthrough.counters(),
            **self.by_path.counters(),
            "open_requests": opens,
        }

    # -- paths and attributes ----------------------------------------------------------------

    def _full(self, path: str) -> str:
        return self.root if path in ("", "/") else f"{self.root}{path}"

    def _writable(self) -> None:
        if self.options.read_only:
            raise FuseError(errno.EROFS)

    def _attr(self, path: str) -> Attr:
        if path == "/":
            return self._with_kept(path, DIRECTORY)
        entry = self.writables.current(path)
        if entry is not None:
            return self._entry_attr(entry)
        return self._with_kept(path, self._stored_attr(path))

    def _entry_attr(self, entry: WritableFile) -> Attr:
        return self._with_kept(entry.path, Attr(False, entry.size(), entry.mtime_ns))

    def _with_kept(self, path: str, attr: Attr) -> Attr:
        """``attr`` with the times and mode set here and not yet in the store."""
        kept = self.kept.get_dir(path) if attr.is_dir else self.kept.get(path)
        if kept is None:
            return attr
        return Attr(
            attr.is_dir,
            attr.size,
            attr.mtime_ns if kept.mtime_ns is None else kept.mtime_ns,
            attr.mode if kept.mode is None else kept.mode,
            attr.is_link,
        )

    def _stored_attr(self, path: str) -> Attr:
        """What the cache or the store says of ``path`` (files open here aside)."""
        with self._dirs_lock:
            if path in self._made_dirs:
                return DIRECTORY
            in_fresh_dir = posixpath.dirname(path) in self._fresh_dirs
            gone = self._is_gone(path)
        if gone:
            raise FuseError(errno.ENOENT)
        if not self.options.read_only:
            self.lookahead.wanted(path)  # waits for a read of it under way
        known, attr = self.cache.get(path)
        if not known:
            full = self._full(path)
            if in_fresh_dir and not self.fs.is_cached(full):
                # The store held nothing under a directory this mount made (a new checkpoint
                # directory), so a name not written here does not exist: no round trip needed.
                attr = None
            else:
                attr = self._ask_store(path, full)
            self.cache.put(path, attr)
        if attr is None:
            raise FuseError(errno.ENOENT)
        return attr

    def _ask_store(self, path: str, full: str) -> Attr | None:
        """What a listing of the moment, else ``fs.info``, and the object's metadata say of
        ``path``; None: nothing there."""
        row, fresh = self.cache.listed(path)
        if row is not None and fresh:
            return self._listed_attr(path, row)
        # Outside ``always`` mode a tier's copy answers info with the LastModified of its own
        # fetch, which says nothing of metadata set since (that keeps the ETag).
        vouched = (
            self.options.read_only
            or self.fs.config.consistency == "always"
            or not self.fs.is_cached(full)
        )
        try:
            row = self.fs.info(full)
        except FileNotFoundError:
            return None
        return self._with_stored_metadata(path, row, vouched)

    def _with_stored_metadata(self, path: str, info: dict[str, Any], vouched: bool) -> Attr:
        """A stored file's attributes with the mtime and mode its metadata holds."""
        attr = attr_from_info(info)
        if attr.is_dir or self.options.read_only:  # a data mount: no HEAD per stat
            return attr
        return _with_metadata(attr, self.kept.stored(path, Version.of_row(info), vouched))

    def _listed_attr(self, path: str, row: dict[str, Any]) -> Attr | None:
        """A file a listing of the moment showed: its row with its remembered metadata, else
        what a HEAD says (which is as fresh as a getattr's own); None: gone since."""
        version = Version.of_row(row)
        meta = None if version is None else self.kept.remembered(path, version)
        if meta is not None:
            return _with_metadata(attr_from_info(row), meta)
        return self._head_attr(path)

    def _head_attr(self, path: str) -> Attr | None:
        found = self.kept.head(path)
        if found is None:
            return None
        info, meta = found
        attr = attr_from_info({"type": "file", "size": info.size, "mtime": info.last_modified})
        return _with_metadata(attr, meta)

    def _read_listed(self, path: str) -> None:
        """The look-ahead's read: what the stat of a listed file will want, unless remembered
        metadata answers it (with the row of a listing of the moment, or with ``fs.info``)."""
        row, fresh = self.cache.listed(path)
        version = None if row is None else Version.of_row(row)
        if row is None or version is None:
            return  # forgotten since: changed here
        meta = self.kept.remembered(path, version, vouched=fresh)
        if meta is not None:
            if fresh:
                self.cache.settle(path, row, _with_metadata(attr_from_info(row), meta))
            return
        attr = self._head_attr(path)  # as fresh as the stat's own: kept for the attr timeout
        if attr is not None:
            self.cache.settle(path, row, attr)

    def _is_gone(self, path: str) -> bool:
        """Deleted here lately (hold ``_dirs_lock``): trusted over what a listing says."""
        when = self._gone.get(path)
        if when is not None and time.monotonic() - when > GONE_TRUST:
            del self._gone[path]
            return False
        return when is not None

    def _mark_gone(self, *paths: str) -> None:
        with self._dirs_lock:
            now = time.monotonic()
            for path in paths:
                self._gone[path] = now

    def _mark_made(self, path: str) -> None:
        """``path`` is written or made here: no longer one this mount deleted."""
        with self._dirs_lock:
            self._gone.pop(path, None)

    def _keep_parent(self, path: str) -> None:
        """Keep the directory of a deleted name as if made here: the store shows no empty
        directory, and ``rm -r`` removes the files and then the directory."""
        parent = posixpath.dirname(path)
        if parent != "/":
            with self._dirs_lock:
                self._made_dirs.add(parent)

    def _stat(self, attr: Attr) -> dict[str, Any]:
        return attr.to_stat(self._uid, self._gid, writable=not self.options.read_only)

    def _object_size(self, path: str) -> int | None:
        try:
            attr = self._stored_attr(path)
        except FuseError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return None if attr.is_dir else attr.size

    @answers_errno
    def getattr(self, path: str | None, fh: Any = None) -> dict[str, Any]:
        if path is None:  # fstat: answered by the open file (it may be unlinked)
            if fh is None:
                raise FuseError(errno.ENOENT)
            handle = self.handles.get(fh.fh)
            if isinstance(handle, EntryHandle):
                return self._stat(self._entry_attr(handle.entry))
            path = handle.path
        return self._stat(self._attr(path))

    @answers_errno
    def opendir(self, path: str) -> int:
        if not self._attr(path).is_dir:
            raise FuseError(errno.ENOTDIR)
        with self._dirs_lock:
            number = next(self._dir_numbers)
            self._open_dirs[number] = path
        return number

    @answers_errno
    def releasedir(self, path: str | None, fh: int) -> int:
        with self._dirs_lock:
            self._open_dirs.pop(fh, None)
        return 0

    @answers_errno
    def readdir(self, path: str | None, fh: int) -> list[Any]:
        if path is None:
            with self._dirs_lock:
                path = self._open_dirs.get(fh)
            if path is None:
                raise FuseError(errno.EBADF)
        names = self.cache.listing(path)
        if names is None:
            names = self._list(path)
        return [".", "..", *names]

    def _list(self, path: str) -> list[str]:
        if self._attr(path).is_dir is False:
            raise FuseError(errno.ENOTDIR)
        base = self._full(path)
        children: dict[str, Attr] = {}
        rows_of: dict[str, dict[str, Any]] = {}
        try:
            rows = self.fs.ls(base, detail=True)
        except FileNotFoundError:
            rows = []  # a prefix with nothing under it yet (the mount's root, a new directory)
        if any(not row.get("pending") for row in rows):
            with self._dirs_lock:  # the store has objects here now: ask it from now on
                self._fresh_dirs.discard(path)
        with self._dirs_lock:
            for row in rows:
                name = posixpath.basename(str(row["name"]).rstrip("/"))
                child = self._child(path, name)
                if name and str(row["name"]).rstrip("/") != base and not self._is_gone(child):
                    children[child] = attr_from_info(row)
                    rows_of[child] = row
        for entry in self.writables.under(path):
            rest = entry.path[len(path.rstrip("/")) + 1 :]
            if "/" not in rest:
                children[entry.path] = self._entry_attr(entry)
                rows_of.pop(entry.path, None)
        with self._dirs_lock:
            for made in self._made_dirs:
                if posixpath.dirname(made) == path:
                    children[made] = DIRECTORY
                    rows_of.pop(made, None)
        names = sorted(posixpath.basename(child) for child in children)
        known, unknown = self._listed_attrs(children, rows_of)
        self.cache.put_listing(path, names, known, unknown)
        if not self.options.read_only and self.cache.ttl > 0:  # else no rows are kept
            self.lookahead.listed(path, sorted(unknown))
        return names

    def _listed_attrs(
        self, children: dict[str, Attr], rows_of: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Attr], dict[str, dict[str, Any]]]:
        """The children whose attributes a listing tells, and the rows of the files whose
        metadata (times and modes, on a read-write mount) is left for getattr to read."""
        if self.options.read_only:
            return children, {}
        known = {child: attr for child, attr in children.items() if attr.is_dir}
        unknown: dict[str, dict[str, Any]] = {}
        for child, row in rows_of.items():
            version = Version.of_row(row)
            if version is None:  # a directory, or a pending write: getattr asks fs.info
                continue
            meta = self.kept.remembered(child, version)
            if meta is None:
                unknown[child] = row
            else:
                known[child] = _with_metadata(children[child], meta)
        return known, unknown

    @staticmethod
    def _child(path: str, name: str) -> str:
        return f"{path.rstrip('/')}/{name}"

    # -- opening, reading, writing -----------------------------------------------------------

    @answers_errno
    def open(self, path: str, fi: Any) -> int:
        with self._count_lock:
            self._open_requests += 1
        if self.options.kernel_opens:
            # The kernel opens files itself from now on: no open, flush or release reaches
            # the mount, and each file keeps its cached pages (``kernel_opens``).
            raise FuseError(errno.ENOSYS)
        fi.direct_io = int(self.options.direct_io)
        if fi.flags & os.O_ACCMODE == os.O_RDONLY:
            entry = self.writables.attach(path)
            if entry is not None:  # open for writing too: read what was written
                fi.fh = self.handles.add(EntryHandle(entry, writable=False))
                self.passthrough.opened(fi.fh, path, fi, None)
                return 0
            handle, keep = self.readers.open(path, self._full(path))
            fi.fh = self.handles.add(handle)
            fi.keep_cache = int(keep)
            fi.noflush = 1  # a close(2) of a reader has nothing to flush: no request for it
            if not self.passthrough.opened(fi.fh, path, fi, handle.settled_fd()):
                self.followers.opened(fi.fh, path)  # its reads reach the mount: see writes
            return 0
        self._writable()
        if self._attr(path).is_dir:
            raise FuseError(errno.EISDIR)
        self._refuse_if_passed_through(path)
        fi.fh = self._open_entry(path, truncate=bool(fi.flags & os.O_TRUNC))
        self.passthrough.opened(fi.fh, path, fi, None)
        return 0

    def _refuse_if_passed_through(self, path: str) -> None:
        """ETXTBSY for a writer while readers of ``path`` read it through passthrough (the
        kernel would refuse an open the mount serves; see ``passthrough``). Releases of
        readers that have closed it are waited for (``RELEASE_WAIT``)."""
        if self.passthrough.held(path, wait=RELEASE_WAIT):
            raise FuseError(errno.ETXTBSY)

    @answers_errno
    def create(self, path: str, mode: int, fi: Any) -> int:
        self._writable()
        fi.direct_io = int(self.options.direct_io)
        self._refuse_if_passed_through(path)
        self._mark_made(path)
        self.kept.removed(path)
        fi.fh = self._open_entry(path, truncate=True)
        self.passthrough.opened(fi.fh, path, fi, None)
        if mode & 0o7777 != DEFAULT_FILE_MODE:  # tar and cp make files with their own mode
            self.kept.set(path, SetAttrs(mode=mode & 0o7777))
        self.cache.forget(path)
        return 0

    def _open_entry(self, path: str, truncate: bool) -> int:
        """Open ``path``'s writable file (shared with its other descriptors); a handle number."""
        known, stored = self.cache.get(path)
        if known and stored is not None and stored.mode is not None and not self.kept.get(path):
            self.kept.set(path, SetAttrs(mode=stored.mode))  # a rewrite keeps the file's mode
        entry = self.writables.acquire(
            path,
            lambda: WritableFile(self.fs, path, self._full(path), lambda: self._object_size(path)),
        )
        handle = EntryHandle(entry, writable=True)
        try:
            if truncate:
                entry.truncate(0)
        except BaseException:
            self._release(handle)
            raise
        return self.handles.add(handle)

    @answers_errno
    def read(self, path: str | None, size: int, offset: int, fi: Any) -> bytes:
        if self.options.kernel_opens:
            buffer = bytearray(size)
            return bytes(buffer[: self.read_into(path, memoryview(buffer), offset, fi)])
        handle = self.handles.get(fi.fh)
        if self.observer is not None:
            self.observer.read(handle.path, offset, size)
        written = self._written_since_open(fi.fh)
        if written is not None:
            buffer = bytearray(size)
            return bytes(buffer[: written.read_into(memoryview(buffer), offset)])
        return self._current_version(fi.fh, handle).read(size, offset)

    @answers_errno
    def read_into(self, path: str | None, buffer: memoryview, offset: int, fi: Any) -> int:
        """``read`` straight into the binding's buffer: one copy less per request."""
        if self.options.kernel_opens:
            if path is None:
                raise FuseError(errno.EBADF)
            if self.observer is not None:
                self.observer.read(path, offset, len(buffer))
            with self.by_path.reading(path) as opened:
                return opened.read_into(buffer, offset)
        handle = self.handles.get(fi.fh)
        if self.observer is not None:
            self.observer.read(handle.path, offset, len(buffer))
        written = self._written_since_open(fi.fh)
        if written is not None:
            return written.read_into(buffer, offset)
        return self._current_version(fi.fh, handle).read_into(buffer, offset)

    def _written_since_open(self, number: int) -> WritableFile | None:
        """The file open for writing that a reader opened before it reads (see
        ``ReadFollowers``), or None."""
        path = self.followers.path_of(number)
        if path is None:
            return None
        entry = self.writables.current(path)
        return None if entry is None or entry.unlinked else entry

    def _current_version(self, number: int, handle: Handle) -> Handle:
        """``handle``, or a handle of the newer version a commit made here since it opened
        (which replaces it)."""
        path = self.followers.path_of(number)
        if path is None or not self.followers.stale(number):
            return handle
        with self._reopen_lock:
            if not self.followers.stale(number):
                return self.handles.get(number)
            fresh = ReadHandle(path, self.fs.open(self._full(path), "rb"))
            self.followers.reopened(number)
            replaced = self.handles.replace(number, fresh)
        if replaced is None:  # released meanwhile
            fresh.close()
            return handle
        if not isinstance(replaced, EntryHandle):  # followers are readers: never one
            replaced.close()
        return fresh

    @answers_errno
    def write(self, path: str | None, data: bytes, offset: int, fi: Any) -> int:
        handle = self.handles.get(fi.fh)
        if not isinstance(handle, EntryHandle):
            raise FuseError(errno.EBADF)
        self.kept.written(handle.path)
        return handle.write(data, offset)

    @answers_errno
    def truncate(self, path: str | None, length: int, fh: Any = None) -> int:
        self._writable()
        if path is None:  # ftruncate: the open file (it may be unlinked)
            handle = self.handles.get(fh.fh) if fh is not None else None
            if not isinstance(handle, EntryHandle) or not handle.writable:
                raise FuseError(errno.EBADF)
            self.kept.written(handle.path)
            handle.entry.truncate(length)
            return 0
        self.kept.written(path)
        entry = self.writables.current(path)
        if entry is not None and entry.opens > 0:
            entry.truncate(length)
            return 0
        if self._attr(path).is_dir:
            raise FuseError(errno.EISDIR)
        # truncate(2) of a file nobody has open: a short-lived open of its own.
        number = self._open_entry(path, truncate=False)
        handle = self.handles.pop(number)
        assert isinstance(handle, EntryHandle)
        try:
            handle.entry.truncate(length)
        finally:
            handle.flushed()
            self._release(handle)
        return 0

    @answers_errno
    def flush(self, path: str | None, fi: Any) -> int:
        """A close(2) of a descriptor (of each duplicate): durable, but not committed yet.

        The commit waits for the last release: a duplicate may still be open. What a live
        process closed is marked to be committed should the mount die before that release;
        what a process closes as it exits (its duplicates, a writer killed) is not.
        """
        if self.options.kernel_opens:
            raise FuseError(errno.ENOSYS)  # nothing to flush, and no more flushes asked
        handle = self.handles.get(fi.fh)
        if isinstance(handle, EntryHandle):
            exiting = killed = False
            if handle.writable and self.caller is not None:
                exiting, killed = closing_state(self.caller())
            handle.flushed()
            handle.entry.flush(killed, closed_by_live_process=handle.writable and not exiting)
        return 0

    @answers_errno
    def fsync(self, path: str | None, datasync: int, fi: Any) -> int:
        handle = self.handles.get(fi.fh)
        if isinstance(handle, EntryHandle):
            handle.entry.fsync()
        return 0

    @answers_errno
    def release(self, path: str | None, fi: Any) -> int:
        self.passthrough.released(fi.fh)
        self.followers.closed(fi.fh)
        handle = self.handles.pop(fi.fh)
        if isinstance(handle, EntryHandle):
            handle.flushed()
            self._release(handle)
        elif handle is not None:
            handle.close()
        return 0

    def _release(self, handle: EntryHandle) -> None:
        """One descriptor fewer; the last one commits the file (unless it must not be)."""
        entry = handle.entry
        if not self.writables.release(entry):
            return
        try:
            size = entry.commit()
        except Exception:
            log.exception("committing %s at its last close", entry.path)
            entry.discard()
            size = None
        finally:
            self.writables.finished(entry)
        self.cache.forget(entry.path)
        self.kept.changed(entry.path)
        if size is not None:
            self.cache.put(entry.path, Attr(False, size, time.time_ns()))
            self.followers.committed(entry.path)
        self.kept.schedule(entry.path)  # times and modes set while it was open

    # -- the namespace -----------------------------------------------------------------------

    @answers_errno
    def unlink(self, path: str) -> int:
        self._writable()
        if self._attr(path).is_dir:
            raise FuseError(errno.EISDIR)
        # A file still open stays usable by its descriptors and is never committed.
        open_here = self.writables.detach(path) is not None
        try:
            self.fs.rm_file(self._full(path))
        except FileNotFoundError:
            if not open_here:  # a new file open here has no object yet
                raise
        self.kept.removed(path)
        self.passthrough.gone(path)
        self.followers.gone(path)
        self._mark_gone(path)
        self._keep_parent(path)
        self.cache.forget(path)
        self.cache.put(path, None)
        return 0

    @answers_errno
    def symlink(self, path: str, target: str) -> int:
        """``ln -s TARGET PATH``: an object holding the target, its type in its metadata, in
        the store at once (``links``); ``EPERM`` where the store keeps no metadata."""
        self._writable()
        if not self.kept.keeps_metadata:
            raise FuseError(errno.EPERM)
        try:
            data = target_bytes(target)
        except OSError as exc:
            raise FuseError(exc.errno or errno.EINVAL) from None
        self._refuse_existing(path)
        self.kept.removed(path)
        now = time.time_ns()
        self.kept.make_link(path, data, now)
        self.fs.invalidate_cache(self._full(path))  # a lookup just before remembered no object
        self._mark_made(path)
        with self._dirs_lock:  # the store holds an object under it now: ask it from now on
            self._fresh_dirs.discard(posixpath.dirname(path))
        self.cache.forget(path)
        self.cache.put(path, Attr(False, len(data), now, 0o777, is_link=True))
        return 0

    def _refuse_existing(self, path: str) -> None:
        """EEXIST if ``path`` names a file, link or directory already (what the store holds or
        this mount made)."""
        try:
            self._attr(path)
        except FuseError as exc:
            if exc.errno != errno.ENOENT:
                raise
        else:
            raise FuseError(errno.EEXIST)

    @answers_errno
    def readlink(self, path: str) -> str:
        if not self._attr(path).is_link:
            raise FuseError(errno.EINVAL)
        return target_text(self.fs.cat_file(self._full(path)))

    @answers_errno
    def mkdir(self, path: str, mode: int) -> int:
        self._writable()
        self._refuse_existing(path)
        # Object stores have no directories: the mount remembers it until a file lands in it.
        self._mark_made(path)
        with self._dirs_lock:
            self._made_dirs.add(path)
            self._fresh_dirs.add(path)
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
            self._fresh_dirs.discard(path)
        self.kept.removed(path)
        self._mark_gone(path)
        self.cache.forget(path)
        self.cache.put(path, None)
        return 0

    @answers_errno
    def rename(self, old: str, new: str) -> int:
        self._writable()
        if self._attr(old).is_dir:
            self._rename_dir(old, new)
            return 0
        self.writables.detach(new)  # a file open under the new name is replaced
        entry = self._closed_by_all(old)
        if entry is not None:  # still open: publish what it holds now, and move it along
            entry.commit()
        self.fs.mv(self._full(old), self._full(new))
        if entry is not None:
            self.writables.move(entry, new, self._full(new))
        self.kept.moved(old, new)
        self.passthrough.moved(old, new)
        self.followers.gone(old, new)
        self._mark_made(new)
        self._mark_gone(old)
        self._keep_parent(old)
        for changed in (old, new):
            self.cache.forget(changed)
        self.cache.put(old, None)
        return 0

    def _rename_dir(self, old: str, new: str) -> None:
        """Rename a directory: its objects copied, then deleted (``moves``); EIO if that fails,
        with nothing moved when a copy failed."""
        if new == old or new.startswith(old.rstrip("/") + "/"):
            raise FuseError(errno.EINVAL)
        try:
            target = self._attr(new)
        except FuseError as exc:
            if exc.errno != errno.ENOENT:
                raise
        else:
            if not target.is_dir:
                raise FuseError(errno.ENOTDIR)
            self.cache.forget(new)
            if self._list(new):
                raise FuseError(errno.ENOTEMPTY)
        for entry in self.writables.under(old):
            if self._closed_by_all(entry.path) is not None:
                raise FuseError(errno.EBUSY)  # a file under it is open for writing
        names = objects_under(self.fs, self._full(old))
        try:
            move_tree(self.fs, self._full(old), self._full(new), names)
        except TreeMoveError as exc:
            raise FuseError(errno.EIO) from exc
        moved = [self.root_relative(name) for name in names]
        self.kept.changed(*moved, *(new + name[len(old) :] for name in moved))
        with self._dirs_lock:
            for known in (self._made_dirs, self._fresh_dirs):
                for made in [d for d in known if d == old or d.startswith(old + "/")]:
                    known.discard(made)
                    known.add(new + made[len(old) :])
            self._made_dirs.add(new)  # shown even when it holds nothing
        self._keep_parent(old)
        self.kept.moved(old, new)
        self.passthrough.moved(old, new)
        self.followers.gone(old, new)
        self._mark_made(new)
        self._mark_gone(old, *moved)
        for changed in (old, new, *moved):
            self.cache.forget(changed)
        self.cache.put(old, None)

    def root_relative(self, full: str) -> str:
        """The mount path of ``bucket/prefix/a/b``."""
        return "/" + full[len(self.root) :].lstrip("/")

    def _closed_by_all(self, path: str) -> WritableFile | None:
        """The path's open file, after waiting for its release if every process closed it.

        ``close(fd); rename(tmp, name)`` (git, rsync, editors) can reach the mount before the
        release that commits ``tmp``; the rename then waits for it instead of publishing early.
        """
        entry = self.writables.current(path)
        if entry is None:
            return None
        if entry.unclosed == 0:
            entry.done.wait(RELEASE_WAIT)
        self.writables.settle(path)
        return self.writables.current(path)

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

    # Owners are not kept (object stores have none): chown is accepted and ignored, so cp -p
    # and tar work. Times and modes are kept as object metadata (``kept``). The binding gives
    # no path for a file unlinked while open: nothing is kept for it.
    @answers_errno
    def chmod(self, path: str | None, mode: int) -> int:
        self._writable()
        if path is None:
            return 0
        attrs = SetAttrs(mode=mode & 0o7777)
        if self._attr(path).is_dir:
            self.kept.set_dir(path, attrs)
        else:
            self.kept.set(path, attrs)
        return 0

    @answers_errno
    def chown(self, path: str | None, uid: int, gid: int) -> int:
        self._writable()
        if path is not None:
            self._attr(path)
        return 0

    @answers_errno
    def utimens(self, path: str | None, times: tuple[int | None, int | None] | None = None) -> int:
        """Set the mtime (``times``: atime and mtime in ns, None to leave one; no times: now)."""
        self._writable()
        mtime_ns = time.time_ns() if times is None else times[1]
        if path is None or mtime_ns is None:
            return 0
        if self._attr(path).is_dir:
            self.kept.set_dir(path, SetAttrs(mtime_ns=mtime_ns))
        else:
            self.kept.set(path, SetAttrs(mtime_ns=mtime_ns))
        return 0

    def destroy(self, path: str) -> None:
        """Unmounted: commit what is still open (a crash leaves it to the journal's records)."""
        for handle in self.handles.pop_all():
            try:
                if isinstance(handle, EntryHandle):
                    self._release(handle)
                else:
                    handle.close()
            except Exception:
                log.exception("closing %s at unmount", handle.path)
        self.by_path.close_all()
        self.lookahead.close()
        self.kept.drain(ATTRS_DRAIN)
