"""One torture round: its tier, keys and history, the commands it sends to workers, and the
final flush and look at the store and at fresh filesystems on its tier."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torture_checker import Final, History, Op, Violation
from torture_workers import Message, Pool, Step, Worker

KiB, MiB = 1024, 1024 * 1024
FLUSH_TIMEOUT = 30.0  # a flush of a healthy store; a miss is reported, never waited out
FINAL_FLUSH_TIMEOUT = 60.0


@dataclass(frozen=True)
class Store:
    """The S3 server the round writes to (``server``: our private one, which can be paused)."""

    endpoint: str
    key: str
    secret: str
    region: str
    server: Any = None

    def as_dict(self) -> dict[str, str]:
        return {
            "endpoint": self.endpoint,
            "key": self.key,
            "secret": self.secret,
            "region": self.region,
        }


@dataclass
class Env:
    """What lives across rounds."""

    pool: Pool
    store: Store
    bucket: str
    workdir: str
    big: bool = False
    proxy: Any = None  # FaultProxy, built on first use


@dataclass
class Round:
    number: int
    scenario: str
    rng: random.Random
    env: Env
    history: History
    endpoint: str  # the endpoint tiercache is given: the server's, or a fault proxy's
    cli_share: float = 0.3  # how often the final flush is the ``tiercache flush`` CLI
    violations: list[Violation] = field(default_factory=list)
    _serial: int = 0

    @property
    def local_dir(self) -> str:
        return os.path.join(self.env.workdir, "tiers", f"r{self.number:05d}")

    def path(self, i: int) -> str:
        """Key ``i`` of this round (keys are fresh each round, so rounds are independent)."""
        path = f"{self.env.bucket}/r{self.number:05d}/k{i}"
        if path not in self.history.paths:
            self.history.paths.append(path)
        return path

    # -- steps ------------------------------------------------------------------------------

    def size(self, big_share: float = 0.0) -> int:
        roll = self.rng.random()
        if self.env.big and roll < big_share:
            return self.rng.randint(16 * MiB + 1, 18 * MiB)
        if roll < 0.35:
            return self.rng.randint(0, 256)
        if roll < 0.70:
            return self.rng.randint(1 * KiB, 64 * KiB)
        if roll < 0.95:
            return self.rng.randint(256 * KiB, 2 * MiB)
        return self.rng.randint(2 * MiB, 5 * MiB)

    def _op(self, kind: str, who: str, path: str) -> str:
        self._serial += 1
        uid = f"r{self.number}-{who}-{self._serial}"
        self.history.add(Op(uid=uid, kind=kind, path=path, who=who, sent=time.monotonic()))
        return uid

    def write(
        self,
        who: str,
        path: str,
        at: float | None = None,
        flush: float | None = None,
        size: int | None = None,
    ) -> Step:
        uid = self._op("write", who, path)
        size = self.size() if size is None else size
        self.history.ops[uid].size = size  # the body's; ``begin`` reports the whole version's
        return {"do": "write", "path": path, "uid": uid, "size": size, "at": at, "flush": flush}

    def rm(self, who: str, path: str, at: float | None = None, flush: float | None = None) -> Step:
        return {
            "do": "rm",
            "path": path,
            "uid": self._op("rm", who, path),
            "at": at,
            "flush": flush,
        }

    @staticmethod
    def read(path: str) -> Step:
        return {"do": "read", "path": path}

    @staticmethod
    def flush(path: str, timeout: float = FLUSH_TIMEOUT) -> Step:
        return {"do": "flush", "path": path, "timeout": timeout}

    @staticmethod
    def sleep(seconds: float) -> Step:
        return {"do": "sleep", "s": seconds}

    # -- driving workers -------------------------------------------------------------------

    def writers(self, n: int) -> list[Worker]:
        """``n`` writers with a filesystem on this round's tier."""
        workers = self.env.pool.take(n)
        cmd = {"op": "open", "local_dir": self.local_dir, "endpoint": self.endpoint}
        self.run([(w, cmd) for w in workers], timeout=60)
        return workers

    def start(self, assignments: list[tuple[Worker, dict[str, Any]]]) -> None:
        for worker, cmd in assignments:
            worker.uses += 1
            worker.send(cmd)

    def collect(
        self,
        workers: list[Worker],
        timeout: float,
        kills: dict[str, float] | None = None,
        kill_on_begin: dict[str, tuple[str, float]] | None = None,
    ) -> None:
        """Wait for the workers' commands to end; SIGKILL ``kills`` (name -> instant) and
        ``kill_on_begin`` (op uid -> (name, delay after its close began))."""
        kills = dict(kills or {})
        triggers = dict(kill_on_begin or {})

        def on_message(msg: Message) -> None:
            self.history.record(msg)
            if msg[0] == "begin" and msg[1] in triggers:
                name, delay = triggers.pop(msg[1])
                kills.setdefault(name, time.monotonic() + delay)

        deadline = time.monotonic() + timeout
        for problem in self.env.pool.collect(workers, deadline, on_message, kills):
            self.violations.append(Violation("worker-failed", problem, list(self.history.paths)))

    def run(self, assignments: list[tuple[Worker, dict[str, Any]]], timeout: float) -> None:
        self.start(assignments)
        self.collect([w for w, _ in assignments], timeout)

    @staticmethod
    def script(steps: list[Step]) -> dict[str, Any]:
        return {"op": "script", "steps": steps}

    @staticmethod
    def deadline_for(steps: list[Step]) -> float:
        """A bound on how long a script may take: its waits plus generous slack."""
        waits = sum(
            float(s.get("flush") or s.get("timeout") or s.get("s") or 0)
            + (20.0 if s["do"] in ("write", "rm", "read") else 0.0)
            for s in steps
        )
        return 30.0 + waits

    # -- the end of the round ----------------------------------------------------------------

    def finish(self) -> Final | None:
        """Flush through a process that never touched this tier (or the CLI), then look."""
        pool = self.env.pool
        paths = list(self.history.paths)
        how = "cli" if self.rng.random() < self.cli_share else "fs"
        flush, seconds = "ok", 0.0
        if how == "cli":
            flush, seconds = self._cli_flush()
        cmd = {
            "op": "check",
            "local_dir": self.local_dir,
            "endpoint": self.endpoint,
            "paths": paths,
            "flush": FINAL_FLUSH_TIMEOUT if how == "fs" else None,
        }
        pool.take(0)
        self.run([(pool.checker, cmd)], timeout=FINAL_FLUSH_TIMEOUT + 90)
        if not pool.checker.results:
            return None  # the checker hung or died: already a violation
        seen = pool.checker.results.pop()[1]
        pool.checker.results.clear()
        if how == "fs":
            flush, seconds = seen["flush"], seen["flush_s"]
        final = Final(
            how=how,
            flush=flush,
            seconds=seconds,
            store=dict(seen["store"]),
            tier=dict(seen["default"]),
            tier_immutable=dict(seen["immutable"]),
            pending=list(seen["pending"]),
            journal=list(seen["journal"]),
        )
        self.history.final = final
        return final

    def _cli_flush(self) -> tuple[str, float]:
        exe = Path(sys.executable).with_name("tiercache")
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "tiercache.cli"]
        argv += ["flush", "--local-dir", self.local_dir, "--endpoint-url", self.endpoint]
        argv += ["--region", self.env.store.region, "--timeout", str(FINAL_FLUSH_TIMEOUT)]
        env = dict(os.environ)
        env |= {
            "AWS_ACCESS_KEY_ID": self.env.store.key,
            "AWS_SECRET_ACCESS_KEY": self.env.store.secret,
            "TIERCACHE_EXIT_FLUSH_TIMEOUT": "2",
        }
        start = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=FINAL_FLUSH_TIMEOUT + 60,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return "hung: tiercache flush did not exit", time.monotonic() - start
        seconds = time.monotonic() - start
        if done.returncode == 0:
            return "ok", seconds
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return f"exit {done.returncode}: {' | '.join(tail)}", seconds
