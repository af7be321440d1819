"""Per-entry metadata of a tier: a small JSON file beside the data, replaced atomically."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

from tiercache.store.base import ObjectInfo

META_VERSION = 1


@dataclass(frozen=True)
class EntryPaths:
    """The files of one entry; every name is derived from a hash, never from the key."""

    data: str
    meta: str
    lock: str
    part: str


@dataclass(frozen=True, kw_only=True)
class EntryMeta:
    """What a tier knows of one cached object."""

    source: str
    namespace: str
    size: int
    etag: str
    digest: str
    fetched_at: float
    validated_at: float
    last_modified: float | None = None
    state: Literal["clean", "dirty"] = "clean"
    boot_id: str = ""
    generation: int = 0
    version: int = META_VERSION

    @classmethod
    def for_object(
        cls,
        info: ObjectInfo,
        source: str,
        namespace: str,
        digest: str,
        asked_at: float | None = None,
    ) -> EntryMeta:
        """Metadata of bytes just fetched from, or stored to, the store.

        ``asked_at``: when the store was asked for them (default: now). It is the entry's
        validation time: the store may have changed the object at any moment after it.
        """
        now = time.time()
        return cls(
            source=source,
            namespace=namespace,
            size=info.size,
            etag=info.etag,
            digest=digest,
            fetched_at=now,
            validated_at=now if asked_at is None else asked_at,
            last_modified=info.last_modified,
        )

    def to_json(self) -> bytes:
        # Every field is a scalar: the instance's own dict serves (``asdict`` deep-copies).
        return json.dumps(vars(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> EntryMeta | None:
        """Parse metadata; anything truncated, garbled or from another version gives ``None``."""
        try:
            fields: dict[str, Any] = json.loads(raw)
            meta = cls(**fields)
        except (ValueError, TypeError):
            return None
        valid = (
            meta.version == META_VERSION
            and isinstance(meta.source, str)
            and isinstance(meta.size, int)
            and meta.size >= 0
            and isinstance(meta.etag, str)
            and isinstance(meta.digest, str)
            and meta.state in ("clean", "dirty")
            and isinstance(meta.boot_id, str)
            and isinstance(meta.generation, int)
        )
        return meta if valid else None


def current_boot_id() -> str:
    """This kernel boot's id ("" where the platform has none).

    Entries are published without fsync: a process crash keeps the page cache, so only a
    kernel crash or power loss can tear an entry, and both change the boot id. An entry
    published under another boot id is checked against its digest before it is served.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class CachedEntry:
    """A published entry found in a tier."""

    entry_id: str
    paths: EntryPaths
    meta: EntryMeta


def write_atomically(path: str, payload: bytes, mode: int, durable: bool = True) -> None:
    """Write ``payload`` to ``path`` through a temp file and a rename: readers see old or new."""
    install(prepare_file(path, payload, mode, durable), path)


def prepare_file(path: str, payload: bytes, mode: int, durable: bool = True) -> str:
    """Write ``payload`` to a temp file beside ``path`` and return its name (``install``
    renames it into place). What can fail for lack of space fails here, changing nothing."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # exact bits whatever the umask (a group-shared tier needs g+rw)
        os.write(fd, payload)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def install(tmp: str, path: str) -> None:
    """Rename a file made by ``prepare_file`` into place (removing it if that fails)."""
    try:
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_meta(path: str) -> EntryMeta | None:
    """Read an entry's metadata; a missing or unreadable file is a miss, not an error."""
    return read_meta_if_present(path)[0]


def read_meta_if_present(path: str) -> tuple[EntryMeta | None, bool]:
    """``read_meta``, and whether the file was there at all (torn or foreign counts)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, False
    except OSError:
        return None, True
    try:
        raw = os.read(fd, 1 << 20)
    except OSError:
        return None, True
    finally:
        os.close(fd)
    return EntryMeta.from_json(raw), True


def read_small_file(path: str, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of a tier's small file (never through a link); None if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def shard_dir(parent: str, shard: str, dir_mode: int, ready: set[str]) -> str:
    """``parent/shard``, made if missing (once per process: ``ready`` remembers it); a
    symlink planted in its place is refused, so that nothing is written through it."""
    path = os.path.join(parent, shard)
    if shard not in ready:
        os.makedirs(path, mode=dir_mode, exist_ok=True)
        if os.path.islink(path):
            raise PermissionError(13, "a metadata directory is a symlink", path)
        ready.add(shard)
    return path
