"""Reads of kernel-opened files (``PathReaders``) and the kernel's entry lifetimes per mount."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tiercache.mount.kernel_opens import MAX_LIMIT, PathReaders, default_limit
from tiercache.mount.runner import IMMUTABLE_ENTRY_TTL, MountSpec, kernel_options


class FakeHandle:
    """A read handle that records whether it is closed while a read uses it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.closed = False
        self.reading = 0
        self.lock = threading.Lock()

    def read_into(self, buffer: memoryview, offset: int) -> int:
        with self.lock:
            assert not self.closed, f"{self.path} read after it was closed"
            self.reading += 1
        time.sleep(0.0005)
        with self.lock:
            assert not self.closed, f"{self.path} closed under a read"
            self.reading -= 1
        return 0

    def close(self) -> None:
        with self.lock:
            assert self.reading == 0, f"{self.path} closed under a read"
            self.closed = True


class Opener:
    def __init__(self, delay: float = 0.0) -> None:
        self.opened: list[FakeHandle] = []
        self.lock = threading.Lock()
        self.delay = delay

    def __call__(self, path: str) -> Any:
        time.sleep(self.delay)
        handle = FakeHandle(path)
        with self.lock:
            self.opened.append(handle)
        return handle


def test_a_path_is_opened_once_and_its_handle_reused() -> None:
    opener = Opener()
    readers = PathReaders(opener, limit=4)
    for _ in range(3):
        with readers.reading("/a") as handle:
            assert handle.path == "/a"
    assert [h.path for h in opener.opened] == ["/a"]
    assert readers.counters() == {"kernel_opened_files": 1}


def test_concurrent_first_reads_of_one_path_open_it_once() -> None:
    opener = Opener(delay=0.05)
    readers = PathReaders(opener, limit=4)

    def read(_: int) -> str:
        with readers.reading("/same") as handle:
            return str(handle.path)

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(read, range(8))) == {"/same"}
    assert len(opener.opened) == 1


def test_the_least_recently_used_unused_handles_are_closed_beyond_the_limit() -> None:
    opener = Opener()
    readers = PathReaders(opener, limit=2)
    for path in ("/a", "/b", "/c"):
        with readers.reading(path):
            pass
    a, b, c = opener.opened
    assert a.closed and not b.closed and not c.closed
    assert len(readers) == 2
    with readers.reading("/b"):  # /b is now the most recent: /c goes next
        pass
    with readers.reading("/d"):
        pass
    assert c.closed and not b.closed


def test_a_handle_in_use_is_never_closed_even_over_the_limit() -> None:
    opener = Opener()
    readers = PathReaders(opener, limit=1)
    with readers.reading("/held") as held:
        with readers.reading("/other"):
            pass
        with readers.reading("/third"):
            pass
        assert not held.closed
    with readers.reading("/last"):
        pass
    assert held.closed
    assert len(readers) == 1


def test_an_open_that_fails_is_raised_and_retried_by_the_next_read() -> None:
    calls = []

    def opener(path: str) -> Any:
        calls.append(path)
        if len(calls) == 1:
            raise FileNotFoundError(path)
        return FakeHandle(path)

    readers = PathReaders(opener, limit=2)
    with pytest.raises(FileNotFoundError), readers.reading("/x"):
        pass
    with readers.reading("/x") as handle:
        assert handle.path == "/x"
    assert calls == ["/x", "/x"]


def test_many_threads_over_many_paths_never_read_a_closed_handle() -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    opener = Opener()
    readers = PathReaders(opener, limit=3)
    picks = random.Random(seed)
    paths = [f"/f{picks.randrange(12)}" for _ in range(4000)]

    def read(path: str) -> None:
        with readers.reading(path) as handle:
            handle.read_into(memoryview(bytearray(1)), 0)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(read, paths))
    assert len(readers) <= 3
    readers.close_all()
    assert len(readers) == 0
    assert all(h.closed for h in opener.opened)


def test_the_default_limit_leaves_most_descriptors_to_the_rest_of_the_mount() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = default_limit()
    assert 16 <= limit <= MAX_LIMIT
    if soft != resource.RLIM_INFINITY and soft >= 64:
        assert limit <= soft // 4


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit"):
        PathReaders(Opener(), limit=0)


def _spec(**kw: Any) -> MountSpec:
    return MountSpec(url="s3://b/p", bucket="b", prefix="p", mountpoint="/mnt", **kw)


def test_found_entries_are_trusted_longer_where_asked_and_missing_names_never() -> None:
    options = kernel_options(_spec(read_only=True, attr_ttl=1.0, entry_ttl=IMMUTABLE_ENTRY_TTL))
    assert options["entry_timeout"] == options["attr_timeout"] == IMMUTABLE_ENTRY_TTL
    assert options["negative_timeout"] == 1.0
    plain = kernel_options(_spec(attr_ttl=2.0))
    assert plain["entry_timeout"] == plain["attr_timeout"] == plain["negative_timeout"] == 2.0
    assert plain["max_threads"] >= 16
