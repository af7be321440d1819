"""Which errno a FUSE operation answers for an exception tiercache raised."""

from __future__ import annotations

import errno
import logging

from tiercache.errors import CacheCorruptError, StoreError, TierFullError

log = logging.getLogger("tiercache.mount")

_BY_TYPE: tuple[tuple[type[BaseException], int], ...] = (
    # Order matters: tiercache's errors also derive from broad built-ins (StoreError is an
    # OSError whose errno is unset), so the specific ones come first.
    (TierFullError, errno.ENOSPC),
    (CacheCorruptError, errno.EIO),
    (StoreError, errno.EIO),
    (FileNotFoundError, errno.ENOENT),
    (PermissionError, errno.EACCES),
    (IsADirectoryError, errno.EISDIR),
    (NotADirectoryError, errno.ENOTDIR),
    (FileExistsError, errno.EEXIST),
    (TimeoutError, errno.EIO),
    (ConnectionError, errno.EIO),
    (ValueError, errno.EINVAL),
)


def errno_for(exc: BaseException) -> int:
    """The errno an application should see for ``exc`` (EIO when nothing fits better)."""
    for kind, number in _BY_TYPE:
        if isinstance(exc, kind):
            return number
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        return exc.errno
    return errno.EIO
