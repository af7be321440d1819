"""xxh3 digests of whole files: the integrity check of cache entries and uploads."""

from __future__ import annotations

import os

import xxhash

# Read into one reused buffer that stays in the CPU cache: a fresh 8 MiB ``bytes`` per read
# cost more (allocation and a pass through memory) than the hashing itself.
_CHUNK = 1 << 20


def xxh3_file(path: str) -> tuple[int, str]:
    """Size and xxh3-64 hex digest of a file (never following a symlink)."""
    hasher = xxhash.xxh3_64()
    buffer = memoryview(bytearray(_CHUNK))
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while got := os.readv(fd, [buffer]):
            hasher.update(buffer[:got])
            size += got
    finally:
        os.close(fd)
    return size, hasher.hexdigest()
