"""A herd of processes opens one missing object at once: the store sends its bytes once.

Eight processes wait on a barrier, then each opens ``tiercache::s3://`` through ``fsspec.open``
on one tier directory, reads 64 KiB (a range-first open: the fetch waits after its first part
for the reader's next reads) and then the rest in 8 MiB reads, and exits as soon as it has
the bytes, as a worker that read its shard does. One process fetches the object; the others
wait for its entry lock and read the entry it published. A fetch runs in a thread of the
process that started it, so it used to die with that process when the reader had its last
bytes before the entry was published: the lock went with it, and the next waiter fetched the
whole object again (2 to 8 copies, in about one trial in five).

A proxy between tiercache and the server counts the body bytes the store sent for the
object. Exact: one object's size, and no byte asked for twice (the first part is asked for
once, the rest after it). Trials run with fork and spawn, in a tier directory that does not
exist yet and in one that does (``TIERCACHE_HERD_TRIALS`` trials each, 3 by default).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import re
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pytest
import xxhash
from support.proxy import FaultProxy

from tiercache.tiers.entry import read_meta
from tiercache.tiers.local import LocalTier

MiB = 1024 * 1024
SIZE = 16 * MiB  # two ranged GETs of 8 MiB: the first part, then the rest
PROCESSES = 8
FIRST_READ = 64 * 1024
READ = 8 * MiB
# Trials per variant: 3 x 4 variants = 12 in a test run; TIERCACHE_HERD_TRIALS=12 for 48.
TRIALS = int(os.environ.get("TIERCACHE_HERD_TRIALS", "3"))
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_STATS = ("bytes_fetched", "fetches_joined_other_process", "hits", "fetch_errors")


class _CountingSocket:
    """A client connection whose sends the proxy counts (everything else passes through)."""

    def __init__(self, sock: socket.socket, proxy: ByteCountingProxy) -> None:
        self._sock = sock
        self._proxy = proxy

    def sendall(self, data: bytes) -> None:
        self._proxy.relayed(len(data))
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class ByteCountingProxy(FaultProxy):
    """A ``FaultProxy`` that also counts the response body bytes it relays for each GET."""

    def __init__(self, upstream: str) -> None:
        self.body_bytes: Counter[str] = Counter()  # per request path
        self._answer = threading.local()  # one connection per thread: its current answer
        super().__init__(upstream)

    def __enter__(self) -> ByteCountingProxy:
        return self

    def _converse(self, sock: socket.socket) -> None:
        super()._converse(_CountingSocket(sock, self))  # type: ignore[arg-type]

    def _pick(self, method: str, target: str, headers: dict[str, str]) -> Any:
        self._answer.path = target.split("?", 1)[0] if method == "GET" else None
        self._answer.head_sent = False  # an answer's first send is its head
        return super()._pick(method, target, headers)

    def relayed(self, count: int) -> None:
        if not self._answer.head_sent:
            self._answer.head_sent = True
        elif self._answer.path is not None:
            with self._lock:
                self.body_bytes[self._answer.path] += count

    def sent(self, key: str) -> int:
        """Body bytes the store sent for GETs of ``key``."""
        with self._lock:
            return sum(n for path, n in self.body_bytes.items() if path.endswith(f"/{key}"))

    def ranges(self, key: str, size: int) -> list[tuple[int, int]]:
        """The byte ranges GETs of ``key`` asked for, in the order they came."""
        asked = []
        for method, target, headers in list(self.log):
            if method != "GET" or not target.split("?")[0].endswith(f"/{key}"):
                continue
            match = _RANGE.fullmatch(headers.get("range", ""))
            end = size if match is None or not match.group(2) else int(match.group(2)) + 1
            asked.append((0 if match is None else int(match.group(1)), min(end, size)))
        return asked


def _asked_twice(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The bytes that more than one GET asked for, as ranges."""
    ordered = sorted(ranges)
    return [
        (start, min(end, next_end))
        for (_, end), (start, next_end) in itertools.pairwise(ordered)
        if start < end
    ]


def _reader(url: str, s3: dict[str, Any], tiercache: dict[str, Any], gate: Any, out: Any) -> None:
    gate.wait(timeout=120)
    opened = fsspec.open(url, "rb", s3=s3, tiercache=tiercache)  # the filesystem is built here
    digest = xxhash.xxh3_64()
    with opened as f:
        digest.update(f.read(FIRST_READ))
        while chunk := f.read(READ):
            digest.update(chunk)
    stats = opened.fs.stats()
    # No wait for the fetch: the process ends as soon as its reader has the bytes.
    out.put((os.getpid(), digest.hexdigest(), {name: stats[name] for name in _STATS}))


