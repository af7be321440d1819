"""``Ledger``: a tier's bytes promised but not on disk yet, counted for every process of the node.

A tier's budget is one for the node, whatever number of processes share the tier (readers,
DataLoader workers, prefetch, promotion). Bytes on disk are what a scan of the tier finds;
what a scan cannot see is kept here, in a small file every process of the tier maps
(``ROOT/ledger``, 32 KiB)::

    header  magic, slots used, bytes published (a running sum: read as a difference)
    slot    pid, bytes reserved (fetches in flight), prefetch window held

- *Reserved*: a fetch reserves its object's size before it writes a byte and hands the bytes
  over to ``published`` as its entry appears. Eviction makes room against the node's total,
  so no process fetches into room another process has promised.
- *Published*: added by whoever publishes, so that a usage scanned a moment ago plus what
  was published since is the tier's usage, in every process (a scan is reused for a second).
- *Window*: the bytes each process's prefetch holds, in flight or pinned and not yet read; a
  prefetch window is one for the node, as the budget is.

Each process writes its own slot alone, with plain aligned 8-byte stores into the shared
mapping: a warm read that lets go of a prefetched object does no system call for it. A
reservation, an addition to ``published`` and the taking of a slot hold ``flock`` on the file,
so that a reservation sees every one taken before it (a cold fetch pays that lock).

A process holds its slot with an open-file-description lock on the slot's bytes, which the
kernel drops when the process dies (killed -9 included), whatever its pid namespace: a slot
nobody holds counts nothing once a reservation looks (at most every ``_REAP_EVERY`` seconds)
and is taken again. The file is opened without following a link; where it cannot be used (a
planted link, a read-only tier, every slot taken, no such locks) the process counts its own
bytes alone (``ProcessLedger``).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import stat
import struct
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Protocol

from tiercache import forksafe

log = logging.getLogger(__name__)

SLOTS = 1024  # processes of a node on one tier at once; past that a process counts alone
_MAGIC = int.from_bytes(b"tcledgr1", "little")
_HEADER_WORDS = 8  # 64 bytes: magic, slots used, published, spare
_USED, _PUBLISHED = 1, 2
_SLOT_WORDS = 4  # 32 bytes: pid (for a person looking), reserved, window, spare
_PID, _RESERVED, _WINDOW = range(3)
FILE_BYTES = 8 * (_HEADER_WORDS + SLOTS * _SLOT_WORDS)
_REAP_EVERY = 2.0  # seconds between looks for dead processes' slots still holding bytes


class Ledger(Protocol):
    """Bytes a tier has promised (reserved) and published, and the prefetch window held."""

    def reserve(self, nbytes: int) -> None:
        """Add ``nbytes`` to this process's reservation, seen by every reservation after it."""
        ...

    def release(self, nbytes: int) -> None:
        """Take ``nbytes`` off this process's reservation (abandoned, or counted elsewhere)."""
        ...

    def published(self, nbytes: int, released: int = 0) -> None:
        """``nbytes`` now take the tier's space as published; ``released`` of this process's
        reservation goes in the same step (after the addition: never counted nowhere)."""
        ...

    def totals(self) -> tuple[int, int]:
        """The running sum of bytes published, and the bytes reserved now, on the node."""
        ...

    def own_reserved(self) -> int:
        """Bytes this process reserved and has not released."""
        ...

    def hold_window(self, nbytes: int) -> None:
        """This process's prefetch holds ``nbytes`` of the window now."""
        ...

    def window_elsewhere(self) -> int:
        """Bytes of the window the node's other processes hold."""
        ...


class ProcessLedger:
    """The bytes of this process alone: for a tier no other process of the node can count with
    (see the module docstring)."""

    def __init__(self) -> None:
        self._published = 0
        self.after_fork()
        forksafe.register(self)

    def after_fork(self) -> None:
        """The parent's fetches are not the child's (``published``, a running sum, goes on)."""
        self._lock = threading.Lock()
        self._reserved = 0

    def reserve(self, nbytes: int) -> None:
        with self._lock:
            self._reserved += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes

    def published(self, nbytes: int, released: int = 0) -> None:
        with self._lock:
            self._published += nbytes
            self._reserved -= released

    def totals(self) -> tuple[int, int]:
        return self._published, self._reserved

    def own_reserved(self) -> int:
        return self._reserved

    def hold_window(self, nbytes: int) -> None:
        pass  # nobody else to tell

    def window_elsewhere(self) -> int:
        return 0


