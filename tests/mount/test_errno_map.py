"""Every tiercache error maps to the errno an application expects from a filesystem."""

from __future__ import annotations

import errno

import pytest

from tiercache.errors import (
    AccessDeniedError,
    CacheCorruptError,
    CacheTimeoutError,
    ConfigError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreUnavailableError,
    TierFullError,
)
from tiercache.mount.errno_map import errno_for


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ObjectNotFoundError("s3://b/k"), errno.ENOENT),
        (AccessDeniedError("s3://b/k"), errno.EACCES),
        (TierFullError(errno.ENOSPC, "full"), errno.ENOSPC),
        (StoreUnavailableError("down"), errno.EIO),
        (ObjectChangedError("changed"), errno.EIO),
        (CacheCorruptError("bad digest"), errno.EIO),
        (CacheTimeoutError("waited"), errno.EIO),
        (ConfigError("bad"), errno.EINVAL),
        (IsADirectoryError(errno.EISDIR, "dir"), errno.EISDIR),
        (NotADirectoryError(errno.ENOTDIR, "file"), errno.ENOTDIR),
        (OSError(errno.EDQUOT, "quota"), errno.EDQUOT),
        (RuntimeError("unexpected"), errno.EIO),
    ],
)
def test_errno_for(exc: BaseException, expected: int) -> None:
    assert errno_for(exc) == expected
