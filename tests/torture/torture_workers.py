"""Long-lived worker processes for the write torture: they write, delete, read and flush on
command and report every step, with CLOCK_MONOTONIC times, back through a pipe.

A worker runs one command at a time: ``open`` (build the filesystem of a round), ``script``
(steps one after another), ``threads`` (several scripts at once on one filesystem), ``check``
(the final look at a local tier through fresh filesystems), ``uploads`` (``fsck``, then the
multipart uploads still open in the store) or ``exit``. A write step may write in ``chunks``
with ``pauses`` (so parts are streamed while it writes), and with ``drop_at`` raises inside
its ``with`` block after that many bytes: a dropped write, reported as ``dropped``. Steps
report as they happen, so a worker the harness SIGKILLs has already reported what it
acknowledged; a step whose ``begin`` arrived without its ``done`` is in doubt. Every version
written is self-describing (see ``make_content``), so whoever reads it can name it and
verify it.
"""

from __future__ import annotations

import gc
import glob
import hashlib
import itertools
import json
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from s3server import S3Endpoint

MAGIC = b"TCTORTURE1"
_command_ids = itertools.count(1)
ABSENT = "<absent>"
Message = tuple[Any, ...]
Step = dict[str, Any]

# --------------------------------------------------------------------------- versions


def make_content(uid: str, size: int) -> bytes:
    """A version: ``MAGIC uid size sha256(body)\\n`` then ``size`` random bytes."""
    body = os.urandom(size)
    head = b"%s %s %d %s\n" % (MAGIC, uid.encode(), size, hashlib.sha256(body).hexdigest().encode())
    return head + body


def identify(data: bytes) -> str:
    """The uid of a version read back, or ``corrupt: ...`` when it is not one whole version."""
    head, newline, body = data.partition(b"\n")
    parts = head.split(b" ")
    if not newline or len(parts) != 4 or parts[0] != MAGIC or not parts[2].isdigit():
        return f"corrupt: no version header ({len(data)} bytes, starts {data[:24]!r})"
    uid, size, digest = parts[1].decode(), int(parts[2]), parts[3].decode()
    if len(body) != size:
        return f"corrupt: {uid} holds {len(body)} of its {size} bytes"
    if hashlib.sha256(body).hexdigest() != digest:
        return f"corrupt: {uid} body does not match its digest"
    return uid


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


# --------------------------------------------------------------------------- the process


