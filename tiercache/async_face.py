"""The asyncio face of ``TierCacheFileSystem``: coroutine twins of its blocking methods."""

# fsspec's async API bypasses fsspec's own cache wrappers (fsspec issue 1709), so these
# coroutines are the cache themselves. Each runs the blocking method in the filesystem's pool:
# the read path is synchronous by design (boto3, fork-safe DataLoader workers), and both faces
# share one runtime, so an async read joins a fetch a sync reader or the prefetcher started.

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

from tiercache.errors import ConfigError
from tiercache.prefetch import PrefetchHandle

T = TypeVar("T")

ASYNC_THREADS = 8  # default size of the pool that runs the coroutine methods' blocking work


class AsyncFace(AsyncFileSystem):  # type: ignore[misc]
    """Coroutine methods (``_cat_file``, ``_info``, ``open_async`` …) over blocking ones."""

    def _start_pool(self, async_threads: int) -> None:
        if (
            isinstance(async_threads, bool)
            or not isinstance(async_threads, int)
            or async_threads < 1
        ):
            raise ConfigError(f"async_threads must be an integer >= 1, got {async_threads!r}")
        self._async_threads = async_threads
        self._pool_lock = threading.Lock()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking work in this filesystem's pool, off the running event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), functools.partial(fn, *args, **kwargs))

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None or self._pool[0] != os.getpid():  # rebuilt in a forked child
                pool = ThreadPoolExecutor(self._async_threads, thread_name_prefix="tiercache-async")
                self._pool = (os.getpid(), pool)
            return self._pool[1]

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return await self._run(self.info, path)

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        return await self._run(self.ls, path, detail=detail)

    async def _find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        return await self._run(self.find, path, maxdepth=maxdepth, withdirs=withdirs, detail=detail)

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        return await self._run(self.exists, path)

    async def _cat(
        self, path: Any, recursive: bool = False, on_error: str = "raise", **kwargs: Any
    ) -> Any:
        # One read-ahead order (``cat``) fetches a list concurrently, sized by the link, where
        # fsspec's would run one ``_cat_file`` per object in this pool's few threads.
        return await self._run(self.cat, path, recursive=recursive, on_error=on_error, **kwargs)

    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        return bytes(await self._run(self.cat_file, path, start=start, end=end))

    async def _pipe_file(
        self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        await self._run(self.pipe_file, path, value, mode=mode)

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        await self._run(self.rm_file, path)

    async def _rm(
        self,
        path: Any,
        recursive: bool = False,
        batch_size: int | None = None,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        # The blocking rm: one DeleteObjects per 1000 keys, not one request per key.
        await self._run(self.rm, path, recursive=recursive, maxdepth=maxdepth)

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        await self._run(self.cp_file, path1, path2)

    async def _get_file(self, rpath: str, lpath: str, **kwargs: Any) -> None:
        await self._run(self.get_file, rpath, lpath, **kwargs)

    async def _put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        await self._run(self.put_file, lpath, rpath, **kwargs)

    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        await self._run(self.mkdir, path, create_parents=create_parents)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        await self._run(self.makedirs, path, exist_ok=exist_ok)

    async def open_async(self, path: str, mode: str = "rb", **kwargs: Any) -> AsyncCachedFile:
        """An async file over the cache (``await f.read()``); only ``rb``."""
        if mode != "rb":
            raise ValueError(f"open_async supports mode 'rb' only, got {mode!r}")
        raw = await self._run(self.open, path, "rb")
        return AsyncCachedFile(self, raw)

    async def prefetch_async(
        self,
        paths: str | Sequence[str],
        priority: int = 0,
        tier: str = "local",
        pin: bool = True,
    ) -> PrefetchHandle:
        """``prefetch``, listing in the pool; await ``wait_async`` on the handle."""
        return await self._run(self.prefetch, paths, priority=priority, tier=tier, pin=pin)

    async def wait_async(self, handle: PrefetchHandle, timeout: float | None = None) -> bool:
        """Wait for a prefetch without blocking the loop; False if ``timeout`` passed first."""
        return await self._run(handle.wait, timeout)


class AsyncCachedFile:
    """A read-only async file: each read runs in the filesystem's pool."""

    def __init__(self, fs: AsyncFace, raw: io.IOBase) -> None:
        self._fs = fs
        self._raw = raw
        self.size: int = getattr(raw, "size", -1)

    async def read(self, size: int = -1) -> bytes:
        data: bytes = await self._fs._run(self._raw.read, size)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    async def close(self) -> None:
        await self._fs._run(self._raw.close)

    async def __aenter__(self) -> AsyncCachedFile:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
