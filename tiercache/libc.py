"""Linux C library calls Python's ``os`` module lacks, through ctypes; None where missing."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any


def libc_function(name: str, argtypes: list[Any], restype: Any = ctypes.c_int) -> Any:
    """The C library's ``name`` (errno kept, for ``ctypes.get_errno``), typed; None on other
    systems or where this C library has no such function."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function
