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

from s3server import S3Endpoint
from torture_checker import Final, History, Op, Violation
from torture_workers import Message, Pool, Step, Worker

KiB, MiB = 1024, 1024 * 1024
FLUSH_TIMEOUT = 30.0  # a flush of a healthy store; a miss is reported, never waited out
FINAL_FLUSH_TIMEOUT = 60.0
SIDECAR_AGE = 60.0  # seconds the multipart sidecars are made older (reconcile's grace: 10)
UPLOADS_SETTLE = 5.0  # seconds live processes get to abort uploads they no longer need


@dataclass(frozen=True)
class Store(S3Endpoint):
    """The S3 server the round writes to (``server``: our private one, which can be paused)."""

    server: Any = None

    def endpoint_only(self) -> S3Endpoint:
        """The endpoint without the server handle: what the worker processes are sent."""
        return S3Endpoint(self.endpoint, self.key, self.secret, self.region)


@dataclass
class Env:
    """What lives across rounds."""

    pool: Pool
    store: Store
    bucket: str
    workdir: str
    big: bool = False
    proxy: Any = None  # FaultProxy, built on first use
    cephfs: Any = None  # the CephFS cluster of host_loss rounds (support.cephfs_hosts.CephFS)
    cephfs_dir: str = "torture"  # where on its mounts the rounds' shared tiers go


@dataclass
class Round:
    number: int
    scenario: str
    rng: random.Random
    env: Env
    history: History
    endpoint: str  # the endpoint tiercache is given: the server's, or a fault proxy's
    cli_share: float = 0.3  # how often the final flush is the ``tiercache flush`` CLI
    check_uploads: bool = False  # after the final look: fsck, then no multipart upload open
    violations: list[Violation] = field(default_factory=list)
    uploads: dict[str, Any] | None = None  # what the uploads check saw
    workers: list[Worker] = field(default_factory=list)  # the writers it took
    # The final flush and look: extra options (a shared tier, another host) and their local
    # tier (default: the round's); the journal looked at (default: the local tier's).
    check_options: dict[str, Any] = field(default_factory=dict)
    check_local_dir: str | None = None
    check_journal: str | None = None
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

    def chunked_write(
        self,
        who: str,
        path: str,
        size: int,
        chunks: list[int],
        pauses: list[float],
        start_at: float | None = None,
        flush: float | None = None,
        drop_at: int | None = None,
    ) -> Step:
        """A write in ``chunks`` (sleeping ``pauses`` after each), opened at ``start_at``;
        with ``drop_at`` dropped inside its ``with`` block after that many bytes."""
        if drop_at is None:
            step = self.write(who, path, flush=flush, size=size)
        else:
            self._serial += 1
            uid = f"r{self.number}-{who}-{self._serial}-dropped"
            op = Op(uid=uid, kind="write", path=path, who=who, sent=time.monotonic(), size=size)
            self.history.add_dropped(op)
            step = {"do": "write", "path": path, "uid": uid, "size": size, "drop_at": drop_at}
        return {**step, "chunks": chunks, "pauses": pauses, "start_at": start_at}

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

    def writers(self, n: int, options: dict[str, Any] | None = None) -> list[Worker]:
        """``n`` writers with a filesystem on this round's tier (built with ``options``)."""
        workers = self.env.pool.take(n)
        self.workers += [w for w in workers if w not in self.workers]
        cmd = {
            "op": "open",
            "local_dir": self.local_dir,
            "endpoint": self.endpoint,
            "options": dict(options or {}),
        }
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
            + sum(s.get("pauses") or [])
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
        local_dir = self.check_local_dir or self.local_dir
        cmd = {
            "op": "check",
            "local_dir": local_dir,
            "endpoint": self.endpoint,
            "paths": paths,
            "flush": FINAL_FLUSH_TIMEOUT if how == "fs" else None,
            "options": self.check_options,
            "journal": self.check_journal or os.path.join(local_dir, "journal"),
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
        if self.check_uploads:
            self._check_uploads(final)
            alive = [w for w in self.workers if not w.dead]  # their uploads are over by now
            self.run([(w, self.script([{"do": "stats"}])) for w in alive], timeout=30)
        return final

    def _check_uploads(self, final: Final) -> None:
        """Once reconcile ran (``fsck`` from a fresh filesystem, every sidecar made older than
        its grace), no multipart upload of this round may be open: a dropped, superseded or
        finished upload was aborted or completed by its process, a dead writer's is aborted
        from its sidecar. An upload with no part and no sidecar is the one a writer killed
        between CreateMultipartUpload and writing its sidecar leaves (S3 cannot help that)."""
        pool = self.env.pool
        prefix = f"r{self.number:05d}/"
        cmd = {
            "op": "uploads",
            "local_dir": self.local_dir,
            "endpoint": self.endpoint,
            "bucket": self.env.bucket,
            "prefix": prefix,
            "age": SIDECAR_AGE,
            "settle": UPLOADS_SETTLE,
        }
        pool.take(0)
        self.run([(pool.checker, cmd)], timeout=UPLOADS_SETTLE + 90)
        if not pool.checker.results:
            return  # the checker hung or died: already a violation
        seen = pool.checker.results.pop()[1]
        pool.checker.results.clear()
        self.uploads = seen
        found: list[Violation] = []
        if seen["error"] is not None:
            found.append(Violation("fsck-failed", seen["error"], list(self.history.paths)))
        sidecars = {row.get("upload_id"): row for row in seen["sidecars"]}
        for upload in seen.get("open", []):
            path = f"{self.env.bucket}/{upload['key']}"
            sidecar = sidecars.get(upload["upload_id"])
            parts = upload["parts"]
            what = (
                f"multipart upload {upload['upload_id']} of {path} (initiated "
                f"{upload['initiated']}, parts {parts or 'none'}) is still open after fsck "
                f"({seen['passes']} passes over {seen['settled_s']:.1f}s: "
                f"{_fsck_counts(seen['fsck'])}); open before fsck: {len(seen['before'])}; "
                f"{self._sidecar_words(sidecar)}"
            )
            dropped = (d for d in self.history.dropped.values() if d.path == path)
            killed = any(not o.acked for o in self.history.ops_on(path)) or any(
                d.ret is None
                for d in dropped  # killed while writing what it was to drop
            )
            if sidecar is None and not parts and killed:
                self.history.soft.append(f"{what} (a writer killed before its sidecar?)")
                continue
            found.append(Violation("multipart-left-open", what, [path]))
        if final.flush != "ok":  # live uploads may still be due: reported, not counted
            self.history.soft += [f"{v.kind}: {v.message} (final flush failed)" for v in found]
            return
        self.violations += found

    def _sidecar_words(self, sidecar: dict[str, Any] | None) -> str:
        if sidecar is None:
            return "no sidecar in the staging area names it"
        owner_pid = sidecar["name"].split(".")[1] if sidecar["name"].count(".") >= 3 else "?"
        names = self.env.pool.names
        owner = names.get(int(owner_pid), "?") if owner_pid.isdigit() else "?"
        locked = sidecar.get("locked_by")
        held = (
            "unlocked" if locked is None else f"locked by pid {locked} ({names.get(locked, '?')})"
        )
        return (
            f"its sidecar staging/{sidecar['name']} (writer pid {owner_pid} = {owner}, "
            f"{sidecar.get('age_s', '?')}s old after aging) is {held}"
        )

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


def _fsck_counts(passes: list[dict[str, Any]]) -> str:
    aborted = sum(p["multipart_aborted"] for p in passes)
    removed = sum(p["leftovers_removed"] for p in passes)
    return f"{aborted} multipart aborted, {removed} leftovers removed"