def _trial(
    ctx: Any, proxy: ByteCountingProxy, s3: Any, s3_client: Any, bucket: str, tier: Path, n: int
) -> str | None:
    """One herd; what went wrong, or None."""
    seed = random.randrange(1 << 32)
    data = random.Random(seed).randbytes(SIZE)
    key = f"herd-{n}.bin"
    s3_client.put_object(Bucket=bucket, Key=key, Body=data)
    s3_options = {**s3.target_options(), "endpoint_url": proxy.url}
    gate, out = ctx.Barrier(PROCESSES), ctx.Queue()
    args = (f"tiercache::s3://{bucket}/{key}", s3_options, {"local_dir": str(tier)}, gate, out)
    procs = [ctx.Process(target=_reader, args=args) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    results: list[tuple[int, str, dict[str, int]]] = []
    deadline = time.monotonic() + 180
    while len(results) < PROCESSES and time.monotonic() < deadline:
        if out.empty() and not any(p.is_alive() for p in procs):
            break  # a reader died without an answer
        if not out.empty():
            results.append(out.get())
        else:
            time.sleep(0.01)
    for p in procs:
        p.join(timeout=60)
    expected = xxhash.xxh3_64_hexdigest(data)
    sent, asked = proxy.sent(key), proxy.ranges(key, SIZE)
    twice = _asked_twice(asked)
    fetched = sum(stats["bytes_fetched"] for _, _, stats in results)
    exits = [p.exitcode for p in procs]
    if (
        exits == [0] * PROCESSES
        and [digest for _, digest, _ in results] == [expected] * PROCESSES
        and sent == SIZE
        and not twice
        and fetched == SIZE
    ):
        return None
    lines = [
        f"trial {n} (seed {seed}): store sent {sent} bytes ({sent / SIZE:.2f} objects), "
        f"processes fetched {fetched}; GETs asked for {asked}; asked twice: {twice}; "
        f"exit codes {exits}"
    ]
    for pid, digest, stats in results:
        lines.append(f"  pid {pid}: {'bytes ok' if digest == expected else 'WRONG BYTES'} {stats}")
    return "\n".join(lines)


@pytest.mark.parametrize("tier_state", ["fresh", "existing"])
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_herd_of_processes_fetches_the_object_once(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, start_method: str, tier_state: str
) -> None:
    ctx: Any = multiprocessing.get_context(start_method)
    failures = []
    with ByteCountingProxy(s3.endpoint) as proxy:
        for n in range(TRIALS):
            tier = tmp_path / f"tier-{n}"
            if tier_state == "existing":
                LocalTier(str(tier), 1 << 40)  # its directories, as a tier used before has
            failure = _trial(ctx, proxy, s3, s3_client, bucket, tier, n)
            if failure is not None:
                failures.append(failure)
    assert not failures, f"{len(failures)} of {TRIALS} trials failed:\n" + "\n".join(failures)


def _slow_publish_reader(url: str, s3: dict[str, Any], tiercache: dict[str, Any]) -> None:
    publish = LocalTier.publish

    def slow_publish(self: LocalTier, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)  # a loaded machine, a slow disk: the fetch thread is late
        return publish(self, *args, **kwargs)

    LocalTier.publish = slow_publish  # type: ignore[method-assign]
    with fsspec.open(url, "rb", s3=s3, tiercache=tiercache) as f:
        while f.read(READ):
            pass


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_process_that_read_an_object_and_exited_left_it_published(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, start_method: str
) -> None:
    data = os.urandom(SIZE)
    s3_client.put_object(Bucket=bucket, Key="shard.bin", Body=data)
    tier = tmp_path / "tier"
    ctx: Any = multiprocessing.get_context(start_method)
    url = f"tiercache::s3://{bucket}/shard.bin"
    reader = ctx.Process(
        target=_slow_publish_reader, args=(url, s3.target_options(), {"local_dir": str(tier)})
    )
    reader.start()
    reader.join(timeout=120)
    assert reader.exitcode == 0

    # The entry is published (data and meta), and nothing of the fetch is left over.
    metas = list(tier.glob("objects/*/*.meta"))
    assert metas, "the reader's process ended before its fetch published the object"
    meta = read_meta(str(metas[0]))
    assert meta is not None and meta.source == f"s3://{bucket}/shard.bin"
    assert metas[0].with_suffix(".data").read_bytes() == data
    assert list(tier.glob("objects/*/*.part")) == []
