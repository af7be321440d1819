"""Parallel ranged GET of one object into a sink, resuming a part where its stream broke."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Protocol

from tiercache.errors import StoreUnavailableError
from tiercache.store.base import ObjectInfo, ObjectStore, ObjectStream
from tiercache.store.retry import RetryableError, RetryPolicy

CHUNK = 1024 * 1024


class RangeSink(Protocol):
    """Where downloaded bytes go; ``write`` calls may come from several threads at once."""

    def begin(self, info: ObjectInfo) -> None:
        """The object's size and ETag are known; called once, before any ``write``."""
        ...

    def next_read(self, offset: int) -> int:
        """How many bytes from ``offset`` to read as one new ``bytes`` object (0: any amount).

        A sink that hands chunks to a reader as they arrive asks for chunks the reader's size.
        """
        ...

    def write(self, offset: int, data: memoryview | bytes) -> None:
        """Store ``data`` at ``offset``; a memoryview's buffer is reused once this returns."""
        ...


class _Parts:
    """Hands out byte ranges in ascending order, so that a progressive reader is fed first."""

    def __init__(self, start: int, size: int, part_size: int) -> None:
        self._ranges: Iterator[tuple[int, int]] = (
            (off, min(off + part_size, size)) for off in range(start, size, part_size)
        )
        self._lock = threading.Lock()
        self.failed: BaseException | None = None

    def next(self) -> tuple[int, int] | None:
        with self._lock:
            if self.failed is not None:
                return None
            return next(self._ranges, None)

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.failed is None:
                self.failed = exc


def download(
    store: ObjectStore,
    bucket: str,
    key: str,
    sink: RangeSink,
    *,
    part_size: int,
    concurrency: int,
    retry: RetryPolicy,
    if_match: str | None = None,
) -> ObjectInfo:
    """Fetch the whole object into ``sink`` with up to ``concurrency`` ranged GETs at once.

    The first GET reveals size and ETag; every later part is pinned to that ETag with
    ``If-Match`` so that an object replaced mid-fetch fails instead of mixing versions.
    """
    # With a single stream there is nothing to split: one GET for the whole object.
    first = store.open_range(
        bucket, key, 0, part_size if concurrency > 1 else None, if_match=if_match
    )
    info = first.info
    try:
        sink.begin(info)
    except BaseException:
        first.close()
        raise
    parts = _Parts(first.end, info.size, part_size)
    workers = [
        threading.Thread(
            target=_worker,
            args=(store, info, sink, parts, retry, None),
            name=f"tiercache-get-{i}",
            daemon=True,
        )
        for i in range(min(concurrency - 1, _count_parts(first.end, info.size, part_size)))
    ]
    for thread in workers:
        thread.start()
    _worker(store, info, sink, parts, retry, first)
    for thread in workers:
        thread.join()
    if parts.failed is not None:
        raise parts.failed
    return info


def _count_parts(start: int, size: int, part_size: int) -> int:
    return max(0, -(-(size - start) // part_size))


def _worker(
    store: ObjectStore,
    info: ObjectInfo,
    sink: RangeSink,
    parts: _Parts,
    retry: RetryPolicy,
    opened: ObjectStream | None,
) -> None:
    try:
        if opened is not None:
            copy_range(store, info, sink, opened.start, opened.end, retry, opened)
        while (part := parts.next()) is not None:
            copy_range(store, info, sink, part[0], part[1], retry, None)
    except BaseException as exc:
        parts.fail(exc)


def copy_range(
    store: ObjectStore,
    info: ObjectInfo,
    sink: RangeSink,
    start: int,
    end: int,
    retry: RetryPolicy,
    stream: ObjectStream | None,
) -> None:
    """Copy ``[start, end)`` into the sink, reopening from the last byte on a broken stream."""
    pos = start
    failures = 0
    buffer = memoryview(bytearray(CHUNK))  # reused: fresh memory per chunk costs more than I/O
    try:
        while pos < end:
            try:
                if stream is None:
                    stream = store.open_range(info.bucket, info.key, pos, end, if_match=info.etag)
                count = _copy_chunk(stream, sink, pos, end, buffer)
                if not count:
                    raise RetryableError(f"body ended at byte {pos} of {end}")
                pos += count
            except RetryableError as exc:
                failures += 1
                if stream is not None:
                    stream.close()
                    stream = None
                if failures >= retry.attempts:
                    raise StoreUnavailableError(
                        f"GetObject s3://{info.bucket}/{info.key} bytes {pos}-{end} at "
                        f"{store.namespace.partition(':')[2]}: "
                        f"failed after {failures} attempts: {exc}"
                    ) from exc
                time.sleep(retry.delay(failures))
    finally:
        if stream is not None:
            stream.close()


def _copy_chunk(
    stream: ObjectStream, sink: RangeSink, pos: int, end: int, buffer: memoryview
) -> int:
    """Move the next chunk from ``stream`` into ``sink``; return its size (0 at the end)."""
    wanted = sink.next_read(pos)
    if wanted:
        data = stream.read(min(wanted, end - pos))
        if data:
            sink.write(pos, data)
        return len(data)
    count = stream.readinto(buffer[: min(CHUNK, end - pos)])
    if count:
        sink.write(pos, buffer[:count])
    return count
