"""Inter-process entry locks: ``flock`` on a lock file, released by the kernel if the owner dies."""

from __future__ import annotations

import fcntl
import os
import time

from tiercache.errors import CacheTimeoutError

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def try_lock(path: str, mode: int) -> int | None:
    """Take the exclusive lock on ``path`` without waiting; return its fd, or None if held.

    The inode check closes the race with an evictor that unlinks the lock file: a lock taken
    on an unlinked inode protects nothing, so we retry on the current file.
    """
    while True:
        fd = os.open(path, _OPEN_FLAGS, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        held = os.fstat(fd)
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            os.close(fd)
            continue
        if (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino):
            return fd
        os.close(fd)


def lock(path: str, mode: int, timeout: float, what: str) -> int:
    """Wait up to ``timeout`` seconds for the exclusive lock on ``path``; return its fd."""
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        fd = try_lock(path, mode)
        if fd is not None:
            return fd
        if time.monotonic() >= deadline:
            raise CacheTimeoutError(
                f"waited {timeout:.0f} s for another process to finish {what}; "
                "raise lock_timeout if fetches of this size take longer"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def unlock(fd: int) -> None:
    """Release a lock taken by ``lock``/``try_lock``."""
    os.close(fd)


def is_shared_locked(path: str) -> bool:
    """True if some process holds a lock on ``path`` (a reader's shared lock on a data file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
