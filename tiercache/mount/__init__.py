"""The FUSE mount of a bucket prefix: operations, open-file handles and mount process control.

``tiercache mount s3://bucket/prefix /mnt/data`` serves the prefix as a directory tree through
a ``TierCacheFileSystem``: reads come from the local tier (and the kernel page cache where the
consistency mode allows), writes go through write-behind. The FUSE binding (``mfusepy``) is
imported only by ``runner``, so everything else here works without the ``mount`` extra.
"""

from __future__ import annotations

from tiercache.mount.control import (
    MountError,
    MountInfo,
    active_mounts,
    check_mountpoint,
    parse_url,
    unmount,
)
from tiercache.mount.library import FuseSupport, fuse_support

__all__ = [
    "FuseSupport",
    "MountError",
    "MountInfo",
    "active_mounts",
    "check_mountpoint",
    "fuse_support",
    "parse_url",
    "unmount",
]
