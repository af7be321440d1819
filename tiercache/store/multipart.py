"""Multipart uploads: parts sent as their bytes arrive, as many at once as the link pays for.

A ``MultipartUpload`` takes parts one by one (``add_part``) while its caller still produces
them: a file is uploaded while it is being written, or read part by part from disk. Every
upload of a store shares one ``PartSender``, whose ``PartGovernor`` learns how many parts to
keep in flight from the rate each part got: a remote store gives one connection a small
share of the link, so parts are added while each still gets most of the best rate seen; a
store that takes one part fast (a loopback or same-rack server) gets two at a time, enough
to hide the request latency without spending the CPU more would cost.

A writer on a machine of few cores may have the parts held back (``PartSender.hold``): a
part costs the client CPU for every byte it sends (reading it back, the SHA-256 of its
signature, the socket), and even two parts sent beside a writer on one core made its
``close()`` calls block 1.3-2.3 times as long, for no earlier end to the upload. The request
that creates an upload is sent at once even then: it costs no CPU, and on a far store it
saves a round trip once the parts go.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol, cast

from tiercache import forksafe
from tiercache.store.base import ObjectInfo, WriteCondition, WriteFence

_MEASURED = 1024 * 1024  # parts smaller than this (a file's tail) say little about the link
# S3 numbers the parts of an upload from 1 to 10,000; a larger object needs larger parts.
MAX_PARTS = 10_000
_PART_STEP = 1024 * 1024


def part_size_for(size: int, part_size: int) -> int:
    """The part size for an object of ``size`` bytes: ``part_size``, or the smallest whole
    number of MiB above it that keeps the object within ``MAX_PARTS`` parts."""
    if -(-size // part_size) <= MAX_PARTS:
        return part_size
    needed = -(-size // MAX_PARTS)
    return -(-needed // _PART_STEP) * _PART_STEP


class _AbortedError(Exception):
    """The upload was aborted before this part could create it."""


class PartRequests(Protocol):
    """The four multipart requests of a store."""

    def create_multipart(self, bucket: str, key: str, metadata: Mapping[str, str]) -> str:
        """Start a multipart upload; return its upload id."""
        ...

    def send_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> str:
        """Upload one part; return its ETag."""
        ...

    def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        etags: list[tuple[int, str]],
        size: int,
        condition: WriteCondition | None = None,
    ) -> ObjectInfo:
        """Make the parts, in number order, the object."""
        ...

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        """Abort the upload (its parts stop taking space)."""
        ...


class PartGovernor:
    """How many parts one process sends at once: fixed, or learned from the rate of each."""

    FAST = 256 * 1024 * 1024  # bytes/s of one part that the link does not hold back
    START = 4
    GROW = 0.75  # another part is worth it while a part still gets this share of the best rate
    SHRINK = 0.5  # below this share, parts compete for the link: one fewer

    def __init__(self, fixed: int | None, maximum: int = 16) -> None:
        self.fixed = fixed
        self.maximum = maximum
        self._lock = threading.Lock()
        self._limit = fixed or min(self.START, maximum)
        self._best = 0.0

    def limit(self) -> int:
        with self._lock:
            return self._limit

    def observed(self, nbytes: int, seconds: float) -> None:
        """One part of ``nbytes`` took ``seconds`` on the wire."""
        if nbytes < _MEASURED:
            return
        rate = nbytes / max(seconds, 1e-6)
        with self._lock:
            self._best = max(self._best, rate)
            if self.fixed is not None:
                return
            if self._best >= self.FAST:
                self._limit = min(2, self.maximum)
            elif rate >= self.GROW * self._best:
                self._limit = min(self.maximum, self._limit + 1)
            elif rate < self.SHRINK * self._best:
                self._limit = max(2, self._limit - 1)


def background_priority() -> None:
    """Run the calling thread at a lower CPU priority (nice +10): an upload in the background
    must not take the CPU from the thread that writes the next file."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


