"""With ``--no-passthrough``, a descriptor open for reading sees what another one writes.

``tail -f`` of a log written through the mount: the reader opened the file before the writer
appended to it or rewrote bytes in place, and reads through its open descriptor must return
the new bytes (not an end of file at the old end, nor the old bytes) within the mount's
attribute timeout; after the writer's last close commits the file, and when a new writer
appends again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.mount_helpers import requires_fuse

pytestmark = [pytest.mark.integration, requires_fuse]

ATTR_TIMEOUT = 1.0


def _read_until(fd: int, size: int, offset: int, want: bytes) -> bytes:
    """``pread`` until it returns ``want``, for at most the attribute timeout (and slack)."""
    deadline = time.monotonic() + ATTR_TIMEOUT + 1.0
    while True:
        got = os.pread(fd, size, offset)
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_a_reader_sees_appends_and_rewrites_of_another_descriptor(
    bucket: str, mount: Callable[..., Path]
) -> None:
    mnt = mount(f"s3://{bucket}/logs", "--no-passthrough", "--attr-timeout", str(ATTR_TIMEOUT))
    path = mnt / "app.log"
    path.write_bytes(b"line 1\n")  # committed: a stored version the reader opens
    reader = os.open(path, os.O_RDONLY)
    writers: list[int] = []
    try:
        assert os.read(reader, 100) == b"line 1\n"
        writers.append(os.open(path, os.O_WRONLY | os.O_APPEND))
        os.write(writers[0], b"line 2\n")
        assert os.fstat(reader).st_size == 14
        assert _read_until(reader, 100, 7, b"line 2\n") == b"line 2\n"  # the append
        writers.append(os.open(path, os.O_WRONLY))
        os.pwrite(writers[1], b"LINE", 0)  # in place, through a second descriptor
        assert _read_until(reader, 4, 0, b"LINE") == b"LINE"
        while writers:
            os.close(writers.pop())  # the last close commits the file
        whole = b"LINE 1\nline 2\n"
        assert _read_until(reader, 100, 0, whole) == whole
        writers.append(os.open(path, os.O_WRONLY | os.O_APPEND))  # a writer after the commit
        os.write(writers[0], b"line 3\n")
        assert _read_until(reader, 100, 14, b"line 3\n") == b"line 3\n"
        os.close(writers.pop())
        assert _read_until(reader, 100, 7, b"line 2\nline 3\n") == b"line 2\nline 3\n"
    finally:
        for fd in writers:
            os.close(fd)
        os.close(reader)
