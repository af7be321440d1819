"""Times and modes set through the mount, kept as object metadata (``mtime``, ``mode``).

``touch``, ``utimes`` and ``chmod`` cannot change an object's bytes or its LastModified, so
the mount keeps what they set as user metadata, spelled as rclone and s3fs-fuse do:
``x-amz-meta-mtime`` is seconds since the epoch with a fraction (``1700000000.123456789``,
as rclone writes it; s3fs-fuse reads it) and ``x-amz-meta-mode`` the decimal ``st_mode``
(``33188`` for a 0644 file, as s3fs-fuse writes it; an octal value with a leading ``0``, as
rclone writes it, is read too).

What is set is kept here first (``getattr`` answers from it at once) and published by one
worker thread: it waits until the object's own upload has landed (``fs.flush``), then
replaces the object's metadata with a CopyObject onto itself that holds only if the object
is still the one it read (``CopySourceIfMatch``). A write to the path drops a kept mtime (the
write is newer) but not a kept mode. What objects' metadata says, read by a HEAD or published
here, is remembered per object version as the consistency mode allows (``stored``).

A directory has no object to hold metadata: its times and mode are kept by this mount only,
until it ends (enough for ``rsync -a`` run twice against one mount). A symbolic link is an
object whose mode says so (``links``), written here with its metadata in one PUT.
"""

from __future__ import annotations

import logging
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from tiercache.errors import ObjectNotFoundError
from tiercache.metadata.freshness import Freshness
from tiercache.mount.links import LINK_MODE
from tiercache.mount.stored import SetAttrs, StoredMetadata, Version
from tiercache.store.base import ObjectInfo

log = logging.getLogger("tiercache.mount")

MTIME_KEY = "mtime"
MODE_KEY = "mode"
DEFAULT_FILE_MODE = 0o644  # what a file with no kept mode reports on a writable mount

# How long a set waits before the worker publishes it: ``rsync`` sets the times and mode of
# its temporary file and renames it right after, so the worker finds it under its last name.
_SETTLE = 0.2
_RETRY_DELAYS = (1.0, 5.0, 30.0)
_UPLOAD_WAIT = 600.0


