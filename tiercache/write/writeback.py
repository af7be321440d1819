"""Early writeback: a staged file's pages start for the disk while its writer goes on writing.

A checkpoint's ``close()`` fsyncs its staged file. Left to itself, the kernel writes the dirty
pages out only then (or when its dirty thresholds are reached), so the whole file's disk time
lands in ``close()``, after the writes and their hashing. Starting the writeback of each step
as soon as it is written (Linux ``sync_file_range`` with ``SYNC_FILE_RANGE_WRITE``: start, do
not wait) lets the disk work while the writer writes and hashes the next step; the final fsync
then waits for the last step only. Where the call is missing or refused (another OS, a
filesystem that has no pages of its own to write), nothing changes: the fsync does it all.
"""

from __future__ import annotations

import ctypes

from tiercache.libc import libc_function

STEP_BYTES = 8 * 1024 * 1024  # the writeback of each 8 MiB written starts at once
_SYNC_FILE_RANGE_WRITE = 2


_sync_file_range = libc_function(
    "sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
)


class EarlyWriteback:
    """Starts the disk writes of a file written in order, one step behind its writer."""

    def __init__(self, fd: int, step: int | None = None) -> None:
        step = STEP_BYTES if step is None else step
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step}")
        self._fd = fd
        self._step = step
        self._started = 0  # bytes whose writeback was started
        self._enabled = _sync_file_range is not None
        self.calls = 0

    def wrote(self, size: int) -> None:
        """The file now holds ``size`` bytes: start the writeback of any full step."""
        if not self._enabled or size - self._started < self._step:
            return
        assert _sync_file_range is not None
        self.calls += 1
        if _sync_file_range(self._fd, self._started, size - self._started, _SYNC_FILE_RANGE_WRITE):
            # Refused here (ESPIPE, EINVAL on some filesystems): the fsync writes it all. An
            # I/O error is reported by that fsync too, which close() raises.
            self._enabled = False
        self._started = size
