"""Parallel ranged GET of one object into a sink, resuming a part where its stream broke."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Protocol

from tiercache.buffers import thread_buffer
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

    def awaited_end(self, start: int, end: int) -> int:
        """Where to write ``[start, end)`` up to at once, rather than wait for more bytes: the
        furthest end of a range a reader waits for that those bytes end (``start``: none)."""
        ...

    def holding(self, held: HeldBytes, holds: bool) -> None:
        """A stream holds bytes for this sink in ``held`` (``holds``), or no longer does: a
        reader that starts to wait for some of them writes them itself (``write_for``)."""
        ...


class StreamGovernor:
    """How many ranged GETs a fetch runs at once, learned from what the link gives.

    A remote store gives one connection a small share of the link, so a fetch adds streams
    while its throughput grows with each one (up to ``maximum``); a store that serves one
    stream fast (at least ``FAST`` bytes/s: a loopback or same-rack server, where every
    extra stream only costs CPU) is read with one GET per object. What a fetch learned is
    where the next one starts, so only the first fetches of a process probe. A probe doubles
    its streams at each decision (as TCP's slow start doubles its window) and looks at a few
    round trips of the store: an object of a few parts is over after a quarter of a second.
    """

    FAST = 256 * 1024 * 1024  # bytes/s of one stream that the link does not hold back
    GAIN = 1.15  # streams are worth adding while the last ones raised throughput this much
    WINDOW = 0.25  # at most this many seconds of transfer each decision looks at
    MIN_WINDOW = 0.1  # at least this many (a rate over less is mostly noise)
    ROUND_TRIPS = 4  # a decision looks at this many times the first GET's wait for its reply

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self._lock = threading.Lock()
        self._streams = 0  # 0: nothing learned yet (probe from one stream)

    def start(self) -> int:
        """Streams a new fetch starts with (0: probe)."""
        with self._lock:
            return min(self._streams, self.maximum)

    def window(self, reply_seconds: float) -> float:
        """Seconds of transfer a decision looks at, for a store that took ``reply_seconds`` to
        answer the first GET: a stream just added needs a round trip before it counts."""
        return min(self.WINDOW, max(self.MIN_WINDOW, self.ROUND_TRIPS * reply_seconds))

    def learned(self, streams: int) -> None:
        with self._lock:
            self._streams = streams

    def ran_out_of_parts(self, streams: int) -> None:
        """A fetch had no part left for another stream before the link showed its limit
        (an object of few parts): the next fetch may try one stream more."""
        with self._lock:
            self._streams = min(self.maximum, max(self._streams, streams + 1))


class _Parts:
    """Hands out byte ranges in ascending order, so that a progressive reader is fed first.

    Once ``whole_rest`` is set (one stream is all the link needs), the next range is all
    that is left: one GET instead of one per part.
    """

    def __init__(self, start: int, size: int, part_size: int) -> None:
        self._next = start
        self._size = size
        self._part_size = part_size
        self._lock = threading.Lock()
        self.whole_rest = False
        self.failed: BaseException | None = None

    def next(self) -> tuple[int, int] | None:
        with self._lock:
            if self.failed is not None or self._next >= self._size:
                return None
            start = self._next
            step = self._size - start if self.whole_rest else self._part_size
            self._next = min(start + step, self._size)
            return start, self._next

    def left(self) -> int:
        with self._lock:
            return (
                0 if self.failed is not None else -(-(self._size - self._next) // self._part_size)
            )

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
    governor: StreamGovernor | None = None,
    hesitate: Callable[[ObjectInfo], None] | None = None,
    hesitate_above: int = 0,
) -> ObjectInfo:
    """Fetch the whole object into ``sink`` with up to ``concurrency`` ranged GETs at once
    (with a ``governor``: as many as the link pays for, learned while it runs).

    The first GET reveals size and ETag; every later part is pinned to that ETag with
    ``If-Match`` so that an object replaced mid-fetch fails instead of mixing versions.
    With ``hesitate``, the first GET is one part; for an object of at least ``hesitate_above``
    bytes, ``hesitate`` is called before any other GET: it returns to go on, or raises to
    stop once the first part is in the sink. With more than one stream it is called as soon
    as that GET answers, while the part streams in (the others start beside it); with one,
    once the part is in.
    """
    streams = concurrency if governor is None else governor.start()
    # A single stream, known to be enough: nothing to split, one GET for the whole object.
    split = (concurrency > 1 and streams != 1) or hesitate is not None
    asked = time.monotonic()
    first: ObjectStream | None = store.open_range(
        bucket, key, 0, part_size if split else None, if_match=if_match
    )
    assert first is not None
    reply_seconds = time.monotonic() - asked
    info = first.info
    try:
        sink.begin(info)
    except BaseException:
        first.close()
        raise
    parts = _Parts(first.end, info.size, part_size)
    one_stream = concurrency == 1 or streams == 1
    parts.whole_rest = one_stream  # the rest in one GET
    # Chunks the reader's size are handed to it whole only from a store that one stream serves
    # fast (there the CPU is what a read waits for, and the copy back from the file is saved).
    # Over a link that holds each stream back, bytes go to the sink as they arrive: a chunk
    # read whole would be written, and the reader woken, only once its last byte is in.
    counted = _CountingSink(sink, handoff=one_stream)
    head: threading.Thread | None = None
    if hesitate is not None and info.size >= hesitate_above and first.end < info.size:
        if one_stream:  # the first part, then the decision, then the rest
            copy_range(store, info, counted, first.start, first.end, retry, first, counted.meter)
            hesitate(info)
        else:
            # The first part arrives on its own stream while the reader decides: one that
            # reads the object through has the other streams start at once, beside it.
            head = threading.Thread(
                target=_worker,
                args=(store, info, counted, _Parts(first.end, first.end, part_size), retry, first),
                kwargs={"failed": parts},
                name="tiercache-get-first",
                daemon=True,
            )
            head.start()
            try:
                hesitate(info)
            except BaseException:
                head.join()  # the first part is in the sink before the caller turns to blocks
                raise
        first = None
    workers: list[threading.Thread] = []

    def add_stream() -> None:
        thread = threading.Thread(
            target=_worker,
            args=(store, info, counted, parts, retry, None),
            name=f"tiercache-get-{len(workers) + 1}",
            daemon=True,
        )
        workers.append(thread)
        thread.start()

    for _ in range(min(max(streams, 1), concurrency) - (1 if head is None else 2)):
        if parts.left() > len(workers):
            add_stream()
    control = None
    done = threading.Event()  # ends the governor's wait at once: it never delays the fetch
    # An object that fit in its first part has nothing left to govern: no thread for it.
    if governor is not None and concurrency > 1 and streams != 1 and parts.left() > 0:

        def running() -> int:  # this thread's stream, the first part's and the workers'
            beside = head is not None and head.is_alive()
            return 1 + int(beside) + sum(t.is_alive() for t in workers)

        control = threading.Thread(
            target=_govern,
            args=(governor, counted, parts, running, add_stream, done),
            kwargs={
                "window": governor.window(reply_seconds),
                "settle": reply_seconds,
                "probe": streams == 0,
            },
            daemon=True,
        )
        control.start()
    _worker(store, info, counted, parts, retry, first)
    for thread in workers:
        thread.join()
    if head is not None:
        head.join()
    done.set()
    if control is not None:
        control.join()
    if parts.failed is not None:
        raise parts.failed
    if governor is not None and streams <= 1:
        link = counted.meter.rate_since((0, 0.0))
        alone = not workers
        if streams == 0 and alone and link >= StreamGovernor.FAST:
            governor.learned(1)  # done before the first decision, on one fast stream
        elif streams == 1 and link < StreamGovernor.FAST and info.size >= 2 * part_size:
            governor.learned(0)  # the link holds one stream back now: probe again next time
    return info


class _LinkMeter:
    """What the link gives one stream: bytes over the seconds spent reading them from the store
    (the sink's own work excluded, so a client busy writing is not taken for a slow link)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.seconds = 0.0

    def received(self, count: int, seconds: float) -> None:
        self.bytes += count  # estimates: increments from threads may race, rarely
        self.seconds += seconds

    def mark(self) -> tuple[int, float]:
        return self.bytes, self.seconds

    def rate_since(self, mark: tuple[int, float]) -> float:
        """Bytes/s one stream got from the link since ``mark`` (0 while nothing arrived)."""
        seconds = self.seconds - mark[1]
        return (self.bytes - mark[0]) / seconds if seconds > 0 else 0.0


class _CountingSink:
    """A sink that meters how fast the streams that write into it receive their bytes (for the
    stream governor); without ``handoff`` it asks for no read size of its own (bytes go on as
    they arrive)."""

    def __init__(self, sink: RangeSink, *, handoff: bool = True) -> None:
        self._sink = sink
        self._handoff = handoff
        self.meter = _LinkMeter()

    def begin(self, info: ObjectInfo) -> None:
        self._sink.begin(info)

    def next_read(self, offset: int) -> int:
        return self._sink.next_read(offset) if self._handoff else 0

    def write(self, offset: int, data: memoryview | bytes) -> None:
        self._sink.write(offset, data)

    def awaited_end(self, start: int, end: int) -> int:
        return self._sink.awaited_end(start, end)

    def holding(self, held: HeldBytes, holds: bool) -> None:
        self._sink.holding(held, holds)


def _govern(
    governor: StreamGovernor,
    counted: _CountingSink,
    parts: _Parts,
    running: Callable[[], int],
    add_stream: Callable[[], None],
    done: threading.Event,
    *,
    window: float,
    settle: float,
    probe: bool,
) -> None:
    """Add streams while the last ones raised throughput; settle on what the link gives.

    A probe (nothing learned yet) doubles the streams at each decision while they are slow,
    a fetch that starts from what was learned adds one at a time. Streams just added are
    given ``settle`` seconds (the store's reply time) before the next window opens, so that
    it sees them all running.
    """
    before = None  # throughput before the last streams were added
    added = 0  # streams added at the last decision
    tried = 0  # streams running since the last ones were added
    while parts.left() > 0:
        streams = running()
        # Bytes as they arrive (the sink is written in larger pieces, which would step the rate).
        link_mark = counted.meter.mark()
        if done.wait(window):
            return
        rate = (counted.meter.bytes - link_mark[0]) / window
        link = counted.meter.rate_since(link_mark)  # what one stream got from the link
        if streams <= 2 and link * streams >= StreamGovernor.FAST:
            # One stream (or the first part's and one more) already moves what the link does
            # not hold back: a fast store, read with one GET per object.
            parts.whole_rest = True
            governor.learned(1)
            return
        if before is not None and rate < before * StreamGovernor.GAIN:
            governor.learned(max(1, streams - added))  # the last streams did not pay
            return
        if streams >= governor.maximum:
            governor.learned(streams)
            return
        if parts.left() == 0:
            break
        before = rate
        # A probe whose streams are far below a fast store's rate doubles them; one near it
        # adds a stream, as a fetch that starts from what was learned does, and looks again.
        wanted = streams if probe and link < StreamGovernor.FAST / 2 else 1
        added = min(wanted, governor.maximum - streams, parts.left())
        for _ in range(added):
            add_stream()
        tried = streams + added
        if done.wait(settle):
            return
    if tried:  # every stream added paid, and then no part was left for another
        governor.ran_out_of_parts(tried)


def _worker(
    store: ObjectStore,
    info: ObjectInfo,
    sink: _CountingSink,
    parts: _Parts,
    retry: RetryPolicy,
    opened: ObjectStream | None,
    failed: _Parts | None = None,
) -> None:
    """Copy ``opened`` to its end, then parts until none is left; an error fails ``failed``
    (default: ``parts``), which stops every stream that takes parts from it."""
    try:
        if opened is not None:
            copy_range(store, info, sink, opened.start, opened.end, retry, opened, sink.meter)
        while (part := parts.next()) is not None:
            copy_range(store, info, sink, part[0], part[1], retry, None, sink.meter)
    except BaseException as exc:
        (failed or parts).fail(exc)


class RangedGet:
    """Bytes ``[start, end)`` of one object version, read through a ranged GET that is
    reopened from the last byte it gave whenever its stream breaks (with the retry policy's
    backoff, within its attempts). The one ranged-GET-with-retry loop: fetches, a reader of
    an object the tier has no room for (``DirectFile``) and the mount's cold reads use it."""

    def __init__(
        self,
        store: ObjectStore,
        bucket: str,
        key: str,
        etag: str | None,
        start: int,
        end: int,
        retry: RetryPolicy,
        stream: ObjectStream | None = None,
    ) -> None:
        self.pos, self.end = start, end
        self._store, self._bucket, self._key, self._etag = store, bucket, key, etag
        self._retry = retry
        self._stream = stream  # a GET of this range already open (a fetch's first response)
        self._failures = 0

    def readinto(self, view: memoryview) -> int:
        """Fill ``view`` with up to its length of the next bytes; 0 at ``end``."""
        return self._next(lambda stream: stream.readinto(view[: self.end - self.pos]))

    def read(self, amount: int) -> bytes:
        """Up to ``amount`` of the next bytes, as a new object (handed on without a copy)."""
        data = b""

        def read(stream: ObjectStream) -> int:
            nonlocal data
            data = stream.read(min(amount, self.end - self.pos))
            return len(data)

        self._next(read)
        return data

    def _next(self, read: Callable[[ObjectStream], int]) -> int:
        while self.pos < self.end:
            try:
                if self._stream is None:
                    self._stream = self._store.open_range(
                        self._bucket, self._key, self.pos, self.end, if_match=self._etag
                    )
                count = read(self._stream)
                if not count:
                    raise RetryableError(f"body ended at byte {self.pos} of {self.end}")
                self.pos += count
                return count
            except RetryableError as exc:
                self._failures += 1
                self.close()
                if self._failures >= self._retry.attempts:
                    raise StoreUnavailableError(
                        f"GetObject s3://{self._bucket}/{self._key} bytes {self.pos}-{self.end} "
                        f"at {self._store.namespace.partition(':')[2]}: "
                        f"failed after {self._failures} attempts: {exc}"
                    ) from exc
                time.sleep(self._retry.delay(self._failures))
        return 0

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


def copy_range(
    store: ObjectStore,
    info: ObjectInfo,
    sink: RangeSink,
    start: int,
    end: int,
    retry: RetryPolicy,
    stream: ObjectStream | None,
    meter: _LinkMeter | None = None,
) -> None:
    """Copy ``[start, end)`` into the sink, reopening from the last byte on a broken stream;
    a ``meter`` is told how long each read from the store took.

    Bytes go to the sink in whole ``CHUNK``-aligned pieces (a socket read returns what has
    arrived, a few KiB to a few hundred at any offset, and a page cache filled by such writes
    is made of small folios, which a warm read copies out more slowly), except those a reader
    waits for (see ``HeldBytes``) or wants handed over (``RangeSink.next_read``).
    """
    get = RangedGet(store, info.bucket, info.key, info.etag, start, end, retry, stream)
    buffer = thread_buffer("copy")[: min(CHUNK, end - start)]  # the sink copies or consumes it
    held = HeldBytes(sink, buffer, start)
    sink.holding(held, True)
    try:
        while get.pos < end:
            wanted = sink.next_read(get.pos)
            began = time.monotonic()
            if wanted:  # a chunk the reader's size is handed to it as is
                with held.lock:
                    held.write_upto(get.pos)
                data = get.read(wanted)
                if meter is not None:
                    meter.received(len(data), time.monotonic() - began)
                with held.lock:
                    sink.write(held.advance(len(data)), data)
                continue
            with held.lock:
                room = held.room(end)
            try:
                count = get.readinto(room)
            except BaseException:
                # The bytes that came are good: the sink keeps them (a failure to write them
                # does not hide why the range failed).
                with held.lock, contextlib.suppress(Exception):
                    held.write_upto(get.pos)
                raise
            if meter is not None:
                meter.received(count, time.monotonic() - began)
            with held.lock:
                held.received(count, whole=count == len(room))
    finally:
        sink.holding(held, False)
        get.close()


class HeldBytes:
    """The bytes one stream of ``copy_range`` received and holds until their chunk is whole.

    The stream's thread reads behind them into the same buffer, and writes them once the chunk
    is whole or a reader waits for some of them (``RangeSink.awaited_end``). A reader that
    starts to wait while the stream's thread is in a read (a link may stall there for as long
    as its timeout) writes them itself (``write_for``): bytes that arrived never wait on bytes
    still to come. Hold ``lock`` for every method.
    """

    def __init__(self, sink: RangeSink, buffer: memoryview, first: int) -> None:
        self.lock = threading.Lock()
        self._sink = sink
        self._buffer = buffer
        self._first = first  # the offset of buffer[0] in the object
        self._filled = 0  # bytes in the buffer
        self._written = 0  # of them, those at its head written already (by a reader)

    def room(self, end: int) -> memoryview:
        """Where the next read goes: the buffer up to the chunk's end (or ``end``)."""
        self._compact()
        stop = min(len(self._buffer), CHUNK - self._first % CHUNK, end - self._first)
        return self._buffer[self._filled : stop]

    def received(self, count: int, whole: bool) -> None:
        """``count`` bytes were read into ``room``: write what is whole or awaited."""
        self._filled += count
        held_from = self._first + self._written
        upto = self._first + self._filled
        if not whole:
            upto = self._sink.awaited_end(held_from, upto)
        self.write_upto(upto)

    def write_upto(self, upto: int) -> None:
        """Write the held bytes before ``upto``."""
        start = self._written
        stop = min(upto - self._first, self._filled)
        if stop > start:
            self._sink.write(self._first + start, self._buffer[start:stop])
            self._written = stop

    def advance(self, count: int) -> int:
        """``count`` bytes were read past the buffer (none held): where they start."""
        self._compact()
        assert self._filled == 0
        first = self._first
        self._first += count
        return first

    def _compact(self) -> None:
        """Move what is still held to the buffer's head (the stream's thread, between reads:
        a reader's ``write_for`` may run while a read fills the buffer behind the held bytes)."""
        if self._written:
            left = self._filled - self._written
            if left:
                self._buffer[:left] = self._buffer[self._written : self._filled]
            self._first += self._written
            self._filled, self._written = left, 0

    def write_for(self, start: int, end: int) -> None:
        """A reader waits for ``[start, end)``: write what is held of it (takes ``lock``)."""
        with self.lock:
            if start < self._first + self._filled and self._first + self._written < end:
                self.write_upto(end)
