"""``tiercache-async``: a compatibility name for ``TierCacheFileSystem``, which is async itself."""

# ``TierCacheFileSystem`` has both faces (``fsspec.filesystem("tiercache", asynchronous=True)``
# serves zarr and xarray). This protocol name stays for code written against it; a hyphen in a
# protocol name is refused by xarray's URL check, so new code should use ``tiercache``.

from __future__ import annotations

from typing import Any

from tiercache.async_face import ASYNC_THREADS, AsyncCachedFile
from tiercache.filesystem import TierCacheFileSystem

__all__ = ["AsyncCachedFile", "AsyncTierCacheFileSystem"]


class AsyncTierCacheFileSystem(TierCacheFileSystem):
    """The ``tiercache-async`` protocol: ``TierCacheFileSystem`` under its former name.

    ``threads`` is the former name of ``async_threads``; ``sync_fs`` is the filesystem itself.
    """

    protocol = ("tiercache-async",)

    def __init__(self, *args: Any, threads: int = ASYNC_THREADS, **options: Any) -> None:
        options.setdefault("async_threads", threads)
        super().__init__(*args, **options)

    @property
    def sync_fs(self) -> TierCacheFileSystem:
        """This filesystem: its blocking methods are the synchronous face."""
        return self
