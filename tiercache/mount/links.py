"""Symbolic links of a read-write mount: how one is stored as an object, as s3fs-fuse does.

A link is an object whose bytes are its target (``ln -s ../lib lib64`` stores ``../lib``) and
whose ``x-amz-meta-mode`` is the decimal ``st_mode`` of a link, ``41471`` (``S_IFLNK | 0777``),
beside the ``x-amz-meta-mtime`` any file of the mount may carry (``kept``). It is written by
one PutObject that carries both, so no client ever sees the object without its type. A
read-write mount reads the mode of every file it stats (a HEAD), so ``lstat`` and ``readlink``
answer alike on every mount of the bucket, after a remount too; s3fs-fuse reads and writes
links the same way. Other S3 clients (boto3, ``aws s3 cp``, rclone without ``--links``) see a
small file holding the target. A ``--read-only`` mount reads no metadata, so it shows a link
as such a file.
"""

from __future__ import annotations

import errno
import os
import stat

LINK_MODE = stat.S_IFLNK | 0o777
# The longest target the kernel passes (PATH_MAX less its NUL); an object that says it is a
# link but holds more is shown as the file it is.
MAX_TARGET = 4095
_ENCODING, _ERRORS = "utf-8", "surrogateescape"  # as the binding decodes paths


def target_bytes(target: str) -> bytes:
    """The bytes stored for a link to ``target`` (an ``OSError`` with the errno of
    ``symlink(2)`` for one that cannot be a target)."""
    data = target.encode(_ENCODING, _ERRORS)
    if not data:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
    if len(data) > MAX_TARGET:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
    return data


def target_text(data: bytes) -> str:
    """The target a stored link holds, as the binding hands it to the kernel."""
    return data.decode(_ENCODING, _ERRORS)
