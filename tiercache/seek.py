"""Seek arithmetic shared by the read-only file objects (``CachedFile``, ``DirectFile``)."""

from __future__ import annotations

import io


def seek_target(position: int, size: int, offset: int, whence: int) -> int:
    """The absolute position ``seek(offset, whence)`` moves to; ValueError if it is invalid."""
    bases = {io.SEEK_SET: 0, io.SEEK_CUR: position, io.SEEK_END: size}
    if whence not in bases:
        raise ValueError(f"invalid whence {whence}")
    target = bases[whence] + offset
    if target < 0:
        raise ValueError(f"negative seek position {target}")
    return target
