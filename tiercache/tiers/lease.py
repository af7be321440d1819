"""Lease locks for a shared tier: a lock file naming its owner, kept alive by a heartbeat.

``flock`` is not enough on a filesystem that many hosts mount: NFS maps it to byte-range locks
that some servers or mount options refuse, and a lock held by a host that died must be broken
by the others. A lease is a file created with ``O_EXCL`` holding the owner's host, pid, boot
id and a random token; its mtime is the heartbeat, refreshed by a thread of the owning process.
A waiter may break a lease whose heartbeat is older than ``stale_after`` seconds, or whose
owner is a dead process of its own host. Breakers serialize through a second ``O_EXCL`` file
and re-read the lease before removing it, so two waiters never both break a live lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass

from tiercache import forksafe
from tiercache.errors import CacheTimeoutError
from tiercache.tiers.entry import current_boot_id, read_small_file

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class LeaseOwner:
    """Who holds a lease."""

    host: str
    pid: int
    boot_id: str
    token: str

    def to_json(self) -> bytes:
        return json.dumps(
            {"host": self.host, "pid": self.pid, "boot_id": self.boot_id, "token": self.token}
        ).encode()

    @classmethod
    def read(cls, path: str) -> LeaseOwner | None:
        data = read_small_file(path, 4096)
        try:
            raw = json.loads(data or b"")
            return cls(str(raw["host"]), int(raw["pid"]), str(raw["boot_id"]), str(raw["token"]))
        except (ValueError, KeyError, TypeError):
            return None  # missing, being written, or garbage: judged by its age alone


class Heartbeat:
    """Refreshes the mtime of every lease this process holds, from one daemon thread."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}  # path -> token
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.interval = 1.0
        forksafe.register(self)

    def after_fork(self) -> None:
        """A child holds none of its parent's leases and has no heartbeat thread."""
        self._held = {}
        self._lock = threading.Lock()
        self._thread = None

    def add(self, path: str, token: str, interval: float) -> None:
        with self._lock:
            self._held[path] = token
            self.interval = min(self.interval, interval)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tiercache-heartbeat", daemon=True
                )
                self._thread.start()

    def remove(self, path: str) -> None:
        with self._lock:
            self._held.pop(path, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            with self._lock:
                held = list(self._held)
            for path in held:
                with contextlib.suppress(OSError):
                    os.utime(path, follow_symlinks=False)


_HEARTBEAT = Heartbeat()


def keep_alive(path: str, token: str, stale_after: float) -> None:
    """Refresh the mtime of the file at ``path`` from this process's heartbeat until
    ``stop_keeping_alive``: others judge it stale after ``stale_after`` seconds without."""
    _HEARTBEAT.add(path, token, max(0.05, stale_after / 4))


def stop_keeping_alive(path: str) -> None:
    _HEARTBEAT.remove(path)


def is_stale(path: str, stale_after: float) -> bool:
    """True if the file at ``path`` went ``stale_after`` seconds without a heartbeat."""
    try:
        return time.time() - os.stat(path, follow_symlinks=False).st_mtime > stale_after
    except FileNotFoundError:
        return False


class LeaseLock:
    """Acquire and release lease files for one tier (host identity and staleness policy)."""

    def __init__(self, host_id: str | None, stale_after: float, mode: int) -> None:
        self.host = host_id or socket.gethostname()
        self.stale_after = stale_after
        self.mode = mode
        self.boot_id = current_boot_id()
        self.broken = 0  # leases taken over from dead owners (for stats and tests)

    def acquire(self, path: str, timeout: float, what: str) -> str:
        """Wait up to ``timeout`` seconds for the lease at ``path``; return its token."""
        deadline = time.monotonic() + timeout
        pause = 0.005
        while True:
            token = self.try_acquire(path)
            if token is not None:
                return token
            self.break_if_stale(path)
            if time.monotonic() >= deadline:
                owner = LeaseOwner.read(path)
                held_by = f" (held by {owner.host} pid {owner.pid})" if owner else ""
                raise CacheTimeoutError(
                    f"waited {timeout:.0f} s for another process to finish {what}{held_by}; "
                    "raise lock_timeout if fetches of this size take longer"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def try_acquire(self, path: str) -> str | None:
        """Create the lease if nobody holds it; return its token, or None."""
        owner = LeaseOwner(self.host, os.getpid(), self.boot_id, secrets.token_hex(8))
        try:
            fd = os.open(path, _CREATE, self.mode)
        except FileExistsError:
            return None
        try:
            os.fchmod(fd, self.mode)
            os.write(fd, owner.to_json())
        except BaseException:
            # A full or over-quota filesystem refuses the owner's bytes: a lease file left
            # behind would hold every other host's fetch of the entry for stale_after.
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        keep_alive(path, owner.token, self.stale_after)
        return owner.token

    def release(self, path: str, token: str) -> None:
        """Remove the lease if it is still ours (a breaker may have taken it over)."""
        stop_keeping_alive(path)
        owner = LeaseOwner.read(path)
        if owner is not None and owner.token == token:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def is_held(self, path: str) -> bool:
        """True if a live owner holds the lease at ``path``."""
        return os.path.exists(path) and not self._is_stale(path)

    def _is_stale(self, path: str) -> bool:
        try:
            age = time.time() - os.stat(path, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return False
        if age > self.stale_after:
            return True
        owner = LeaseOwner.read(path)
        return (
            owner is not None
            and owner.host == self.host
            and owner.boot_id == self.boot_id
            and not _process_alive(owner.pid)
        )

    def break_if_stale(self, path: str) -> None:
        """Remove the lease at ``path`` if its owner is dead (see the module docstring)."""
        if not self._is_stale(path):
            return
        guard = path + ".break"
        try:
            fd = os.open(guard, _CREATE, self.mode)
        except FileExistsError:
            # Another waiter is breaking it; a guard left by a breaker that died is removed.
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.stat(guard).st_mtime > 2 * self.stale_after:
                    os.unlink(guard)
            return
        os.close(fd)
        try:
            if self._is_stale(path):  # re-read under the guard: it may have been replaced
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    self.broken += 1
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(guard)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True
