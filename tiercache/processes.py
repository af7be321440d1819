"""Whether a process is alive, told apart from a later process that reuses its pid."""

from __future__ import annotations

import os


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): tells a reused pid apart."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def is_alive(pid: int, started: object = None) -> bool:
    """Is the process that held this pid (and started then) still running?"""
    if os.path.isdir("/proc/self"):
        fields = proc_stat(pid)
        if fields is None or fields[0] in ("Z", "X"):  # gone, or a zombie nobody reaped
            return False
        return started is None or start_ticks(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
