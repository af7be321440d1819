"""Eight processes open one missing object at the same moment: the store serves it once.

As DataLoader workers do, each process builds its filesystem inside ``fsspec.open`` of a
``tiercache::s3://`` URL, at a common release time, while busy loops load the CPUs; so the
processes reach the cache staggered, some after the first one's download began. The GETs are
counted twice: by each process's own stats, and by the proxy in front of the server (what the
store served, in copies of the object, ranged GETs summed). Each process checks its bytes.
With ``consistency="always"`` a process that opened the object after the first one's GET
began used to refuse that fetch's entry (its bytes were asked for before this open) and fetch
the whole object again, one such process after the other under the entry's lock; it now asks
the store with a HEAD whether the entry is still current.

The second test kills the fetcher (SIGKILL) in the middle of its download: a waiter takes over
the fetch, and no lock or part file is left behind.
"""

from __future__ import annotations

import fcntl
import glob
import multiprocessing
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import xxhash
from support.proxy import FaultProxy

MiB = 1024 * 1024
SIZE = 32 * MiB
PROCESSES = 8
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def _spin(stop: Any) -> None:
    while not stop.is_set():
        pass


def _reader(
    url: str, s3: dict[str, Any], tiercache: dict[str, Any], release: float, out: Any
) -> None:
    time.sleep(max(0.0, release - time.time()))
    opened = fsspec.open(url, "rb", s3=s3, tiercache=tiercache)  # the filesystem is built here
    with opened as f:
        digest = xxhash.xxh3_64_hexdigest(f.read())
    fs = opened.fs
    fs.wait_fetches()
    stats = fs.stats()
    out.put(
        (
            digest,
            stats["fetches"],
            stats["fetches_joined_other_process"],
            stats["hits"],
            stats["fetch_errors"],
        )
    )


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two busy loops, one per core of the machine the issue was measured on."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    spinners = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(2)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=10)


def _copies_served(proxy: FaultProxy, key: str, size: int) -> float:
    """Bytes the store was asked for by GETs of ``key``, in copies of the object."""
    asked = 0
    for method, target, headers in list(proxy.log):
        if method != "GET" or not target.split("?")[0].endswith(f"/{key}"):
            continue
        match = _RANGE.fullmatch(headers.get("range", ""))
        if match is None:
            asked += size
        else:
            end = int(match.group(2)) + 1 if match.group(2) else size
            asked += min(end, size) - int(match.group(1))
    return asked / size


# ``always`` wants bytes fetched after the open: the mode in which late openers re-fetched.
ROUNDS = {
    "fork": ["always", "ttl"],  # DataLoader's default on Linux
    "spawn": ["always"],  # an interpreter per process, so one round
}


@pytest.mark.parametrize("start_method", list(ROUNDS))
def test_eight_processes_at_once_fetch_the_object_once(
    s3: Any,
    s3_client: Any,
    bucket: str,
    proxy: FaultProxy,
    tmp_path: Path,
    cpu_load: None,
    start_method: str,
) -> None:
    # A remote store answers after some milliseconds: late openers arrive mid-download.
    proxy.delay(0.03)
    s3_options = {**s3.target_options(), "endpoint_url": proxy.url}
    ctx = multiprocessing.get_context(start_method)
    served = []
    for n, consistency in enumerate(ROUNDS[start_method]):
        key = f"shard-{n}.bin"
        data = os.urandom(SIZE)
        s3_client.put_object(Bucket=bucket, Key=key, Body=data)
        cache = {"local_dir": str(tmp_path / "tier"), "consistency": consistency}
        out = ctx.Queue()
        release = time.time() + (0.3 if start_method == "fork" else 2.0)
        args = (f"tiercache::s3://{bucket}/{key}", s3_options, cache, release, out)
        procs = [ctx.Process(target=_reader, args=args) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0

        assert [r[0] for r in results] == [xxhash.xxh3_64_hexdigest(data)] * PROCESSES
        fetches = sum(r[1] for r in results)
        waited = sum(r[2] + r[3] for r in results)  # joined another's fetch, or a hit
        errors = sum(r[4] for r in results)
        copies = _copies_served(proxy, key, SIZE)
        served.append((consistency, fetches, waited, errors, copies))
    # One fetch per round, the seven others joined it or found it; the store agrees.
    assert served == [(c, 1, PROCESSES - 1, 0, 1.0) for c in ROUNDS[start_method]]


def _stalled_reader(url: str, s3: dict[str, Any], tiercache: dict[str, Any]) -> None:
    with fsspec.open(url, "rb", s3=s3, tiercache=tiercache) as f:
        f.read()


def _unlocked(path: str) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_waiter_takes_over_when_the_fetcher_is_killed(
    s3: Any, s3_client: Any, bucket: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = os.urandom(24 * MiB)
    s3_client.put_object(Bucket=bucket, Key="big.bin", Body=data)
    url = f"tiercache::s3://{bucket}/big.bin"
    # The first GET delivers 4 MiB, then stalls: the fetcher dies in the middle of it.
    proxy.truncate_next(1, after_bytes=4 * MiB, hold=60.0, method="GET")
    s3_options = {**s3.target_options(), "endpoint_url": proxy.url}
    tier = tmp_path / "tier"
    cache = {"local_dir": str(tier), "consistency": "always", "lock_timeout": 60.0}
    ctx = multiprocessing.get_context("fork")
    victim = ctx.Process(target=_stalled_reader, args=(url, s3_options, cache))
    victim.start()
    deadline = time.monotonic() + 60
    while sum(os.path.getsize(p) for p in glob.glob(str(tier / "objects/*/*.part"))) < 4 * MiB:
        assert time.monotonic() < deadline, "the fetch never started"
        assert victim.is_alive()
        time.sleep(0.01)
    out = ctx.Queue()
    waiters = [
        ctx.Process(target=_reader, args=(url, s3_options, cache, 0.0, out)) for _ in range(2)
    ]
    for p in waiters:
        p.start()
    time.sleep(1.5)  # the waiters opened the object and wait for the fetcher's lock
    assert victim.is_alive() and victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=30)
    assert victim.exitcode == -signal.SIGKILL

    results = [out.get(timeout=60) for _ in waiters]
    for p in waiters:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert [r[0] for r in results] == [xxhash.xxh3_64_hexdigest(data)] * 2
    assert sorted(r[1:3] for r in results) == [(0, 1), (1, 0)]  # one took over, one joined it
    assert glob.glob(str(tier / "objects/*/*.part")) == []  # the dead fetch's bytes are gone
    assert len(glob.glob(str(tier / "objects/*/*.data"))) == 1
    locks = glob.glob(str(tier / "objects/*/*.lock"))
    assert locks and all(_unlocked(path) for path in locks)  # nobody holds a lock any more
    # What the store served: the killed fetch's share, then one whole fetch.
    assert _copies_served(proxy, "big.bin", len(data)) <= 2.0