class PartSender:
    """Threads that send the parts of every multipart upload of one store, governed."""

    def __init__(self, governor: PartGovernor) -> None:
        self.governor = governor
        self._reset()
        forksafe.register(self)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._in_flight = 0
        self._threads = 0
        self._held = False
        self._create_early = True
        self._held_until = 0.0

    def after_fork(self) -> None:
        self._reset()  # the parent's threads do not exist here

    def hold(self, held: bool, at_most: float = 10.0, create_early: bool = True) -> None:
        """Hold parts back for a writer until called with False, or for ``at_most`` seconds (a
        file left open for long must not hold every upload back). With ``create_early``, the
        requests that create uploads still go; without, nothing does."""
        with self._cond:
            self._held = held
            self._create_early = create_early
            self._held_until = time.monotonic() + at_most
            self._cond.notify_all()

    def _holding(self) -> bool:
        return self._held and time.monotonic() < self._held_until

    def _limit(self) -> int:
        return 0 if self._holding() else self.governor.limit()

    def creates_early(self) -> bool:
        """Whether an upload may be created ahead of its first part (not under a full hold)."""
        with self._cond:
            return self._create_early or not self._holding()

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job``, a part, as the governor and any hold allow."""
        with self._cond:
            self._queue.append(job)
            self._add_threads()
            self._cond.notify_all()

    def _add_threads(self) -> None:
        """Start the threads the queue needs (hold ``_cond``). Under a hold, one waits for
        it to end; the rest start as parts go: a thread started beside a writer on a busy
        core costs it the wait until the new thread first runs."""
        wanted = min(self.governor.maximum, self._in_flight + len(self._queue))
        if self._holding():
            wanted = min(wanted, 1)
        while self._threads < wanted:
            self._threads += 1
            threading.Thread(target=self._work, name="tiercache-part", daemon=True).start()

    def _work(self) -> None:
        background_priority()
        while True:
            with self._cond:
                while not (self._queue and self._in_flight < self._limit()):
                    self._cond.wait(0.5 if self._held else None)
                job = self._queue.popleft()
                self._in_flight += 1
                self._add_threads()  # the others waiting in the queue
            try:
                job()
            finally:
                with self._cond:
                    self._in_flight -= 1
                    self._cond.notify_all()


class MultipartUpload:
    """One multipart upload whose parts arrive over time; created with its first part.

    ``on_created`` gets the upload id before any part is sent, so the caller can journal it
    and abort the upload if this process dies. A part that fails fails the whole upload:
    ``complete`` raises its error (after aborting) and later parts are not sent. A ``fence``
    (given at the start, or by ``fence_with`` before the parts that need it) is checked before
    each part and before the completion, which carries its condition.
    """

    def __init__(
        self,
        requests: PartRequests,
        sender: PartSender,
        bucket: str,
        key: str,
        metadata: Mapping[str, str] | None = None,
        on_created: Callable[[str], None] | None = None,
        fence: WriteFence | None = None,
    ) -> None:
        self.bucket = bucket
        self._fence = fence
        self.key = key
        self._requests = requests
        self._sender = sender
        self._metadata = dict(metadata or {})
        self._on_created = on_created
        self._lock = threading.Condition()
        self._create_lock = threading.Lock()
        self.upload_id: str | None = None
        self._etags: dict[int, str] = {}
        self._sizes: dict[int, int] = {}
        self._pending = 0  # parts added and not finished
        self._sending = 0  # parts on the wire
        self._creating = False  # a part was added: the upload is created early or by it
        self._aborted = False
        self.error: BaseException | None = None

    def fence_with(self, fence: WriteFence) -> None:
        """Check ``fence`` before every part sent from now on and before the completion."""
        self._fence = fence

    def add_part(self, number: int, read: Callable[[], bytes]) -> None:
        """Send part ``number`` (from 1) with the bytes ``read()`` returns when its turn comes."""
        with self._lock:
            if self.error is not None or self._aborted:
                return
            self._pending += 1
            create, self._creating = not self._creating, True
        if create and self._sender.creates_early():
            # At once, even while parts are held: it costs no CPU to speak of.
            creator = threading.Thread(target=self._create_early, name="tiercache-create")
            creator.daemon = True
            creator.start()
        self._sender.submit(lambda: self._send(number, read))

    def _create_early(self) -> None:
        """Create the upload ahead of its first part; a failure is left to that part, which
        tries again and reports it."""
        with contextlib.suppress(Exception):
            self._created()

    def _send(self, number: int, read: Callable[[], bytes]) -> None:
        try:
            with self._lock:
                if self.error is not None or self._aborted:
                    return
                self._sending += 1
            try:
                upload_id = self._created()
                if self._fence is not None:
                    self._fence.check()
                data = read()
                start = time.perf_counter()
                etag = self._requests.send_part(self.bucket, self.key, upload_id, number, data)
                self._sender.governor.observed(len(data), time.perf_counter() - start)
            finally:
                with self._lock:
                    self._sending -= 1
            with self._lock:
                self._etags[number] = etag
                self._sizes[number] = len(data)
        except BaseException as exc:
            with self._lock:
                if self.error is None:
                    self.error = exc
        finally:
            with self._lock:
                self._pending -= 1
                self._lock.notify_all()

    def _created(self) -> str:
        with self._create_lock:
            if self._aborted:
                raise _AbortedError(f"multipart upload of {self.bucket}/{self.key} was aborted")
            if self.upload_id is None:
                upload_id = self._requests.create_multipart(self.bucket, self.key, self._metadata)
                if self._on_created is not None:
                    try:
                        self._on_created(upload_id)
                    except BaseException:
                        self._requests.abort_multipart(self.bucket, self.key, upload_id)
                        raise
                self.upload_id = upload_id
            return self.upload_id

    def wait(self) -> None:
        """Until every part added so far is sent; raise the first part's error."""
        with self._lock:
            self._lock.wait_for(lambda: self._pending == 0)
            if self.error is not None:
                raise self.error

    def sent(self) -> dict[int, int]:
        """Sizes of the parts sent so far, by number."""
        with self._lock:
            return dict(self._sizes)

    def complete(self) -> ObjectInfo:
        """Wait for the parts, then make them the object; on any failure abort the upload."""
        try:
            self.wait()
            upload_id = self._created()
            with self._lock:
                etags = sorted(self._etags.items())
                size = sum(self._sizes.values())
            condition = None
            if self._fence is not None:
                condition = self._fence.condition()
                self._fence.check()  # after the condition's answer: the last look before
            return self._requests.complete_multipart(
                self.bucket, self.key, upload_id, etags, size, condition
            )
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Stop sending and abort the upload in the store, if it was created (parts still
        queued are dropped; parts on the wire are waited for, so none lands after the abort)."""
        with self._lock:
            self._aborted = True
            self._lock.wait_for(lambda: self._sending == 0)
        with self._create_lock:  # a part about to create the upload sees _aborted first
            upload_id = self.upload_id
        if upload_id is not None:
            self._requests.abort_multipart(self.bucket, self.key, upload_id)


class SendsParts:
    """What a store that implements ``PartRequests`` gains from one ``PartSender``: uploads
    started part by part, and a ceiling on the parts in flight."""

    _sender: PartSender

    def hold_parts(self, held: bool, at_most: float = 10.0, create_early: bool = True) -> None:
        """Hold parts back for a writer (see ``PartSender.hold``)."""
        self._sender.hold(held, at_most, create_early)

    def start_multipart(
        self,
        bucket: str,
        key: str,
        metadata: Mapping[str, str] | None = None,
        on_created: Callable[[str], None] | None = None,
        fence: WriteFence | None = None,
    ) -> MultipartUpload:
        """A multipart upload of ``bucket/key``, created when its first part is sent."""
        requests = cast(PartRequests, self)
        return MultipartUpload(requests, self._sender, bucket, key, metadata, on_created, fence)