class NodeLedger:
    """The ledger file of a tier, shared by the node's processes (see the module docstring).
    Open it with ``ledger_at``."""

    def __init__(self, path: str, file_mode: int) -> None:
        self.path = path
        self._file_mode = file_mode
        self._fds: list[int] = []  # this process's open file: ``_close_all`` closes it
        weakref.finalize(self, _close_all, self._fds)
        self._attach()
        self._reset()
        forksafe.register(self)

    def _attach(self) -> None:
        """Open and map the file: an open file (and mapping) of this process's own, whose
        locks no other process shares."""
        fd = _open(self.path, self._file_mode)
        try:
            with _flocked(fd):
                if os.fstat(fd).st_size < FILE_BYTES:
                    os.ftruncate(fd, FILE_BYTES)
                self._map = mmap.mmap(fd, FILE_BYTES)
                self._words = memoryview(self._map).cast("q")
                if self._words[0] != _MAGIC:  # new, or not a ledger: counting starts afresh
                    self._map[:] = bytes(FILE_BYTES)
                    self._words[0] = _MAGIC
        except BaseException:
            os.close(fd)
            raise
        self._fds[:] = [fd]

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._slot = -1  # this process's first word in the file; -1: none taken yet
        self._alone = False  # no slot to be had: this process counts its own bytes alone
        self._reserved = 0
        self._window = 0
        self._reaped_at = 0.0

    def after_fork(self) -> None:
        """A child is a process of its own: its own slot, open file and mapping. The parent's
        (inherited) keep the parent's slot lock alive for as long as they exist, and share
        the parent's ``flock``."""
        published = self._words[_PUBLISHED]
        with suppress(BufferError):  # nothing else uses it in a new child: it goes
            self._words.release()
            self._map.close()
        _close_all(self._fds)
        self._reset()
        try:
            self._attach()
        except OSError:
            self._fds[:] = []
            self._map = mmap.mmap(-1, FILE_BYTES)  # the file went: count alone
            self._words = memoryview(self._map).cast("q")
            self._words[_PUBLISHED] = published  # a running sum: usages read differences
            self._alone = True

    # -- this process's slot (hold ``_lock``) ------------------------------------------------

    def _own(self) -> int:
        """This process's slot, taken on first use; -1 where none can be had."""
        if self._slot < 0 and not self._alone:
            with _flocked(self._fds[0]):
                self._slot = self._claim()
            if self._slot < 0:
                self._alone = True
                log.warning(
                    "%d processes use the tier of %s: this one counts its own fetches alone",
                    SLOTS,
                    self.path,
                )
        return self._slot

    def _claim(self) -> int:
        """A slot no live process holds, locked for this one (hold the file's lock): the
        first whose range this open file can lock, else a new one."""
        words, used = self._words, self._words[_USED]
        for n in range(min(used + 1, SLOTS)):
            at = _HEADER_WORDS + n * _SLOT_WORDS
            if not _try_lock_slot(self._fds[0], at):
                continue
            if n == used:
                words[_USED] = used + 1
            words[at + _PID] = os.getpid()
            words[at + _RESERVED] = self._reserved  # a dead owner's bytes go
            words[at + _WINDOW] = self._window
            return at
        return -1

    def _write(self, field: int, value: int) -> None:
        if self._slot >= 0:
            self._words[self._slot + field] = value

    def _reap(self) -> None:
        """Forget the bytes of slots whose process is gone (hold the file's lock)."""
        words, fd = self._words, self._fds[0]
        for n in range(words[_USED]):
            at = _HEADER_WORDS + n * _SLOT_WORDS
            if at == self._slot or not (words[at + _RESERVED] or words[at + _WINDOW]):
                continue
            if not _slot_locked(fd, at):
                words[at + _RESERVED] = 0
                words[at + _WINDOW] = 0

    # -- the ledger --------------------------------------------------------------------------

    def reserve(self, nbytes: int) -> None:
        with self._lock:
            self._own()
            self._reserved += nbytes
            if self._slot < 0:
                return
            # Under the file's lock: whoever reserves after this sees these bytes, and this
            # process sees those reserved before it (plain stores alone may be reordered).
            with _flocked(self._fds[0]):
                self._write(_RESERVED, self._reserved)
                now = time.monotonic()
                if now - self._reaped_at >= _REAP_EVERY:
                    self._reaped_at = now
                    self._reap()

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes
            self._write(_RESERVED, self._reserved)

    def published(self, nbytes: int, released: int = 0) -> None:
        with self._lock:
            self._reserved -= released
            if self._alone:
                self._words[_PUBLISHED] += nbytes  # a private mapping: nobody to lock out
                return
            with _flocked(self._fds[0]):
                self._words[_PUBLISHED] += nbytes
                self._write(_RESERVED, self._reserved)

    def totals(self) -> tuple[int, int]:
        reserved = self._field_sum(_RESERVED)
        if self._slot < 0:
            reserved += self._reserved  # not in the file (no slot taken, or none to be had)
        return self._words[_PUBLISHED], reserved

    def own_reserved(self) -> int:
        return self._reserved

    def hold_window(self, nbytes: int) -> None:
        """No lock once the slot is taken (the one prefetch engine of the tier calls this
        under its own lock): a reader's open of a prefetched object gives its share back with
        one store to memory."""
        self._window = nbytes
        if self._slot < 0 and nbytes:
            with self._lock:
                self._own()  # the first time only: a prefetch is cold work
        self._write(_WINDOW, nbytes)

    def window_elsewhere(self) -> int:
        mine = self._window if self._slot >= 0 else 0
        return self._field_sum(_WINDOW) - mine

    def _field_sum(self, field: int) -> int:
        """A field summed over the slots (those of processes gone count until reaped)."""
        words = self._words
        first = _HEADER_WORDS + field
        total = 0
        for at in range(first, first + words[_USED] * _SLOT_WORDS, _SLOT_WORDS):
            total += words[at]
        return total


