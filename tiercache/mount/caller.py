"""Whether the process behind a FUSE request is dying of a signal (a writer killed mid-write).

The kernel closes a killed process's descriptors while it exits, and FUSE sends a ``flush``
for each of them from that process: the request's pid is still the dying process, whose
``/proc/PID/stat`` shows it exiting (``PF_EXITING``) with the signal as its exit code. A
process that exits normally (``exit(n)``, end of ``main``) has a zero signal there.
"""

from __future__ import annotations

_PF_EXITING = 0x4  # include/linux/sched.h
_FLAGS = 6  # field 9 of /proc/PID/stat, counted from the state (field 3)
_EXIT_CODE = 49  # field 52


def killed_by_signal(pid: int) -> bool:
    """True when ``pid`` is exiting because a signal killed it (False when unsure)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        flags, exit_code = int(fields[_FLAGS]), int(fields[_EXIT_CODE])
    except (OSError, IndexError, ValueError):
        return False  # gone already, or a kernel without the field: treat it as a clean exit
    return bool(flags & _PF_EXITING) and exit_code & 0x7F != 0
