"""Whether the process behind a FUSE request is dying of a signal (a writer killed mid-write).

The kernel closes a killed process's descriptors while it exits, and FUSE sends a ``flush``
for each of them from that process: the request's pid is still the dying process, whose
``/proc/PID/stat`` shows it exiting (``PF_EXITING``) with the signal as its exit code. A
process that exits normally (``exit(n)``, end of ``main``) has a zero signal there.
"""

from __future__ import annotations

from tiercache.processes import proc_stat

_PF_EXITING = 0x4  # include/linux/sched.h
_FLAGS = 6  # field 9 of /proc/PID/stat, counted from the state (field 3)
_EXIT_CODE = 49  # field 52


def closing_state(pid: int) -> tuple[bool, bool]:
    """(exiting, killed): whether ``pid`` closes its descriptors because it is exiting, and
    whether a signal killed it. (False, False) when unsure (gone already, no such field)."""
    fields = proc_stat(pid) if pid > 0 else None
    if fields is None:
        return False, False  # gone already
    try:
        flags, exit_code = int(fields[_FLAGS]), int(fields[_EXIT_CODE])
    except (IndexError, ValueError):
        return False, False  # a kernel without the field
    exiting = bool(flags & _PF_EXITING)
    return exiting, exiting and exit_code & 0x7F != 0


def killed_by_signal(pid: int) -> bool:
    """True when ``pid`` is exiting because a signal killed it (False when unsure)."""
    return closing_state(pid)[1]
