"""The torture scenarios: each drives one round's workers; the harness then checks the round.

Every choice comes from the round's seeded ``rng``; only the timing is left to the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torture_checker import Violation
from torture_round import FLUSH_TIMEOUT, MiB, Round
from torture_workers import Step, Worker

CLOSE_LIMIT = 10.0  # seconds a write-behind close() may take while the store is frozen
LEAD = 0.25  # seconds between sending a script and its aligned start
# The writers of ``stream``: parts of 5 MiB go to the store while a file is written.
STREAM_OPTIONS = {"part_size": 5 * MiB, "upload_while_writing": "on"}


def overlap(rnd: Round) -> None:
    """Two processes on one tier overwrite one key at the same instant, then flush it."""
    rng = rnd.rng
    a, b = rnd.writers(2)
    path = rnd.path(0)
    if rng.random() < 0.5:  # an older version that must not come back
        first = [rnd.write(a.name, path, flush=FLUSH_TIMEOUT)]
        rnd.run([(a, rnd.script(first))], rnd.deadline_for(first))
    at = time.monotonic() + LEAD
    jitter = rng.choice([0.0, 0.0, 0.0005, 0.002, 0.01])
    scripts: list[tuple[Worker, list[Step]]] = []
    for worker in (a, b):
        when = at + rng.uniform(0, jitter)
        steps = [rnd.write(worker.name, path, at=when, flush=FLUSH_TIMEOUT)]
        if rng.random() < 0.3:
            steps.append(rnd.read(path))
        scripts.append((worker, steps))
    rnd.run([(w, rnd.script(s)) for w, s in scripts], max(rnd.deadline_for(s) for _, s in scripts))


def _random_steps(
    rnd: Round, who: str, paths: list[str], count: int, at: float, kinds: str = "wwwwrdf"
) -> list[Step]:
    """``count`` random operations; the first starts at ``at``."""
    rng = rnd.rng
    steps: list[Step] = []
    for i in range(count):
        path = rng.choice(paths)
        when = at if i == 0 else None
        kind = rng.choice(kinds)
        flush = FLUSH_TIMEOUT if rng.random() < 0.4 else None
        if kind == "w":
            steps.append(rnd.write(who, path, at=when, flush=flush, size=rnd.size(0.03)))
        elif kind == "d":
            steps.append(rnd.rm(who, path, at=when, flush=flush))
        elif kind == "r":
            steps.append({**rnd.read(path), "at": when})
        else:
            steps.append({**rnd.flush(path), "at": when})
        if rng.random() < 0.3:
            steps.append(rnd.sleep(rng.uniform(0, 0.03)))
    return steps


def threads(rnd: Round) -> None:
    """Several threads of one process write, delete and read 1-3 keys, flushing sometimes."""
    rng = rnd.rng
    (worker,) = rnd.writers(1)
    paths = [rnd.path(i) for i in range(rng.randint(1, 3))]
    at = time.monotonic() + LEAD
    scripts = [
        _random_steps(rnd, f"{worker.name}.t{t}", paths, rng.randint(1, 4), at)
        for t in range(rng.randint(2, 6))
    ]
    deadline = sum(rnd.deadline_for(s) for s in scripts)
    rnd.run([(worker, {"op": "threads", "scripts": scripts})], deadline)


def kill(rnd: Round) -> None:
    """2-4 processes on 2-3 keys; some are SIGKILLed before, during or after a close()."""
    rng = rnd.rng
    rnd.cli_share = 0.5
    rnd.check_uploads = True  # a big write streams a part while written
    workers = rnd.writers(rng.randint(2, 4))
    paths = [rnd.path(i) for i in range(rng.randint(2, 3))]
    at = time.monotonic() + LEAD
    scripts = {w: _random_steps(rnd, w.name, paths, rng.randint(3, 6), at) for w in workers}
    victims = rng.sample(workers, rng.randint(1, len(workers) - 1))
    kills: dict[str, float] = {}
    kill_on_begin: dict[str, tuple[str, float]] = {}
    for victim in victims:
        closes = [s["uid"] for s in scripts[victim] if s["do"] == "write"]
        if closes and rng.random() < 0.5:  # during a close(): right after it began
            kill_on_begin[rng.choice(closes)] = (victim.name, rng.uniform(0, 0.004))
        else:  # anywhere: before, during or after the closes and their uploads
            kills[victim.name] = at + rng.uniform(-0.1, 0.6)
    rnd.start([(w, rnd.script(s)) for w, s in scripts.items()])
    deadline = max(rnd.deadline_for(s) for s in scripts.values())
    rnd.collect(workers, deadline, kills=kills, kill_on_begin=kill_on_begin)


def freeze(rnd: Round) -> None:
    """The server is SIGSTOPped while writers write: close() still returns, flush() must not."""
    rng = rnd.rng
    server = rnd.env.store.server
    workers = rnd.writers(rng.randint(1, 2))
    paths = [rnd.path(i) for i in range(rng.randint(1, 2))]
    if rng.random() < 0.5:
        _frozen_from_the_start(rnd, workers, paths)
        return
    # Frozen for a while in the middle of the uploads; flushes outlast the freeze.
    at = time.monotonic() + LEAD
    scripts = {w: _random_steps(rnd, w.name, paths, rng.randint(1, 3), at, "wwwf") for w in workers}
    rnd.start([(w, rnd.script(s)) for w, s in scripts.items()])
    time.sleep(LEAD + rng.uniform(0, 0.3))
    server.pause()
    try:
        time.sleep(rng.uniform(0.5, 2.5))
    finally:
        server.resume()
    rnd.collect(workers, max(rnd.deadline_for(s) for s in scripts.values()))


def _frozen_from_the_start(rnd: Round, workers: list[Worker], paths: list[str]) -> None:
    rng = rnd.rng
    server = rnd.env.store.server
    scripts: dict[Worker, list[Step]] = {}
    for worker in workers:
        steps: list[Step] = []
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(paths)
            steps.append(rnd.write(worker.name, path))
            if rng.random() < 0.6:
                steps.append({**rnd.flush(path, rng.uniform(0.2, 1.0)), "look": False})
        if not any(s["do"] == "flush" for s in steps):
            steps.append({**rnd.flush(steps[-1]["path"], 0.5), "look": False})
        scripts[worker] = steps
    server.pause()
    try:
        rnd.run([(w, rnd.script(s)) for w, s in scripts.items()], 60)
    finally:
        server.resume()
    for flush in rnd.history.flushes:
        ops = rnd.history.ops_on(flush.path)
        if flush.ok and any(o.start is not None and o.start < flush.start for o in ops):
            rnd.violations.append(
                Violation(
                    "flush-while-frozen",
                    f"{flush.who} flush({flush.path}) returned ok while the store was frozen",
                    [flush.path],
                )
            )
    for op in rnd.history.ops.values():
        if op.start is not None and op.ret is not None and op.ret - op.start > CLOSE_LIMIT:
            rnd.violations.append(
                Violation(
                    "close-blocked",
                    f"{op.who} close() of {op.uid} took {op.ret - op.start:.1f}s, frozen store",
                    [op.path],
                )
            )


def faults(rnd: Round) -> None:
    """Writers behind a FaultProxy: 5xx, resets (before and after the store acted),
    truncated answers and slow responses; every flush must still tell the truth."""
    rng = rnd.rng
    proxy = rnd.env.proxy
    proxy.clear()
    scope = f"r{rnd.number:05d}/"
    for _ in range(rng.randint(1, 3)):
        rule = rng.choice(["fail", "reset", "reset-after", "truncate", "slow"])
        method = rng.choice(["PUT", "PUT", "POST", "HEAD", "GET"])
        n, skip = rng.randint(1, 6), rng.randint(0, 2)  # 3+ outlasts the client retries
        if rule == "fail":
            status = rng.choice([500, 503])
            proxy.fail_next(n, status, method=method, path_contains=scope, skip=skip)
        elif rule in ("reset", "reset-after"):
            forward = rule == "reset-after"
            proxy.reset_next(n, forward=forward, method=method, path_contains=scope, skip=skip)
        elif rule == "truncate":
            after, hold = rng.randint(0, 64), rng.uniform(0, 0.5)
            proxy.truncate_next(n, after, hold=hold, method=method, path_contains=scope)
        else:
            proxy.delay(rng.choice([0.02, 0.1, 0.3]))  # below read_timeout: no reordering
    workers = rnd.writers(rng.randint(1, 2))
    paths = [rnd.path(i) for i in range(rng.randint(1, 2))]
    at = time.monotonic() + LEAD
    scripts = {w: _random_steps(rnd, w.name, paths, rng.randint(2, 4), at) for w in workers}
    try:
        rnd.run(
            [(w, rnd.script(s)) for w, s in scripts.items()],
            max(rnd.deadline_for(s) for s in scripts.values()),
        )
    finally:
        proxy.clear()


def stream(rnd: Round) -> None:
    """1-3 processes write 6-16 MiB to 1-2 keys in chunks, with pauses, so that 5 MiB parts go
    to the store while they write; writers overlap on a key, some writes are dropped (raise
    inside their ``with``), some writers are SIGKILLed while writing, in close() or after.
    Then, besides the usual checks, no multipart upload may stay open once reconcile ran."""
    rng = rnd.rng
    rnd.cli_share = 0.5
    rnd.check_uploads = True
    workers = rnd.writers(rng.randint(1, 3), STREAM_OPTIONS)
    paths = [rnd.path(i) for i in range(rng.randint(1, 2))]
    at = time.monotonic() + LEAD
    scripts = {w: _stream_steps(rnd, w.name, paths, rng.randint(1, 3), at) for w in workers}
    kills: dict[str, float] = {}
    kill_on_begin: dict[str, tuple[str, float]] = {}
    if rng.random() < 0.6:
        for victim in rng.sample(workers, rng.randint(1, len(workers))):
            steps = scripts[victim]
            closes = [s["uid"] for s in steps if s["do"] == "write" and "drop_at" not in s]
            if closes and rng.random() < 0.35:  # in close(): right after it began
                kill_on_begin[rng.choice(closes)] = (victim.name, rng.uniform(0, 0.02))
            else:  # while writing (parts in flight), in close(), or after (uploads running)
                kills[victim.name] = at + rng.uniform(0, 1.2 * _busy(steps) + 0.3)
    rnd.start([(w, rnd.script(s)) for w, s in scripts.items()])
    deadline = max(rnd.deadline_for(s) for s in scripts.values())
    rnd.collect(workers, deadline, kills=kills, kill_on_begin=kill_on_begin)


def _stream_steps(rnd: Round, who: str, paths: list[str], count: int, at: float) -> list[Step]:
    """``count`` chunked writes of 6-16 MiB (some dropped), now and then a small write, a
    delete, a read or a flush; the first opens its file at ``at``."""
    rng = rnd.rng
    steps: list[Step] = []
    for i in range(count):
        path = rng.choice(paths)
        when = at if i == 0 else None
        flush = FLUSH_TIMEOUT if rng.random() < 0.4 else None
        roll = rng.random()
        if roll < 0.1 and i > 0:  # a small version superseding a streamed one
            steps.append(rnd.write(who, path, flush=flush))
        elif roll < 0.15 and i > 0:
            steps.append(rnd.rm(who, path, flush=flush))
        else:
            size = rng.randint(6 * MiB, 16 * MiB)
            chunks, pauses = _chunk_plan(rnd, size)
            drop_at = rng.randint(1 * MiB, size + 1024) if rng.random() < 0.2 else None
            steps.append(
                rnd.chunked_write(who, path, size, chunks, pauses, when, flush, drop_at=drop_at)
            )
        if rng.random() < 0.15:
            steps.append(rnd.read(path))
        if rng.random() < 0.3:
            steps.append(rnd.sleep(rng.uniform(0, 0.2)))
    return steps


def _chunk_plan(rnd: Round, size: int) -> tuple[list[int], list[float]]:
    """Writes of 256 KiB-2 MiB covering ``size`` bytes (and the version's header), a short
    sleep after about a third of them."""
    rng = rnd.rng
    chunks: list[int] = []
    pauses: list[float] = []
    total = 0
    while total < size + 1024:
        chunks.append(rng.randint(256 * 1024, 2 * MiB))
        pauses.append(rng.uniform(0.005, 0.06) if rng.random() < 0.35 else 0.0)
        total += chunks[-1]
    return chunks, pauses


def _busy(steps: list[Step]) -> float:
    """About how long a script runs, flushes aside: its sleeps and pauses, a bit per write."""
    return sum(
        float(s.get("s") or 0) + sum(s.get("pauses") or []) + (0.15 if s["do"] == "write" else 0)
        for s in steps
    )


def host_loss(rnd: Round) -> None:
    """2-3 processes of host A write behind through a shared tier on CephFS (``write_tier=
    "shared"``), on 1-3 keys, with reads, deletes and flushes; host A is lost at a random
    instant (its processes SIGKILLed, its ceph-fuse killed, its session evicted). The final
    flush runs on host B, whose process never touched the tier, through its own mount."""
    rng = rnd.rng
    cephfs = rnd.env.cephfs
    here = f"{rnd.env.cephfs_dir}/r{rnd.number:05d}"
    shared = {"write_tier": "shared", "lease_stale_after": 2.0}
    host_a = {**shared, "host_id": "hostA", "shared_dir": str(cephfs.mount("hostA") / here)}
    rnd.cli_share = 0.0  # the final flush needs host B's shared tier options
    rnd.check_options = {
        **shared,
        "host_id": "hostB",
        "shared_dir": str(cephfs.mount("hostB") / here),
    }
    rnd.check_local_dir = rnd.local_dir + "-hostB"
    rnd.check_journal = str(cephfs.mount("hostB") / here / "journal")
    workers = rnd.writers(rng.randint(2, 3), host_a)
    paths = [rnd.path(i) for i in range(rng.randint(1, 3))]
    at = time.monotonic() + LEAD
    scripts = {w: _random_steps(rnd, w.name, paths, rng.randint(3, 6), at) for w in workers}
    lost_at = at + rng.uniform(0.0, 0.8)
    rnd.start([(w, rnd.script(s)) for w, s in scripts.items()])
    deadline = max(rnd.deadline_for(s) for s in scripts.values())
    rnd.collect(workers, deadline, kills={w.name: lost_at for w in workers})
    cephfs.crash("hostA")
    cephfs.remount("hostA")  # the host comes back empty-handed: its processes are gone


SCENARIOS: dict[str, Callable[[Round], None]] = {
    "overlap": overlap,
    "threads": threads,
    "kill": kill,
    "freeze": freeze,
    "faults": faults,
    "stream": stream,
    "host_loss": host_loss,
}
WEIGHTS = {
    "overlap": 6.0,
    "threads": 1.0,
    "kill": 1.2,
    "freeze": 0.8,
    "faults": 1.0,
    "stream": 1.5,
    "host_loss": 1.0,
}
