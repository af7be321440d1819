"""Parallel ranged GETs sized from what the link gives: more streams only while they pay."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from support.memory_sink import MemorySink

from tiercache import MemoryStore
from tiercache.read.ranges import StreamGovernor, download
from tiercache.store.memory import MemoryStream
from tiercache.store.retry import RetryPolicy

MiB = 1024 * 1024


class _Link:
    """A shared link: each connection at most ``per_stream`` bytes/s, all at most ``total``."""

    def __init__(self, per_stream: float, total: float) -> None:
        self.per_stream, self.total = per_stream, total
        self._lock = threading.Lock()
        self._free_at = time.monotonic()

    def pace(self, nbytes: int, stream_free_at: float) -> float:
        now = time.monotonic()
        with self._lock:
            self._free_at = max(self._free_at, now) + nbytes / self.total
            shared = self._free_at
        own = max(stream_free_at, now) + nbytes / self.per_stream
        time.sleep(max(0.0, max(own, shared) - now))
        return own


class _LinkStream:
    def __init__(self, inner: MemoryStream, link: _Link | None) -> None:
        self.info, self.start, self.end = inner.info, inner.start, inner.end
        self._inner, self._link, self._free_at = inner, link, time.monotonic()

    def read(self, amount: int) -> bytes:
        data = self._inner.read(min(amount, 256 * 1024))
        if self._link is not None:
            self._free_at = self._link.pace(len(data), self._free_at)
        return data

    def readinto(self, buffer: memoryview) -> int:
        count = self._inner.readinto(buffer[: 256 * 1024])
        if self._link is not None:
            self._free_at = self._link.pace(count, self._free_at)
        return count

    def close(self) -> None:
        self._inner.close()


class _LinkStore(MemoryStore):
    def __init__(self, link: _Link | None) -> None:
        super().__init__(["b"])
        self.link = link
        self.opened = 0
        self.opened_at: list[float] = []  # time.monotonic() of each GET
        self._count_lock = threading.Lock()

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> Any:
        with self._count_lock:
            self.opened += 1
            self.opened_at.append(time.monotonic())
        return _LinkStream(super().open_range(bucket, key, start, end, if_match), self.link)


def _fetch(
    store: _LinkStore, governor: StreamGovernor, size: int, **options: Any
) -> tuple[bytes, bytes]:
    payload = random.randbytes(size)
    store.put_bytes("b", "k", payload)
    sink = MemorySink()
    download(
        store,
        "b",
        "k",
        sink,
        part_size=1 * MiB,
        concurrency=governor.maximum,
        retry=RetryPolicy(attempts=2),
        governor=governor,
        **options,
    )
    return payload, bytes(sink.data)


def test_a_slow_link_gets_streams_until_the_aggregate_is_full() -> None:
    # One connection gets a quarter of the link: about four streams fill it.
    store = _LinkStore(_Link(per_stream=6 * MiB, total=24 * MiB))
    governor = StreamGovernor(16)
    governor.WINDOW = 0.15
    payload, got = _fetch(store, governor, 24 * MiB)
    assert got == payload
    learned = governor.start()
    assert 3 <= learned <= 8, learned  # a probe doubles its streams: up to twice the need
    before = len(store.opened_at)
    payload, got = _fetch(store, governor, 24 * MiB)  # the next fetch starts there
    assert got == payload
    # All of its streams at once, not one more per probe window: no GET waits for a window.
    opened = store.opened_at[before:]
    at_once = [t for t in opened if t < opened[0] + governor.WINDOW * 0.8]
    assert len(at_once) >= learned, (len(at_once), learned)


def test_a_fast_store_is_read_with_one_get_per_object() -> None:
    store = _LinkStore(None)  # no link limit: one stream is as fast as it gets
    governor = StreamGovernor(16)
    governor.WINDOW = 0.05
    payload, got = _fetch(store, governor, 64 * MiB)
    assert got == payload
    assert governor.start() == 1
    store.opened = 0
    payload, got = _fetch(store, governor, 64 * MiB)
    assert got == payload and store.opened == 1  # learned: the whole object in one GET


def test_objects_of_few_parts_get_a_stream_per_part_once_learned() -> None:
    # Objects of four parts, read range-first by a reader that decides at once (``hesitate``
    # returns): one connection gets a quarter of the link, so the fetches should learn to
    # run all four parts at once, though no single fetch has a part left to show the limit.
    store = _LinkStore(_Link(per_stream=4 * MiB, total=16 * MiB))
    governor = StreamGovernor(16)
    governor.WINDOW = 0.08
    hesitated: list[int] = []
    options: dict[str, Any] = {"hesitate": lambda info: hesitated.append(info.size)}
    for _ in range(3):
        payload, got = _fetch(store, governor, 4 * MiB, **options)
        assert got == payload
    assert hesitated == [4 * MiB] * 3
    assert governor.start() >= 4, governor.start()
    started = time.monotonic()
    payload, got = _fetch(store, governor, 4 * MiB, **options)
    assert got == payload
    # Four streams at once take about one part's time; two (the first part's, then the
    # rest) would take two.
    assert (4 * MiB) / (time.monotonic() - started) > 0.6 * 16 * MiB


def test_a_fast_store_read_range_first_settles_on_one_stream() -> None:
    # One connection alone would get 300 MiB/s, more than a link that holds streams back
    # gives; the first part's stream and the next one, beside each other on the first fetch,
    # share 400 MiB/s: a fast store all the same, read in turn afterwards.
    store = _LinkStore(_Link(per_stream=300 * MiB, total=400 * MiB))
    governor = StreamGovernor(16)
    governor.WINDOW = 0.05
    options: dict[str, Any] = {"hesitate": lambda info: None}
    payload, got = _fetch(store, governor, 128 * MiB, **options)
    assert got == payload
    assert governor.start() == 1
    store.opened = 0
    payload, got = _fetch(store, governor, 64 * MiB, **options)
    assert got == payload and store.opened == 2  # the first part, then the rest in one GET


def test_a_probe_fills_the_link_within_an_object_of_few_parts() -> None:
    # Nothing learned yet and an object of eight parts on a link where one connection gets
    # an eighth of it: the probe doubles its streams at each decision (1, 2, 4, 8), so the
    # first fetch already ends far sooner than one that adds a stream per decision would
    # (1, 2, 3 ... : about twice the time on this link).
    store = _LinkStore(_Link(per_stream=2 * MiB, total=16 * MiB))
    governor = StreamGovernor(16)
    governor.WINDOW = governor.MIN_WINDOW = 0.1
    started = time.monotonic()
    payload, got = _fetch(store, governor, 8 * MiB)
    elapsed = time.monotonic() - started
    assert got == payload
    # Doubling: 1, 2, 4 then 8 streams after three windows; the last parts take half a
    # second at 2 MiB/s each. One stream more per window would still be at 4 streams then.
    assert elapsed < 1.1, elapsed
    assert governor.start() >= 8, governor.start()
