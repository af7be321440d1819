"""``AsyncTierCacheFileSystem``: fsspec's async API over the same tiers, prefetcher and flights."""

# Async users (zarr v3, xarray through fsspec's async API) call ``_cat_file``, ``_info``,
# ``_ls`` and ``open_async`` directly; fsspec's own cache wrappers are bypassed there (fsspec
# issue 1709), so these methods must be the cache themselves. Each runs the synchronous
# filesystem's method in a bounded thread pool: the read path is synchronous by design (boto3,
# fork-safe DataLoader workers), and both faces share one runtime (the same tier, single-flight
# table, prefetch engine and counters), so an async read of an object a sync reader or the
# prefetcher is fetching joins that fetch.

from __future__ import annotations

import asyncio
import functools
import io
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from fsspec.asyn import AsyncFileSystem

from tiercache.filesystem import TierCacheFileSystem
from tiercache.prefetch import PrefetchHandle

T = TypeVar("T")

_PREFIXES = ("tiercache-async::", "tiercache-async://")


class AsyncTierCacheFileSystem(AsyncFileSystem):  # type: ignore[misc]
    """The ``tiercache-async`` protocol: the same options as ``TierCacheFileSystem``.

    Make it with ``asynchronous=True`` inside a running loop (what zarr and xarray do), or
    use it synchronously like any fsspec async filesystem. ``sync_fs`` is the synchronous
    filesystem it shares its runtime with.
    """

    protocol = ("tiercache-async",)
    root_marker = ""
    async_impl = True

    def __init__(
        self,
        *args: Any,
        asynchronous: bool = False,
        loop: Any = None,
        batch_size: int | None = None,
        threads: int = 8,
        **options: Any,
    ) -> None:
        super().__init__(asynchronous=asynchronous, loop=loop, batch_size=batch_size)
        self.sync_fs = TierCacheFileSystem(*args, **options)
        self._threads = threads
        self._pool_lock = threading.Lock()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None

    def __repr__(self) -> str:
        return f"Async{self.sync_fs!r}"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str):
            for prefix in _PREFIXES:
                path = path.removeprefix(prefix)
        return TierCacheFileSystem._strip_protocol(path)

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        return {}

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking work in this filesystem's pool (rebuilt in a forked child)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), functools.partial(fn, *args, **kwargs))

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None or self._pool[0] != os.getpid():
                pool = ThreadPoolExecutor(self._threads, thread_name_prefix="tiercache-async")
                self._pool = (os.getpid(), pool)
            return self._pool[1]

    # -- metadata ----------------------------------------------------------------------------

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return await self._call(self.sync_fs.info, self._strip_protocol(path))

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        return await self._call(self.sync_fs.ls, self._strip_protocol(path), detail=detail)

    async def _find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        return await self._call(
            self.sync_fs.find,
            self._strip_protocol(path),
            maxdepth=maxdepth,
            withdirs=withdirs,
            detail=detail,
        )

    # -- data --------------------------------------------------------------------------------

    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        return bytes(
            await self._call(
                self.sync_fs.cat_file, self._strip_protocol(path), start=start, end=end
            )
        )

    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> None:
        await self._call(self.sync_fs.pipe_file, self._strip_protocol(path), value, mode=mode)

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        await self._call(self.sync_fs.rm_file, self._strip_protocol(path))

    async def _get_file(self, rpath: str, lpath: str, **kwargs: Any) -> None:
        await self._call(self.sync_fs.get_file, self._strip_protocol(rpath), lpath)

    async def _put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        await self._call(self.sync_fs.put_file, lpath, self._strip_protocol(rpath))

    async def open_async(self, path: str, mode: str = "rb", **kwargs: Any) -> AsyncCachedFile:
        """An async file over the cache (``await f.read()``); only ``rb``."""
        if mode != "rb":
            raise ValueError(f"open_async supports mode 'rb' only, got {mode!r}")
        raw = await self._call(self.sync_fs.open, self._strip_protocol(path), "rb")
        return AsyncCachedFile(self, raw)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return self.sync_fs.open(self._strip_protocol(path), mode, **kwargs)

    # -- prefetch ----------------------------------------------------------------------------

    async def prefetch_async(
        self,
        paths: str | Sequence[str],
        priority: int = 0,
        tier: str = "local",
        pin: bool = True,
    ) -> PrefetchHandle:
        """``TierCacheFileSystem.prefetch``, listing in the pool; await ``wait_async`` on it."""
        return await self._call(self.sync_fs.prefetch, paths, priority=priority, tier=tier, pin=pin)

    async def wait_async(self, handle: PrefetchHandle, timeout: float | None = None) -> bool:
        """Wait for a prefetch without blocking the loop; False if ``timeout`` passed first."""
        return await self._call(handle.wait, timeout)

    def stats(self) -> dict[str, Any]:
        return self.sync_fs.stats()


class AsyncCachedFile:
    """A read-only async file: each read runs in the filesystem's pool."""

    def __init__(self, fs: AsyncTierCacheFileSystem, raw: io.IOBase) -> None:
        self._fs = fs
        self._raw = raw
        self.size: int = getattr(raw, "size", -1)

    async def read(self, size: int = -1) -> bytes:
        data: bytes = await self._fs._call(self._raw.read, size)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    async def close(self) -> None:
        await self._fs._call(self._raw.close)

    async def __aenter__(self) -> AsyncCachedFile:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
