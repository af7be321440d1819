"""The sizes of the page-cache folios that hold files: what a warm read copies out of."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from collections import Counter
from collections.abc import Iterable
from typing import Any, BinaryIO

PAGE = mmap.PAGESIZE
_PRESENT = 1 << 63
_PFN_MASK = (1 << 55) - 1
# /proc/kpageflags: a page that continues a folio (Documentation/admin-guide/mm/pagemap.rst);
# any other page (a folio's head, or a page alone) starts one.
_COMPOUND_TAIL = 1 << 16


def folio_sizes_kib(paths: Iterable[str | os.PathLike[str]]) -> dict[str, Any] | None:
    """How many cached folios of each size (KiB) hold the files' bytes (``folios``), and how
    many of their pages are not cached (``pages_absent``); None where the kernel does not say
    (not root).

    Each file is mapped privately and read-only in use: its pages fault in from the page cache
    (minor faults for cached pages; a page not cached is read in, so call this on warm files),
    and ``/proc/self/pagemap`` and ``/proc/kpageflags`` give each page's frame and whether it
    heads or continues a folio.
    """
    folios: Counter[int] = Counter()
    absent = 0
    try:
        with open("/proc/self/pagemap", "rb") as pagemap, open("/proc/kpageflags", "rb") as flags:
            for path in paths:
                absent += _count_file(str(path), pagemap, flags, folios)
    except PermissionError:
        return None
    return {"folios": dict(sorted(folios.items())), "pages_absent": absent}


def _count_file(path: str, pagemap: BinaryIO, flags: BinaryIO, folios: Counter[int]) -> int:
    """Count the file's folios into ``folios``; returns how many of its pages are not cached."""
    absent = 0
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < PAGE:
            return 0
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        anchor = ctypes.c_char.from_buffer(mapping)
        address = ctypes.addressof(anchor)
        pages = size // PAGE
        touched = 0
        for page in range(pages):  # fault each page in (nothing is written: no copy is made)
            touched += mapping[page * PAGE]
        pagemap.seek(address // PAGE * 8)
        entries = struct.unpack(f"{pages}Q", pagemap.read(8 * pages))
        run = 0  # pages of the folio being counted
        for entry in entries:
            if not entry & _PRESENT:
                absent += 1
                continue
            flags.seek((entry & _PFN_MASK) * 8)
            (bits,) = struct.unpack("Q", flags.read(8))
            if bits & _COMPOUND_TAIL and run:
                run += 1
                continue
            if run:
                folios[run * PAGE // 1024] += 1
            run = 1
        if run:
            folios[run * PAGE // 1024] += 1
        del anchor
    finally:
        mapping.close()
    return absent
