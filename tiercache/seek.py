"""Seek arithmetic and the base shared by the read-only file objects over cached objects."""

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


class SeekableReader(io.RawIOBase):
    """A read-only binary file of a known ``size`` with a position: readable, seek, tell."""

    size: int
    _pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        self._pos = seek_target(self._pos, self.size, offset, whence)
        return self._pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos
