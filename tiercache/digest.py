"""xxh3 digests of whole files: the integrity check of cache entries and uploads."""

from __future__ import annotations

import os
from concurrent.futures import Future

import xxhash

from tiercache import forksafe

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


# A write at least this large is hashed on a helper thread while its bytes go to the file: the
# two run on two cores instead of one after the other (xxh3 releases the GIL). Smaller writes
# are hashed in place, where handing them over would cost more than the hashing.
HASH_BESIDE_AT = 1 << 20


_hash_threads = forksafe.LazyPool(2, "tiercache-hash")  # hashes writers' buffers


def hash_beside(hasher: xxhash.xxh3_64, data: memoryview) -> Future[None] | None:
    """Start hashing ``data`` into ``hasher`` on a helper thread (None: too small, hash it in
    place). The caller must wait for the result before it returns ``data`` to its owner or
    hashes anything else into ``hasher``, so the digest covers the buffer as it was passed."""
    if len(data) < HASH_BESIDE_AT:
        return None
    return _hash_threads.submit(hasher.update, data)
