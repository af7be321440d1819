"""The metrics directory of a tier: one counters file per live process, and the dead ones' total.

Layout (``ROOT`` is the local tier's root)::

    ROOT/metrics/<pid>-<start>-<nonce>.json    counters of a live process (temp file + rename)
    ROOT/metrics/<pid>-<start>-<nonce>.alive   flock held by that process while it lives
    ROOT/metrics/total.json                    counters of every process that has exited
    ROOT/metrics/.fold.lock                    flock: one folder or reader at a time

A process is alive while it holds its ``.alive`` lock; the kernel drops the lock when the
process ends however it ends, which no check of pid and start time can match across pid
namespaces (a tier shared by containers). The pid and start time in the name keep a reused pid
from taking over a dead process's file; the nonce keeps apart two namespaces' processes.

Folding moves a dead process's counters into ``total.json`` and removes its files, under the
fold lock. ``total.json`` names the processes folded last, and a fold skips those, so a crash
between writing the total and removing the files cannot count a process twice. Node counters
are the total plus every live file, read under the same lock, so they never go down: a file
leaves the live set only by joining the total.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from tiercache.processes import start_ticks
from tiercache.tiers.entry import read_small_file, write_atomically
from tiercache.tiers.locks import lock, try_lock, unlock

DIRNAME = "metrics"
TOTAL = "total.json"
FOLD_LOCK = ".fold.lock"
ALIVE = ".alive"
_PROCESS_FILE = re.compile(r"^(\d+-\d+-[0-9a-f]{6})\.(json|alive)$")
_TEMP_FILE = re.compile(r"\.tmp$")
_MAX_FILE_BYTES = 1 << 20
_TEMP_GRACE = 60.0  # seconds: a temp file older than this was left by a killed writer
FOLD_TIMEOUT = 10.0


def metrics_dir(tier_root: str) -> str:
    """Where the processes using the tier at ``tier_root`` publish their counters."""
    return os.path.join(tier_root, DIRNAME)


def new_process_id(pid: int | None = None) -> str:
    """``<pid>-<start ticks>-<nonce>``: names this process's files (see the module docstring)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_ticks(pid) or 0}-{secrets.token_hex(3)}"


def hold_alive(directory: str, process_id: str, mode: int) -> int:
    """Take this process's liveness lock; the returned fd must stay open while it lives."""
    # Waits out a fold that takes the lock in the instant between its creation and ours.
    return lock(os.path.join(directory, process_id + ALIVE), mode, FOLD_TIMEOUT, "starting")


def write_process_counters(
    directory: str, process_id: str, counters: Mapping[str, float], mode: int
) -> None:
    """Publish a live process's counters (atomically: readers see the old or the new file)."""
    payload = {"process": process_id, "updated": time.time(), "counters": dict(counters)}
    path = os.path.join(directory, process_id + ".json")
    write_atomically(path, json.dumps(payload).encode(), mode, durable=False)


def node_counters(directory: str, mode: int) -> dict[str, float]:
    """The node's counters: dead processes folded into the total first, then total + live."""
    with _fold_lock(directory, mode, wait=True):
        total = _fold(directory, mode)
        live = [_read_counters(os.path.join(directory, f"{pid}.json")) for pid in _live(directory)]
    out: Counter[str] = Counter()
    for counters in (total, *live):
        out.update(counters or {})
    return dict(out)


def fold_if_free(directory: str, mode: int) -> bool:
    """Fold dead processes now unless another process is folding (never waits)."""
    with _fold_lock(directory, mode, wait=False) as held:
        if held:
            _fold(directory, mode)
    return held


def live_processes(directory: str) -> list[str]:
    """Ids of the processes that hold their liveness lock now."""
    return _live(directory)


@contextmanager
def _fold_lock(directory: str, mode: int, wait: bool) -> Iterator[bool]:
    path = os.path.join(directory, FOLD_LOCK)
    fd = lock(path, mode, FOLD_TIMEOUT, "folding metrics") if wait else try_lock(path, mode)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            unlock(fd)


def _fold(directory: str, mode: int) -> dict[str, float]:
    """Add the counters of dead processes to ``total.json`` and remove their files.

    Runs under the fold lock; returns the total after the fold.
    """
    total_path = os.path.join(directory, TOTAL)
    total_doc = _read_json(total_path) or {}
    counters = total_doc.get("counters")
    total: Counter[str] = Counter(_numbers(counters))
    folded = total_doc.get("folded")
    already = {str(pid) for pid in folded} if isinstance(folded, list) else set()
    dead, alive_locks = _dead(directory)
    try:
        fresh = [pid for pid in dead if pid not in already]
        for pid in fresh:
            total.update(_read_counters(os.path.join(directory, f"{pid}.json")) or {})
        if fresh:
            doc = {"counters": dict(total), "folded": fresh, "updated": time.time()}
            write_atomically(total_path, json.dumps(doc).encode(), mode, durable=True)
        for pid in dead:
            _remove(os.path.join(directory, f"{pid}.json"))
            _remove(os.path.join(directory, pid + ALIVE))
    finally:
        for fd in alive_locks:
            unlock(fd)
    _remove_stale_temps(directory)
    return dict(total)


def _dead(directory: str) -> tuple[list[str], list[int]]:
    """Ids whose liveness lock nobody holds, with the locks taken on them (held until removed)."""
    dead: list[str] = []
    fds: list[int] = []
    for pid in _process_ids(directory):
        fd = try_lock(os.path.join(directory, pid + ALIVE), 0o600)
        if fd is not None:
            dead.append(pid)
            fds.append(fd)
    return dead, fds


def _live(directory: str) -> list[str]:
    live = []
    for pid in _process_ids(directory):
        fd = try_lock(os.path.join(directory, pid + ALIVE), 0o600)
        if fd is None:
            live.append(pid)
            continue
        # Dead but not folded yet (read outside a fold): leave its files to the next fold.
        unlock(fd)
    return live


def _process_ids(directory: str) -> list[str]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted({m.group(1) for name in names if (m := _PROCESS_FILE.match(name))})


def _remove_stale_temps(directory: str) -> None:
    now = time.time()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in entries:
        if _TEMP_FILE.search(entry.name):
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > _TEMP_GRACE:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass


def _read_json(path: str) -> dict[str, object] | None:
    raw = read_small_file(path, _MAX_FILE_BYTES)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _read_counters(path: str) -> dict[str, float] | None:
    doc = _read_json(path)
    return None if doc is None else _numbers(doc.get("counters"))


def _numbers(counters: object) -> dict[str, float]:
    """The counters of a file: non-negative numbers by name, anything else dropped."""
    if not isinstance(counters, dict):
        return {}
    return {
        str(name): value
        for name, value in counters.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    }


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