# The ledgers open in this process, by the real path of their file: the tiers of several
# filesystems on one root share one (an open file each would be a descriptor each, kept for
# as long as the filesystem lives).
_opened: weakref.WeakValueDictionary[str, NodeLedger] = weakref.WeakValueDictionary()
_opened_lock = threading.Lock()


def ledger_at(path: str, file_mode: int) -> Ledger:
    """The node's ledger file at ``path`` (made if missing); where it cannot be used (a
    planted link, a read-only tier, no open-file-description locks: not Linux), this
    process's own count, with a warning."""
    if not hasattr(fcntl, "F_OFD_SETLK"):
        return ProcessLedger()
    key = os.path.realpath(path)
    with _opened_lock:  # one open file (and slot) per ledger in a process, however many tiers
        known = _opened.get(key)
        if known is not None:
            return known
    try:
        ledger = NodeLedger(path, file_mode)
        with _opened_lock:
            return _opened.setdefault(key, ledger)
    except OSError as exc:
        log.warning(
            "cannot use the tier's ledger %s (%s): this process counts the tier's budget alone",
            path,
            exc,
        )
        return ProcessLedger()


def _open(path: str, mode: int) -> int:
    """Open (or make) the ledger file, never through a link; refuse anything but a file."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(path, flags, mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PermissionError(13, "the tier's ledger is not a regular file", path)
    return fd


_FLOCK = struct.Struct("@hhqqi4x")  # struct flock: type, whence, start, length, pid


def _try_lock_slot(fd: int, at: int) -> bool:
    """Take the slot's byte range with an open-file-description lock, held until the last
    reference to this open file goes (the process's death included)."""
    request = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, at * 8, _SLOT_WORDS * 8, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _slot_locked(fd: int, at: int) -> bool:
    """Whether a live process holds the slot (another open file's lock on its range)."""
    request = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, at * 8, _SLOT_WORDS * 8, 0)
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, request)
    return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)


@contextmanager
def _flocked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with suppress(OSError):
            os.close(fd)