@runtime_checkable
class MetadataStore(Protocol):
    """The store calls the keeper needs (``S3Store`` has them)."""

    def user_metadata(self, bucket: str, key: str) -> tuple[ObjectInfo, dict[str, str]]: ...

    def replace_metadata(
        self, bucket: str, key: str, metadata: Mapping[str, str], if_match: str
    ) -> None: ...

    def put_bytes(
        self, bucket: str, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo: ...


def to_metadata(attrs: SetAttrs) -> dict[str, str]:
    meta: dict[str, str] = {}
    if attrs.mtime_ns is not None:
        seconds, ns = divmod(attrs.mtime_ns, 10**9)
        meta[MTIME_KEY] = f"{seconds}.{ns:09d}"
    if attrs.symlink:
        meta[MODE_KEY] = str(LINK_MODE)
    elif attrs.mode is not None:
        meta[MODE_KEY] = str(stat.S_IFREG | (attrs.mode & 0o7777))
    return meta


def from_metadata(meta: Mapping[str, str]) -> SetAttrs:
    """What an object's metadata says (values other tools wrote included); bad values: None."""
    mode = _parse_mode(meta.get(MODE_KEY))
    return SetAttrs(
        _parse_mtime(meta.get(MTIME_KEY)),
        None if mode is None else mode & 0o7777,
        mode is not None and stat.S_ISLNK(mode),
    )


def _parse_mtime(value: str | None) -> int | None:
    if not value:
        return None
    whole, _, fraction = value.strip().partition(".")
    try:
        return int(whole) * 10**9 + int((fraction + "000000000")[:9] or 0)
    except ValueError:
        return None


def _parse_mode(value: str | None) -> int | None:
    if not value:
        return None
    value = value.strip()
    try:
        return int(value, 8) if value.startswith("0") else int(value)
    except ValueError:
        return None


class AttrKeeper:
    """Attributes set through the mount, by mount path, until they are in the store."""

    def __init__(
        self,
        fs: Any,
        full: Callable[[str], str],
        is_open: Callable[[str], bool],
        on_published: Callable[[str], None],
    ) -> None:
        self._fs = fs
        self._store = fs.store if isinstance(fs.store, MetadataStore) else None
        self._stored = StoredMetadata(Freshness(fs.config.consistency, fs.config.ttl))
        self._full = full
        self._is_open = is_open
        self._on_published = on_published
        self._cond = threading.Condition()
        self._kept: dict[str, SetAttrs] = {}
        self._dirs: dict[str, SetAttrs] = {}  # directories: kept here only
        self._due: dict[str, tuple[float, int]] = {}  # path -> (when, failed attempts)
        self._busy: str | None = None
        self._closed = False
        self._worker: threading.Thread | None = None

    @property
    def keeps_metadata(self) -> bool:
        """Whether the store keeps user metadata (else nothing set here outlives the mount)."""
        return self._store is not None

    # -- what operations tell it -------------------------------------------------------------

    def get(self, path: str) -> SetAttrs | None:
        with self._cond:
            return self._kept.get(path)

    def set(self, path: str, attrs: SetAttrs) -> None:
        """Keep ``attrs`` for ``path`` and publish them once nothing has it open."""
        with self._cond:
            self._kept[path] = self._kept.get(path, SetAttrs()).merged(attrs)
        self.schedule(path)

    def get_dir(self, path: str) -> SetAttrs | None:
        with self._cond:
            return self._dirs.get(path)

    def set_dir(self, path: str, attrs: SetAttrs) -> None:
        with self._cond:
            self._dirs[path] = self._dirs.get(path, SetAttrs()).merged(attrs)

    def written(self, path: str) -> None:
        """Bytes were written: a kept mtime is older than them."""
        with self._cond:
            kept = self._kept.get(path)
            if kept is not None and kept.mtime_ns is not None:
                kept = replace(kept, mtime_ns=None)
                if kept.empty():
                    del self._kept[path]
                else:
                    self._kept[path] = kept

    def moved(self, old: str, new: str) -> None:
        """Renamed (a file, or a directory with everything under it: see ``changed``)."""
        self._stored.forget(old, new)
        with self._cond:
            self._kept.pop(new, None)
            prefix = old.rstrip("/") + "/"
            for path in [p for p in self._dirs if p == old or p.startswith(prefix)]:
                self._dirs[new + path[len(old) :]] = self._dirs.pop(path)
            for path in [p for p in self._kept if p == old or p.startswith(prefix)]:
                self._kept[new + path[len(old) :]] = self._kept.pop(path)
                self._due.pop(path, None)
                self._due[new + path[len(old) :]] = (time.monotonic() + _SETTLE, 0)
            self._cond.notify_all()

    def removed(self, path: str) -> None:
        self._stored.forget(path)
        with self._cond:
            self._dirs.pop(path, None)
            self._kept.pop(path, None)
            self._due.pop(path, None)

    def schedule(self, path: str) -> None:
        """Publish the path's kept attributes soon (called again at its last release)."""
        with self._cond:
            if path not in self._kept or self._store is None:
                return
            self._due[path] = (time.monotonic() + _SETTLE, 0)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="mount-attrs", daemon=True)
                self._worker.start()
            self._cond.notify_all()

    def make_link(self, path: str, target: bytes, mtime_ns: int) -> None:
        """Store a symbolic link at ``path``: one PUT of its target with its type and mtime
        (``links``), remembered as this object version's metadata (``keeps_metadata`` only)."""
        assert self._store is not None
        bucket, _, key = self._full(path).partition("/")
        attrs = SetAttrs(mtime_ns, 0o777, symlink=True)
        read_at = time.time()
        info = self._store.put_bytes(bucket, key, target, to_metadata(attrs))
        self._stored.remember(path, Version.of_info(info), attrs, read_at)

    def changed(self, *paths: str) -> None:
        """The objects at ``paths`` were rewritten, moved or deleted here."""
        self._stored.forget(*paths)

    def stored(self, path: str, version: Version | None, vouched: bool) -> SetAttrs:
        """What the metadata of the object in the store says, if it is ``version`` (None: a
        version written here and not uploaded yet, which has no metadata): remembered while
        the consistency mode allows (``vouched``: see ``StoredMetadata.known``), else read by
        a HEAD."""
        if self._store is None or version is None:
            return SetAttrs()
        known = self._stored.known(path, version, vouched)
        if known is not None:
            return known
        found = self.head(path)
        if found is None:
            return SetAttrs()
        info, attrs = found
        return attrs if info.etag == version.etag else SetAttrs()

    def head(self, path: str) -> tuple[ObjectInfo, SetAttrs] | None:
        """The object's info and what its metadata says, read now (and remembered); None:
        no such object."""
        assert self._store is not None
        bucket, _, key = self._full(path).partition("/")
        read_at = time.time()
        try:
            info, meta = self._store.user_metadata(bucket, key)
        except ObjectNotFoundError:
            return None
        attrs = from_metadata(meta)
        self._stored.remember(path, Version.of_info(info), attrs, read_at)
        return info, attrs

    def remembered(self, path: str, version: Version, vouched: bool = True) -> SetAttrs | None:
        """``stored`` without asking the store (by default for a version a listing of the
        moment showed): None where that would take a HEAD."""
        if self._store is None:
            return SetAttrs()
        return self._stored.known(path, version, vouched)

    def drain(self, timeout: float) -> None:
        """Publish everything due now (at unmount), waiting at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._due = {path: (0.0, tries) for path, (_, tries) in self._due.items()}
            self._cond.notify_all()
            while (self._due or self._busy) and self._worker is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("unmounted with attributes of %d files unpublished", len(self._due))
                    break
                self._cond.wait(min(left, 0.1))
            self._closed = True
            self._cond.notify_all()

    # -- the worker --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                path = self._next_due()
                if path is None:
                    return
                tries = self._due.pop(path)[1]
                attrs = self._kept.get(path)
                self._busy = path
            try:
                if attrs is not None and not self._is_open(path):
                    self._publish(path, attrs, tries)
            finally:
                with self._cond:
                    self._busy = None
                    self._cond.notify_all()

    def _next_due(self) -> str | None:
        """The next path due (waiting for it); None once closed."""
        while not self._closed:
            now = time.monotonic()
            if self._due:
                path, (when, _) = min(self._due.items(), key=lambda item: item[1][0])
                if when <= now:
                    return path
                self._cond.wait(when - now)
            else:
                self._cond.wait()
        return None

    def _publish(self, path: str, attrs: SetAttrs, tries: int) -> None:
        assert self._store is not None
        full = self._full(path)
        bucket, _, key = full.partition("/")
        try:
            self._fs.flush(full, timeout=_UPLOAD_WAIT)  # its own upload lands first
            read_at = time.time()
            info, meta = self._store.user_metadata(bucket, key)
            wanted = {**meta, **to_metadata(attrs)}
            if wanted == meta:
                self._stored.remember(path, Version.of_info(info), from_metadata(meta), read_at)
            else:
                self._store.replace_metadata(bucket, key, wanted, info.etag)
                # Remembered before the kept attributes are dropped, so that getattr never
                # answers from what the object held before. The copy has a LastModified of
                # its own (unknown here) and may have a new ETag (that of a multipart object
                # changes); a tier's copy keeps showing the old one.
                published = Version(info.etag, info.size, None)
                self._stored.remember(path, published, from_metadata(wanted), time.time())
        except ObjectNotFoundError:
            log.debug("%s: gone before its attributes were published", path)
            self._forget(path, attrs)
            return
        except Exception as exc:
            if tries < len(_RETRY_DELAYS):
                with self._cond:
                    self._due[path] = (time.monotonic() + _RETRY_DELAYS[tries], tries + 1)
                return
            log.warning(
                "%s: times and mode set here not saved in the store (kept by this mount "
                "until it ends): %s",
                path,
                exc,
            )
            return
        self._forget(path, attrs)
        self._on_published(path)

    def _forget(self, path: str, attrs: SetAttrs) -> None:
        with self._cond:
            if self._kept.get(path) == attrs:  # not set again meanwhile
                del self._kept[path]