class _Worker:
    """The child side: one filesystem (per round) and the steps run on it."""

    def __init__(self, conn: Connection, name: str, store: S3Endpoint) -> None:
        self.conn = conn
        self.name = name
        self.store = store  # the real server: boto3 reads the truth from it, never a proxy
        self.fs: Any = None
        self._send_lock = threading.Lock()
        self._s3: Any = None
        self.streamed_parts = 0  # parts sent while their file was written, since ``open``

    def send(self, msg: Message) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def build(self, local_dir: str, endpoint: str, **options: Any) -> Any:
        from tiercache import TierCacheFileSystem

        return TierCacheFileSystem(
            target_options={**self.store.target_options(), "endpoint_url": endpoint},
            local_dir=local_dir,
            skip_instance_cache=True,
            retries=2,
            connect_timeout=1,
            read_timeout=2,
            **options,
        )

    def drop(self) -> None:
        """Forget the filesystem; its runtime goes with the last reference (it is weak)."""
        self.fs = None
        gc.collect()

    def stored(self, path: str) -> str:
        """What the store holds at ``path`` right now, read with boto3 from the real server."""
        if self._s3 is None:
            self._s3 = self.store.client(
                connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}
            )
        bucket, _, key = path.partition("/")
        try:
            return identify(self._s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except self._s3.exceptions.NoSuchKey:
            return ABSENT
        except Exception as exc:
            return f"error: {_describe(exc)}"

    # -- steps -----------------------------------------------------------------------------

    def run_steps(self, steps: list[Step], who: str) -> None:
        for step in steps:
            getattr(self, f"step_{step['do']}")(step, who)

    def step_sleep(self, step: Step, who: str) -> None:
        time.sleep(step["s"])

    def step_stats(self, step: Step, who: str) -> None:
        """Report how much went through multipart uploads on this round's filesystem."""
        stats = self.fs.stats()
        requests = stats.get("store_requests", {})
        counters = {
            "parts_streamed_before_close": self.streamed_parts,
            "uploads_streamed": stats.get("uploads_streamed", 0),
            "streams_restarted": stats.get("streams_restarted", 0),
            "multipart_created": requests.get("CreateMultipartUpload", 0),
            "multipart_aborted": requests.get("AbortMultipartUpload", 0),
        }
        self.send(("stats", who, counters))

    def step_write(self, step: Step, who: str) -> None:
        uid = step["uid"]
        data = make_content(uid, step["size"])
        digest = hashlib.sha256(data).hexdigest()
        if step.get("drop_at") is not None:
            self._dropped_write(step, data)
            return
        f = None
        try:
            _sleep_until(step.get("start_at"))
            f = self.fs.open(step["path"], "wb")
            _write_chunks(f, data, step)
        except Exception as exc:  # never got to close(): reported as failed, not begun
            if f is not None:
                _discard(f)
            self.send(("done", uid, None, time.monotonic(), _describe(exc)))
            return
        _sleep_until(step.get("at"))
        # Parts already handed to a multipart upload while the file was written (a look at
        # tiercache's internals, for the round's counters only).
        self.streamed_parts += getattr(getattr(f, "_stream", None), "streamed_parts", 0) or 0
        start = time.monotonic()
        self.send(("begin", uid, start, digest, len(data)))
        error = None
        try:
            f.close()
        except Exception as exc:
            error = _describe(exc)
        returned = time.monotonic()
        # Where this write committed among the key's writes (write-behind only; None else).
        generation = (getattr(f, "info", None) or {}).get("generation") if error is None else None
        self.send(("done", uid, start, returned, error, generation))
        if step.get("flush") is not None:
            self.step_flush({"path": step["path"], "timeout": step["flush"]}, who)

    def _dropped_write(self, step: Step, data: bytes) -> None:
        """Write the first ``drop_at`` bytes in chunks, then raise inside the ``with``: the
        file is discarded, and nothing of it (streamed parts included) may ever land."""
        _sleep_until(step.get("start_at"))
        start = time.monotonic()
        written, error = 0, None
        try:
            with self.fs.open(step["path"], "wb") as f:
                written = _write_chunks(f, data, step, stop_at=step["drop_at"])
                raise _DroppedError
        except _DroppedError:
            pass
        except Exception as exc:  # failed on its own: not committed either
            error = _describe(exc)
        self.send(("dropped", step["uid"], start, time.monotonic(), written, error))

    def step_rm(self, step: Step, who: str) -> None:
        uid = step["uid"]
        _sleep_until(step.get("at"))
        start = time.monotonic()
        self.send(("begin", uid, start, "", 0))
        error = None
        try:
            self.fs.rm(step["path"])
        except FileNotFoundError:
            pass  # nothing to delete: the key is absent all the same
        except Exception as exc:
            error = _describe(exc)
        self.send(("done", uid, start, time.monotonic(), error))
        if step.get("flush") is not None:
            self.step_flush({"path": step["path"], "timeout": step["flush"]}, who)

    def step_flush(self, step: Step, who: str) -> None:
        path = step["path"]
        start = time.monotonic()
        ok, error = True, None
        try:
            self.fs.flush(path, timeout=step["timeout"])
        except Exception as exc:  # any exception: the flush did not say "done"
            ok, error = False, _describe(exc)
        returned = time.monotonic()
        seen = self.stored(path) if ok and step.get("look", True) else ""
        self.send(("flushed", who, path, start, returned, ok, error, seen, time.monotonic()))

    def step_read(self, step: Step, who: str) -> None:
        _sleep_until(step.get("at"))
        start = time.monotonic()
        try:
            result = identify(self.fs.cat_file(step["path"]))
        except FileNotFoundError:
            result = ABSENT
        except Exception as exc:
            result = f"error: {_describe(exc)}"
        self.send(("read", who, step["path"], start, time.monotonic(), result))

    # -- commands ----------------------------------------------------------------------------

    def command(self, cmd: dict[str, Any]) -> None:
        op = cmd["op"]
        if op == "open":
            self.drop()
            self.streamed_parts = 0
            self.fs = self.build(cmd["local_dir"], cmd["endpoint"], **cmd.get("options", {}))
        elif op == "drop":
            self.drop()
        elif op == "script":
            self.run_steps(cmd["steps"], self.name)
        elif op == "threads":
            self.run_threads(cmd["scripts"])
        elif op == "check":
            self.send(("check", self.check(cmd)))
        elif op == "uploads":
            self.send(("check", self.uploads(cmd)))
        else:
            raise ValueError(f"unknown command {op!r}")

    def run_threads(self, scripts: list[list[Step]]) -> None:
        errors: list[str] = []

        def run(i: int) -> None:
            try:
                self.run_steps(scripts[i], f"{self.name}.t{i}")
            except Exception:
                errors.append(traceback.format_exc())

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(scripts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError("a thread failed:\n" + "\n".join(errors))

    def check(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Flush (optionally), then look through a fresh filesystem of each consistency."""
        local_dir, endpoint, paths = cmd["local_dir"], cmd["endpoint"], cmd["paths"]
        extra = cmd.get("options", {})
        result: dict[str, Any] = {"flush": None}
        self.drop()
        if cmd["flush"] is not None:
            fs = self.build(local_dir, endpoint, **extra)
            start = time.monotonic()
            try:
                fs.flush("", timeout=cmd["flush"])
                result["flush"] = "ok"
            except Exception as exc:
                result["flush"] = _describe(exc)
            result["flush_s"] = time.monotonic() - start
            del fs
            self.drop()
        result["store"] = {path: self.stored(path) for path in paths}
        for consistency in ("default", "immutable"):
            options = {} if consistency == "default" else {"consistency": "immutable"}
            fs = self.build(local_dir, endpoint, **extra, **options)
            if consistency == "default":
                result["pending"] = sorted(str(p["name"]) for p in fs.pending())
            result[consistency] = {path: _read(fs, path) for path in paths}
            del fs
            self.drop()
        journal = cmd.get("journal") or os.path.join(local_dir, "journal")
        result["journal"] = sorted(
            os.path.basename(p) for p in glob.glob(os.path.join(journal, "*.json"))
        )
        return result

    def uploads(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Make the tier's multipart sidecars look old (reconcile spares younger ones: their
        writer may not hold its lock yet), ``fsck`` from a fresh filesystem, and list the
        multipart uploads still open under ``prefix``; again for ``settle`` seconds while a
        sidecar names one of them (a live process aborts the uploads it no longer needs on
        its next scan; an upload no sidecar names has no owner left to abort it)."""
        local_dir, bucket, prefix = cmd["local_dir"], cmd["bucket"], cmd["prefix"]
        staging = os.path.join(os.path.realpath(local_dir), "staging")
        result: dict[str, Any] = {"error": None, "fsck": [], "passes": 0}
        self.drop()
        result["before"] = self.open_uploads(bucket, prefix)
        result["sidecars_before"] = _sidecars(staging)
        fs = self.build(local_dir, cmd["endpoint"])
        start = time.monotonic()
        deadline = start + cmd["settle"]
        while True:
            result["passes"] += 1
            _age_sidecars(staging, cmd["age"])
            try:
                report = fs.fsck(scrub=cmd.get("scrub", False))
            except Exception:
                result["error"] = traceback.format_exc()
                break
            keep = ("multipart_aborted", "leftovers_removed", "lost", "repaired", "corrupt_evicted")
            result["fsck"].append({k: report[k] for k in keep})
            result["open"] = self.open_uploads(bucket, prefix)
            named = {row.get("upload_id") for row in _sidecars(staging)}
            if not any(u["upload_id"] in named for u in result["open"]):
                break  # only a sidecar's owner (alive: it holds the lock) may still abort one
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        result["settled_s"] = time.monotonic() - start
        result["sidecars"] = _sidecars(staging)
        del fs
        self.drop()
        return result

    def open_uploads(self, bucket: str, prefix: str) -> list[dict[str, Any]]:
        """The multipart uploads open under ``bucket/prefix``, with their parts."""
        self.stored(f"{bucket}/")  # builds the client
        s3 = self._s3
        found = []
        pages = s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for upload in page.get("Uploads", []):
                key, upload_id = upload["Key"], upload["UploadId"]
                try:
                    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)
                    parts = [(p["PartNumber"], p["Size"]) for p in listed.get("Parts", [])]
                except Exception as exc:  # gone meanwhile (or the listing failed)
                    parts = [(-1, _describe(exc))]
                initiated = upload.get("Initiated")
                found.append(
                    {
                        "key": key,
                        "upload_id": upload_id,
                        "initiated": initiated.isoformat() if initiated is not None else "?",
                        "parts": parts,
                    }
                )
        return found


def _sidecars(staging: str) -> list[dict[str, Any]]:
    """The multipart sidecars in a staging area: what each names, and who holds its lock."""
    holders = _flock_holders()
    found = []
    for path in sorted(glob.glob(os.path.join(staging, "*.mpu"))):
        row: dict[str, Any] = {"name": os.path.basename(path)}
        try:
            with open(path, "rb") as f:
                row |= json.loads(f.read() or b"{}")
                st = os.fstat(f.fileno())
                row["age_s"] = round(time.time() - st.st_mtime, 1)
                row["locked_by"] = holders.get(
                    (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
                )
        except (OSError, ValueError) as exc:
            row["error"] = _describe(exc)
        found.append(row)
    return found


def _flock_holders() -> dict[tuple[int, int, int], int]:
    """(device major, minor, inode) -> pid of each FLOCK lock held (``/proc/locks``)."""
    holders = {}
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return holders
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[0].endswith("->"):
            continue
        try:
            major, minor, inode = fields[5].split(":")
            holders[(int(major, 16), int(minor, 16), int(inode))] = int(fields[4])
        except ValueError:
            continue
    return holders


def _age_sidecars(staging: str, seconds: float) -> None:
    """Move every sidecar's mtime ``seconds`` back (reconcile's grace is about its age)."""
    then = time.time() - seconds
    for path in glob.glob(os.path.join(staging, "*.mpu")):
        try:
            os.utime(path, (then, then))
        except OSError:
            pass  # removed meanwhile


class _DroppedError(Exception):
    """Raised inside a ``with`` block on purpose: the write is dropped."""


def _write_chunks(f: Any, data: bytes, step: Step, stop_at: int | None = None) -> int:
    """Write ``data`` (or its first ``stop_at`` bytes) in the step's ``chunks``, sleeping its
    ``pauses`` after each; without chunks in one write. Returns the bytes written."""
    end = len(data) if stop_at is None else min(stop_at, len(data))
    chunks = step.get("chunks") or [end]
    pauses = step.get("pauses") or [0.0] * len(chunks)
    view = memoryview(data)
    done = 0
    for size, pause in zip(chunks, pauses, strict=True):
        if done >= end:
            break
        n = min(size, end - done)
        f.write(view[done : done + n])
        done += n
        if pause:
            time.sleep(pause)
    if done < end:
        f.write(view[done:end])
        done = end
    return done


def _discard(f: Any) -> None:
    """Close a file that must not be committed (its write failed)."""
    try:
        discard = getattr(f, "discard", None)
        if discard is not None:
            discard()
    except Exception:
        pass


def _read(fs: Any, path: str) -> str:
    try:
        return identify(fs.cat_file(path))
    except FileNotFoundError:
        return ABSENT
    except Exception as exc:
        return f"error: {_describe(exc)}"


def _sleep_until(at: float | None) -> None:
    """Wait for a CLOCK_MONOTONIC instant (system-wide on Linux): sleep, then spin the rest."""
    if at is None:
        return
    while (left := at - time.monotonic()) > 0.002:
        time.sleep(left - 0.002)
    while time.monotonic() < at:
        pass


def worker_main(conn: Connection, name: str, store: S3Endpoint, log_path: str) -> None:
    """The child's loop: one command at a time, each answered by ``("end", id, error)``."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 2)
    level = os.environ.get("TIERCACHE_TORTURE_LOG", "WARNING").upper()  # DEBUG: tiercache's
    logging.basicConfig(level=level, format=f"%(asctime)s {name} %(name)s %(message)s")
    worker = _Worker(conn, name, store)
    worker.send(("ready", name, os.getpid()))
    while True:
        try:
            cmd = conn.recv()
        except EOFError:
            os._exit(0)
        if cmd["op"] == "exit":
            os._exit(0)  # no exit-time upload wait: the harness flushes on its own terms
        error = None
        try:
            worker.command(cmd)
        except Exception:
            error = traceback.format_exc()
        worker.send(("end", cmd["id"], error))


# --------------------------------------------------------------------------- parent side


@dataclass(eq=False)
class Worker:
    """The harness's handle on one worker process."""

    name: str
    proc: SpawnProcess
    conn: Connection
    ready: bool = False
    busy: int | None = None  # id of the command it runs
    uses: int = 0
    dead: bool = False
    last_error: str | None = None
    results: list[Message] = field(default_factory=list)

    def send(self, cmd: dict[str, Any]) -> None:
        self.busy = next(_command_ids)
        self.conn.send({**cmd, "id": self.busy})

    def kill(self) -> None:
        if self.proc.pid is not None and self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)
        self.dead = True


class Pool:
    """Writers ``w0..`` reused across rounds, replaced when killed or worn, and one checker."""

    RECYCLE_AFTER = 40  # rounds: each one's uploader threads stay behind, idle

    def __init__(self, ctx: SpawnContext, store: S3Endpoint, log_dir: str) -> None:
        self._ctx = ctx
        self._store = store
        self._log_dir = log_dir
        self._serial = 0
        self.writers: list[Worker] = []
        self.names: dict[int, str] = {}  # pid -> name of every worker started
        self.checker = self._spawn("chk")

    def _spawn(self, name: str) -> Worker:
        self._serial += 1
        parent, child = self._ctx.Pipe()
        os.makedirs(self._log_dir, exist_ok=True)
        log_path = os.path.join(self._log_dir, f"{name}-{self._serial}.log")
        proc = self._ctx.Process(
            target=worker_main, args=(child, name, self._store, log_path), daemon=True
        )
        proc.start()
        child.close()
        if proc.pid is not None:
            self.names[proc.pid] = f"{name}-{self._serial}"  # as its log file
        return Worker(name, proc, parent)

    def take(self, n: int) -> list[Worker]:
        """``n`` writers, ready for commands (spawning any that are missing)."""
        while len(self.writers) < n:
            self.writers.append(self._spawn(f"w{len(self.writers)}"))
        chosen = self.writers[:n]
        for worker in [*chosen, self.checker]:
            self._wait_ready(worker)
        return chosen

    def _wait_ready(self, worker: Worker) -> None:
        if worker.ready:
            return
        if not worker.conn.poll(60):
            raise RuntimeError(f"worker {worker.name} did not start within 60 s")
        msg = worker.conn.recv()
        if msg[0] != "ready":
            raise RuntimeError(f"worker {worker.name} said {msg!r} instead of ready")
        worker.ready = True

    def after_round(self) -> None:
        """Replace dead and worn-out workers now, so they start while the harness checks."""
        for i, worker in enumerate(self.writers):
            if worker.dead or worker.uses >= self.RECYCLE_AFTER:
                self._retire(worker)
                self.writers[i] = self._spawn(worker.name)
        if self.checker.dead or self.checker.uses >= self.RECYCLE_AFTER * 2:
            self._retire(self.checker)
            self.checker = self._spawn("chk")

    def _retire(self, worker: Worker) -> None:
        if not worker.dead:
            try:
                worker.conn.send({"op": "exit"})
            except OSError:
                pass
            worker.proc.join(5)
            worker.kill()
        worker.conn.close()

    def close(self) -> None:
        for worker in [*self.writers, self.checker]:
            self._retire(worker)
        self.writers = []

    def collect(
        self,
        workers: list[Worker],
        deadline: float,
        on_message: Callable[[Message], None],
        kills: dict[str, float] | None = None,
    ) -> list[str]:
        """Wait for every worker's ``end`` and SIGKILL each worker named in ``kills`` (name ->
        monotonic instant) at its instant, even one already idle (its uploads may still run).
        ``on_message`` may add kills. Returns a line for each worker that hung past
        ``deadline`` (killed then) or died unasked."""
        kills = kills if kills is not None else {}
        by_name = {w.name: w for w in workers}
        waiting = {w.conn: w for w in workers if w.busy is not None and not w.dead}
        problems: list[str] = []
        while True:
            now = time.monotonic()
            for name, when in list(kills.items()):
                victim = by_name.get(name)
                if victim is not None and when <= now:
                    del kills[name]
                    if not victim.dead:
                        victim.kill()
                        self._drain(victim, on_message)
                        waiting.pop(victim.conn, None)
            armed = [t for n, t in kills.items() if n in by_name and not by_name[n].dead]
            if not waiting and not armed:
                return problems
            if now >= deadline:
                for worker in waiting.values():
                    problems.append(f"{worker.name} hung: no answer to its command in time")
                    worker.kill()
                    self._drain(worker, on_message)
                return problems
            timeout = max(0.0, min([deadline, *armed]) - now)
            if not waiting:
                time.sleep(timeout)
                continue
            for conn in wait(list(waiting), timeout=timeout):
                worker = waiting[conn]  # type: ignore[index]
                if not self._receive(worker, on_message):
                    del waiting[conn]  # type: ignore[arg-type]
                    if worker.last_error is not None:
                        problems.append(f"{worker.name}: {worker.last_error}")

    def _receive(self, worker: Worker, on_message: Callable[[Message], None]) -> bool:
        """Handle one message; False once the worker's command ended (or the worker died)."""
        try:
            msg = worker.conn.recv()
        except (EOFError, OSError):
            worker.kill()
            worker.last_error = f"died unasked (exit code {worker.proc.exitcode})"
            return False
        if msg[0] == "end":
            worker.busy, worker.last_error = None, msg[2]
            return False
        if msg[0] == "check":
            worker.results.append(msg)
        else:
            on_message(msg)
        return True

    def _drain(self, worker: Worker, on_message: Callable[[Message], None]) -> None:
        """What a killed worker sent before it died still counts: it was reported."""
        worker.busy = None
        try:
            while worker.conn.poll(0):
                msg = worker.conn.recv()
                if msg[0] not in ("end", "check"):
                    on_message(msg)
        except Exception:  # a message cut off by the kill (any unpickling error): unreported
            pass
