"""Block-granular entries: a huge object cached block by block, as its readers touch it.

Files of a block entry in a tier (beside whole entries, same hashed base name)::

    <64 hex>.blk      the object's bytes at their offsets, a sparse file of the object's size
    <64 hex>.blkmap   append-only log of the blocks present: one "index xxh3\\n" line each
    <64 hex>.blkmeta  JSON: source, size, ETag, block size, boot id; its mtime is last access

A block's bytes are written before its log line is appended, so a logged block is complete;
a torn last line is ignored. Two processes fetching the same block write the same bytes (every
GET is pinned to the entry's ETag). An entry from an earlier boot is discarded: unsynced
blocks may be torn. Block entries live in the local tier only.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from tiercache.store.base import ObjectInfo
from tiercache.tiers.entry import read_small_file, write_atomically
from tiercache.tiers.local import LocalTier, block_paths, remove_file

BLOCK_META_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class BlockMeta:
    """What a tier knows of an object cached by blocks."""

    source: str
    namespace: str
    size: int
    etag: str
    block_size: int
    boot_id: str
    validated_at: float
    last_modified: float | None = None
    version: int = BLOCK_META_VERSION

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def read(cls, path: str) -> BlockMeta | None:
        raw = read_small_file(path, 1 << 16)
        if raw is None:
            return None
        try:
            fields: dict[str, Any] = json.loads(raw)
            meta = cls(**fields)
        except (ValueError, TypeError):
            return None
        ok = (
            meta.version == BLOCK_META_VERSION
            and isinstance(meta.size, int)
            and isinstance(meta.block_size, int)
            and meta.block_size > 0
        )
        return meta if ok else None


class BlockEntry:
    """An open block entry: which blocks are present, and their bytes."""

    def __init__(self, tier: LocalTier, entry_id: str, meta: BlockMeta, fd: int) -> None:
        self.tier = tier
        self.entry_id = entry_id
        self.meta = meta
        self.paths = block_paths(tier.paths(entry_id))
        self._fd = fd
        self._lock = threading.Lock()
        self._present: dict[int, str] = {}
        self._log_offset = 0

    @property
    def blocks(self) -> int:
        return -(-self.meta.size // self.meta.block_size) if self.meta.size else 0

    def block_range(self, index: int) -> tuple[int, int]:
        start = index * self.meta.block_size
        return start, min(start + self.meta.block_size, self.meta.size)

    # -- opening -----------------------------------------------------------------------------

    @staticmethod
    def lookup(tier: LocalTier, entry_id: str, namespace: str, source: str) -> BlockMeta | None:
        """The block entry's metadata, if there is one for ``source`` from this boot."""
        meta = BlockMeta.read(block_paths(tier.paths(entry_id)).meta)
        if meta is None or meta.source != source or meta.namespace != namespace:
            return None
        return meta if meta.boot_id == tier.boot_id else None

    @classmethod
    def open(
        cls,
        tier: LocalTier,
        entry_id: str,
        info: ObjectInfo,
        source: str,
        namespace: str,
        block_size: int,
        lock_timeout: float,
        create: bool = True,
    ) -> BlockEntry | None:
        """Open the block entry of this object version, creating it (empty) if needed; with
        ``create=False``, None if it is gone (completed into a whole entry, or evicted)."""
        with tier.entry_lock(entry_id, lock_timeout) as entry_paths:
            paths = block_paths(entry_paths)
            meta = BlockMeta.read(paths.meta)
            if (
                meta is None
                or meta.source != source
                or meta.etag != info.etag
                or meta.size != info.size
                or meta.boot_id != tier.boot_id
            ):
                if not create:
                    return None
                for path in (paths.meta, paths.log, paths.data):
                    remove_file(path)
                meta = BlockMeta(
                    source=source,
                    namespace=namespace,
                    size=info.size,
                    etag=info.etag,
                    block_size=block_size,
                    boot_id=tier.boot_id,
                    validated_at=time.time(),
                    last_modified=info.last_modified,
                )
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(paths.data, flags, tier.file_mode)
                os.ftruncate(fd, info.size)
                os.close(fd)
                os.close(os.open(paths.log, flags, tier.file_mode))
                write_atomically(paths.meta, meta.to_json(), tier.file_mode, durable=False)
            fd = os.open(paths.data, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_SH)  # eviction skips an entry someone reads
        entry = cls(tier, entry_id, meta, fd)
        entry.refresh()
        return entry

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- blocks ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read log lines appended since the last look (by this or another process)."""
        try:
            fd = os.open(self.paths.log, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            self._adopt_if_completed()
            return
        try:
            with self._lock:
                raw = os.pread(fd, 1 << 24, self._log_offset)
                complete = raw[: raw.rfind(b"\n") + 1]
                self._log_offset += len(complete)
                for line in complete.splitlines():
                    index, _, digest = line.decode("ascii", "replace").partition(" ")
                    if index.isdigit() and int(index) < self.blocks:
                        self._present[int(index)] = digest
        finally:
            os.close(fd)

    def _adopt_if_completed(self) -> None:
        """The log is gone: if its entry was completed, the file this entry reads is now the
        whole entry's data, every block in it (logged with no digest of its own: the whole
        entry's digest covers them); if it was evicted, nothing changes."""
        try:
            published = os.stat(self.tier.paths(self.entry_id).data)
        except FileNotFoundError:
            return
        mine = os.fstat(self._fd)
        if (published.st_dev, published.st_ino) == (mine.st_dev, mine.st_ino):
            with self._lock:
                for index in range(self.blocks):
                    self._present.setdefault(index, "")

    def has(self, index: int) -> bool:
        with self._lock:
            return index in self._present

    def present_count(self) -> int:
        with self._lock:
            return len(self._present)

    def digest(self, index: int) -> str | None:
        with self._lock:
            return self._present.get(index)

    def write_block(self, index: int, data: bytes, digest: str) -> None:
        """Store a block's bytes, then log it as present."""
        start, end = self.block_range(index)
        if len(data) != end - start:
            raise OSError(
                f"block {index} of {self.meta.source}: {len(data)} bytes, not {end - start}"
            )
        written = os.pwrite(self._fd, data, start)
        if written != len(data):
            raise OSError(f"short write to {self.paths.data}: {written} of {len(data)} bytes")
        try:
            fd = os.open(self.paths.log, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:  # completed (now a whole entry) or evicted meanwhile:
            with self._lock:  # the bytes are in the file this entry reads all the same
                self._present[index] = digest
            return
        try:
            os.write(fd, f"{index} {digest}\n".encode("ascii"))
        finally:
            os.close(fd)
        with self._lock:
            self._present[index] = digest

    def forget(self, index: int) -> None:
        """A block failed its digest check: treat it as missing (refetched over it)."""
        with self._lock:
            self._present.pop(index, None)

    def pread(self, count: int, offset: int) -> bytes:
        return os.pread(self._fd, count, offset)

    def preadv(self, buffer: memoryview, offset: int) -> int:
        return os.preadv(self._fd, [buffer], offset)

    def touch(self) -> None:
        try:
            os.utime(self.paths.meta, follow_symlinks=False)
        except OSError:
            pass
