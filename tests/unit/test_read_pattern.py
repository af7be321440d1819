"""When a cold reader counts as sequential (``ReadPattern``) and what the mount's cold handle
then fetches (``ColdReadHandle``): whole objects for readers in order, ranges for the others."""

from __future__ import annotations

import random
from typing import Any

from tiercache.mount.handles import ColdReadHandle
from tiercache.read.files import ReadPattern

KIB = 1024


def _reads(pattern: ReadPattern, reads: list[tuple[int, int]]) -> list[bool]:
    sequential = []
    for offset, size in reads:
        pattern.read(offset, size)
        sequential.append(pattern.sequential)
        pattern.moved_to(offset + size)
    return sequential


def test_a_reader_from_the_start_is_sequential_at_its_second_read() -> None:
    assert _reads(ReadPattern(), [(0, 4 * KIB), (4 * KIB, 4 * KIB)]) == [False, True]


def test_a_reader_from_elsewhere_is_sequential_at_its_third_read() -> None:
    reads = [(100 * KIB, 4 * KIB), (104 * KIB, 4 * KIB), (108 * KIB, 4 * KIB)]
    assert _reads(ReadPattern(), reads) == [False, False, True]


def test_one_read_landing_after_a_random_one_is_not_a_sequential_reader() -> None:
    # A random read, then one that happens to start where it ended, then random again.
    reads = [(512 * KIB, 16 * KIB), (528 * KIB, 16 * KIB), (64 * KIB, 16 * KIB)]
    assert _reads(ReadPattern(slack_reads=4), reads) == [False, False, False]


class _FakeWhole:
    def __init__(self) -> None:
        self.opened = 0

    def __call__(self) -> Any:
        self.opened += 1
        return _Bytes()


class _Bytes:
    size = 32 << 20

    def seek(self, offset: int) -> None:
        pass

    def readinto(self, buffer: Any) -> int:
        return len(buffer)

    def close(self) -> None:
        pass


def test_a_random_reader_of_the_mount_moves_about_what_it_reads() -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    size = 32 << 20
    fetched = 0

    def read_range(offset: int, view: memoryview) -> int:
        nonlocal fetched
        fetched += len(view)
        return len(view)

    whole = _FakeWhole()
    handle = ColdReadHandle("/f", size, read_range, whole)
    read = 16 * KIB  # what the kernel asks for a random 4 KiB read (its first read-ahead)
    buffer = memoryview(bytearray(read))
    end = 0
    for i in range(2000):
        if i % 50 == 49:
            offset = end  # now and then a read lands right where the one before ended
        else:
            offset = end
            while abs(offset - end) <= 8 * read:  # elsewhere, as random reads are
                offset = rng.randrange(size // read - 1) * read
        handle.read_into(buffer, offset)
        end = offset + read
    # 2000 reads of 16 KiB (31 MiB) of a 32 MiB object: with one read in order enough to
    # look sequential, the 50th read had it fetched whole; now none does.
    assert whole.opened == 0, f"seed={seed}: fetched whole after {fetched} bytes by ranges"
    assert fetched == 2000 * read
