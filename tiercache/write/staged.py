"""``StagedWriteFile``: ``open(..., "wb")`` stages bytes in the tier; a committer takes them.

Bytes go to a file in the tier's staging area while their xxh3 digest is computed and their
writeback to the disk starts (``EarlyWriteback``); on ``close()`` the committer
(``write.behind`` or ``write.through``) sends them on. If the ``with`` block raises, nothing
is committed: a half-written object never reaches the store.
The writer holds a ``flock`` on its staged file, so ``reconcile`` can tell the files of live
writers from those a killed writer left behind.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import xxhash

from tiercache.digest import hash_beside, xxh3_file
from tiercache.errors import tier_full
from tiercache.tiers.entry import install, prepare_file
from tiercache.tiers.local import LocalTier, fsync_dir, remove_file
from tiercache.write.streaming import PartStreamer
from tiercache.write.writeback import EarlyWriteback


@dataclass(frozen=True)
class StagedObject:
    """A finished write, fsynced, waiting for its committer."""

    bucket: str
    key: str
    source: str
    entry_id: str
    path: str
    fd: int
    size: int
    digest: str
    stream: PartStreamer | None = None  # parts already on their way to the store
    # Returns once ``fd``'s bytes are on disk; raises (``TierFullError`` for no space) if they
    # cannot be. A committer prepares what it can meanwhile and installs nothing before it.
    wait_durable: Callable[[], None] = lambda: None
    # The committer may rename ``path`` into the tier rather than link it there (nobody needs
    # it at its name after the commit: a file marked closed does, until its record is
    # durable); it calls ``moved`` once ``path`` is gone, so that nobody removes it again.
    movable: bool = False
    moved: Callable[[], None] = lambda: None


Committer = Callable[[StagedObject], dict[str, Any]]

# Beside a staged file: its writer closed it (see ``StagedWriteFile.mark_closed``).
CLOSED_SUFFIX = ".closed"


class StagedWriteFile(io.RawIOBase):
    """A write-only binary file whose ``close()`` hands the bytes to a committer."""

    def __init__(
        self,
        path: str,
        bucket: str,
        key: str,
        *,
        tier: LocalTier,
        entry_id: str,
        source: str,
        commit: Committer,
        on_close: Callable[[], None] | None = None,
        stream: Callable[[str], PartStreamer] | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self.name = path
        self.mode = "wb"
        self._bucket = bucket
        self._key = key
        self._entry_id = entry_id
        self._source = source
        self._commit = commit
        self._on_close = on_close
        self._staged = tier.staging_path(entry_id)
        self._file_mode = tier.file_mode
        # The entry's directory is made now, not by the commit: on a shared filesystem
        # (ceph-fuse) that commit's metadata calls queue behind the fsync of the bytes.
        tier.paths(entry_id)
        # Read-write: the mount serves reads and mmap of a file being written from it.
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self._fd = os.open(self._staged, flags, tier.file_mode)
        except OSError as exc:
            raise _tier_full(exc, path, 0, self._staged) from exc
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # a live writer's file (see reconcile)
        self._writeback = EarlyWriteback(self._fd)  # close()'s fsync waits for the last step
        self._stream = stream(self._staged) if stream is not None else None
        self._hasher = xxhash.xxh3_64()
        self._size = 0
        self._fd_exposed = False
        self._broken = False
        self._marked_closed = False
        self._moved = False  # the committer moved the staged file into the tier
        self._fsync: _Fsync | None = None
        self.info: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<StagedWriteFile {self.path!r} written={self._size}>"

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._size

    def fileno(self) -> int:
        """The staged file's descriptor (for ``os.fsync`` by frameworks such as DCP).

        Bytes written through it bypass the running digest, so once it has been handed out
        ``close()`` hashes the staged file instead.
        """
        self._checkClosed()
        self._fd_exposed = True
        if self._stream is not None:
            self._stream.stop()  # parts sent so far are checked against the file at the end
        return self._fd

    def write(self, data: Any) -> int:
        self._checkClosed()
        view = memoryview(data).cast("B")
        hashing = hash_beside(self._hasher, view)  # on another core while the bytes are written
        done = 0
        try:
            while done < len(view):
                done += os.write(self._fd, view[done:])
        except OSError as exc:
            self._broken = True  # a file missing bytes must never be committed
            raise _tier_full(exc, self.path, self._size + done, self._staged) from exc
        finally:
            if hashing is not None:
                hashing.result()  # the caller's buffer is its own again only once hashed
        if hashing is None:
            self._hasher.update(view)
        self._size += done
        self._writeback.wrote(self._size)
        if self._stream is not None:
            self._stream.wrote(self._size)
        return done

    def close(self) -> None:
        if self.closed:
            return
        if self._broken:
            self.discard()
            return
        try:
            size, digest = self._size, self._hasher.hexdigest()
            if self._fd_exposed:
                size, digest = xxh3_file(self._staged)
            # The fsync runs while the committer takes its lock and prepares its files (on a
            # shared filesystem each of those is a round trip to its metadata server).
            background = size >= _BACKGROUND_FSYNC_BYTES
            self._fsync = _Fsync(self._fd, background)
            if not background:
                self._wait_durable()  # done already: a failure stops here, before the commit
            staged = StagedObject(
                self._bucket,
                self._key,
                self._source,
                self._entry_id,
                self._staged,
                self._fd,
                size,
                digest,
                self._stream,
                self._wait_durable,
                movable=not self._marked_closed,
                moved=self._staged_moved,
            )
            self.info = self._commit(staged)  # the committer owns the stream from here
            self._stream = None
            self._wait_durable()  # waited for already by every committer: never returns early
        finally:
            self._cleanup()
            super().close()

    def _staged_moved(self) -> None:
        self._moved = True

    def _wait_durable(self) -> None:
        assert self._fsync is not None
        try:
            self._fsync.wait()  # delayed allocation can report ENOSPC only here
        except OSError as exc:
            raise _tier_full(exc, self.path, self._size, self._staged) from exc

    def mark_closed(self, namespace: str) -> None:
        """The writer closed its file but may write on (a mount: another descriptor of it is
        still open): should this process die before ``close()``, ``reconcile`` commits the
        staged bytes as they are rather than dropping them. Fsyncs them first.

        The mark holds the instant of this acknowledgement (rewritten at each one): the
        recovered write is ordered there, so that it never overtakes a write committed
        after it (``WriteState.commit``)."""
        self._checkClosed()
        os.fsync(self._fd)
        mark = self._staged + CLOSED_SUFFIX
        row = {
            "bucket": self._bucket,
            "key": self._key,
            "source": self._source,
            "entry_id": self._entry_id,
            "namespace": namespace,
            "acknowledged_ns": time.time_ns(),
        }
        self._marked_closed = True
        install(prepare_file(mark, json.dumps(row).encode(), self._file_mode), mark)
        fsync_dir(os.path.dirname(mark))

    def discard(self) -> None:
        """Close without committing anything."""
        if not self.closed:
            self._cleanup()
            super().close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.discard()
        else:
            self.close()

    def _cleanup(self) -> None:
        if self._stream is not None:  # not committed: nothing of this write may land
            self._stream.abort()
            self._stream = None
        if self._on_close is not None:
            self._on_close()
        if self._fsync is not None:
            self._fsync.join()  # not closed under a running fsync (a commit that failed early)
        os.close(self._fd)
        if self._marked_closed:
            remove_file(self._staged + CLOSED_SUFFIX)
        if not self._moved:  # a file removed is a metadata round trip on a shared tier
            remove_file(self._staged)


# From this size on, close() fsyncs on a helper thread while the commit prepares; below it,
# at once (a thread costs more than it could save).
_BACKGROUND_FSYNC_BYTES = 1024 * 1024


class _Fsync:
    """``fsync(fd)``, at once or on a helper thread; ``wait`` returns or raises its outcome."""

    def __init__(self, fd: int, background: bool) -> None:
        self._error: OSError | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._run, args=(fd,), name="tiercache-fsync", daemon=True
            )
            self._thread.start()
        else:
            self._run(fd)

    def _run(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            self._error = exc

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def wait(self) -> None:
        self.join()
        if self._error is not None:
            raise self._error


def _tier_full(exc: OSError, path: str, written: int, staged: str) -> OSError:
    """No space or quota as the documented ``TierFullError``; other errors unchanged."""
    return tier_full(
        exc,
        f"no space left in the local tier while writing {path} ({written} bytes written); "
        "nothing of it will be uploaded",
        staged,
    )
