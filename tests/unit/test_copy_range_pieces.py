"""A ranged GET writes its sink in whole aligned chunks, whatever sizes the socket returns,
except where a reader waits for bytes already received."""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.memory_sink import MemorySink

from tiercache import MemoryStore
from tiercache.errors import StoreUnavailableError
from tiercache.read.ranges import CHUNK, copy_range
from tiercache.store.memory import MemoryStream
from tiercache.store.retry import RetryableError, RetryPolicy

KiB = 1024


class _RaggedStream:
    """Returns a few bytes to a few dozen KiB per read, as a socket does; breaks once at
    ``break_at`` (an offset in the object) when given."""

    def __init__(self, inner: MemoryStream, rng: random.Random, break_at: list[int]) -> None:
        self.info, self.start, self.end = inner.info, inner.start, inner.end
        self._inner, self._rng, self._break_at = inner, rng, break_at
        self._pos = inner.start

    def read(self, amount: int) -> bytes:
        data = self._inner.read(min(amount, self._rng.randint(1, 70 * KiB)))
        self._pos += len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        if self._break_at and self._pos >= self._break_at[0]:
            self._break_at.pop()
            raise RetryableError("connection reset")
        count = self._inner.readinto(buffer[: self._rng.randint(1, 70 * KiB)])
        self._pos += count
        return count

    def close(self) -> None:
        self._inner.close()


class _RaggedStore(MemoryStore):
    def __init__(self, seed: int, break_at: int | None = None) -> None:
        super().__init__(["b"])
        self._rng = random.Random(seed)
        self._break_at = [] if break_at is None else [break_at]

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> Any:
        inner = super().open_range(bucket, key, start, end, if_match)
        return _RaggedStream(inner, self._rng, self._break_at)


def _copy(
    seed: int, size: int, start: int, waited: tuple[int, int] | None = None, **store: Any
) -> tuple[bytes, MemorySink]:
    payload = random.Random(seed).randbytes(size)
    ragged = _RaggedStore(seed, **store)
    ragged.put_bytes("b", "k", payload)
    info = ragged.head("b", "k")
    sink = MemorySink(size, waited)
    retry = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.001)
    copy_range(ragged, info, sink, start, size, retry, None)
    return payload, sink


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ragged_reads_reach_the_sink_as_whole_aligned_chunks(seed: int) -> None:
    size = 5 * CHUNK + 12345
    payload, sink = _copy(seed, size, 0)
    assert sink.data == payload, f"seed {seed}"
    assert sink.writes == [(n * CHUNK, CHUNK) for n in range(5)] + [(5 * CHUNK, 12345)]


def test_a_range_that_starts_off_a_chunk_boundary_is_aligned_by_its_first_write() -> None:
    size = 3 * CHUNK
    payload, sink = _copy(4, size, 1000)
    assert sink.data[1000:] == payload[1000:]
    assert sink.writes == [(1000, CHUNK - 1000), (CHUNK, CHUNK), (2 * CHUNK, CHUNK)]


def test_bytes_a_reader_waits_for_are_written_as_soon_as_they_are_here() -> None:
    size = 2 * CHUNK
    payload, sink = _copy(5, size, 0, waited=(64 * KiB, 300 * KiB))
    assert sink.data == payload
    # The waited range's end is a write's end; the chunk's rest waits to be whole again.
    assert sink.writes[0][0] == 0 and sink.writes[0][1] >= 300 * KiB - 70 * KiB
    ends = [offset + length for offset, length in sink.writes]
    assert 300 * KiB in ends
    assert ends[-2:] == [CHUNK, 2 * CHUNK]
    assert sink.writes[-1] == (CHUNK, CHUNK)


def test_a_broken_stream_resumes_from_the_bytes_it_held() -> None:
    size = 3 * CHUNK
    payload, sink = _copy(6, size, 0, break_at=CHUNK + 500 * KiB)
    assert sink.data == payload
    assert sink.writes == [(0, CHUNK), (CHUNK, CHUNK), (2 * CHUNK, CHUNK)]


def test_a_range_that_fails_for_good_leaves_the_bytes_it_received_in_the_sink() -> None:
    size = 3 * CHUNK
    payload = random.Random(7).randbytes(size)
    ragged = _RaggedStore(7, break_at=CHUNK + 500 * KiB)
    ragged.put_bytes("b", "k", payload)
    ragged._break_at *= 10  # every attempt breaks there
    sink = MemorySink(size)
    retry = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.001)
    with pytest.raises(StoreUnavailableError):
        copy_range(ragged, ragged.head("b", "k"), sink, 0, size, retry, None)
    assert sink.writes[0] == (0, CHUNK)
    offset, length = sink.writes[1]
    assert offset == CHUNK and length >= 500 * KiB
    assert sink.data[: offset + length] == payload[: offset + length]
