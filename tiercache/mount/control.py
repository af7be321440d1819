"""Mount process control: URL and mountpoint checks, background mount, unmount, mount records."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tiercache.errors import TierCacheError
from tiercache.mount.library import fusermount_path
from tiercache.processes import is_alive
from tiercache.tiers.local import make_tier_dir

FSTYPE = "fuse.tiercache"
READY_TIMEOUT = 30.0
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")


class MountError(TierCacheError, OSError):
    """A mount or unmount could not be done; the message says what to do."""


@dataclass(frozen=True)
class MountInfo:
    """One line of /proc/mounts that is a tiercache mount."""

    source: str  # "tiercache:s3://bucket/prefix"
    mountpoint: str
    options: str

    @property
    def url(self) -> str:
        return self.source.removeprefix("tiercache:")

    @property
    def read_only(self) -> bool:
        return "ro" in self.options.split(",")


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → ``("bucket", "prefix")``; anything else is a ``MountError``."""
    if not url.startswith(("s3://", "s3a://")):
        raise MountError(f"bad URL {url!r}: expected s3://BUCKET or s3://BUCKET/PREFIX")
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    if not _BUCKET_RE.match(bucket):
        raise MountError(f"bad URL {url!r}: {bucket!r} is not a bucket name")
    if "," in url or "\x00" in url or "\n" in url:
        raise MountError(f"bad URL {url!r}: it may not contain commas or control characters")
    return bucket, prefix.strip("/")


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def active_mounts(proc_mounts: str = "/proc/mounts") -> list[MountInfo]:
    """The tiercache mounts the kernel knows about."""
    try:
        with open(proc_mounts, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == FSTYPE:
            found.append(MountInfo(_unescape(fields[0]), _unescape(fields[1]), fields[3]))
    return found


def is_mounted(mountpoint: str) -> bool:
    real = os.path.realpath(mountpoint)
    return os.path.ismount(real) or any(m.mountpoint == real for m in active_mounts())


def check_mountpoint(mountpoint: str) -> str:
    """The absolute mountpoint, or a ``MountError`` saying why it cannot be mounted on."""
    path = os.path.realpath(mountpoint)
    if not os.path.exists(path):
        raise MountError(f"mountpoint {mountpoint} does not exist: create it with mkdir -p")
    if not os.path.isdir(path):
        raise MountError(f"mountpoint {mountpoint} is not a directory")
    if is_mounted(path):
        raise MountError(
            f"mountpoint {mountpoint} is already a mount point: "
            f"unmount it first (tiercache unmount {mountpoint})"
        )
    if os.listdir(path):
        raise MountError(
            f"mountpoint {mountpoint} is not empty: mount on an empty directory "
            "(its files would be hidden)"
        )
    return path


def state_path(local_dir: str, mountpoint: str, suffix: str) -> str:
    """A file of the mount's own under the local tier: its log or its counters."""
    digest = hashlib.sha256(os.path.realpath(mountpoint).encode()).hexdigest()[:16]
    os.makedirs(local_dir, mode=0o700, exist_ok=True)
    directory = make_tier_dir(local_dir, "mounts", 0o700)  # never written through a link
    return os.path.join(directory, f"{digest}.{suffix}")


def read_mount_stats(local_dir: str, mountpoint: str) -> dict[str, Any] | None:
    """The counters a running mount last wrote (None when it has written none)."""
    try:
        with open(state_path(local_dir, mountpoint, "json"), encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RunningMount:
    """A tiercache mount of this host, with what its own record says (None: no record)."""

    mountpoint: str
    url: str
    read_only: bool
    pid: int | None = None
    local_dir: str | None = None
    shared_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def records_dir() -> str:
    """Where each mount process records itself: its pid and tiers (per user, not per tier).

    The operator commands find a mount's tier here whatever ``--local-dir`` it was given.
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    return os.path.join(base, "tiercache", "mounts")


def _record_path(mountpoint: str, directory: str) -> str:
    digest = hashlib.sha256(os.path.realpath(mountpoint).encode()).hexdigest()[:16]
    return os.path.join(directory, f"{digest}.json")


def write_record(mount: RunningMount, directory: str | None = None) -> str:
    """Record this mount process (temp file + rename); returns the record's path."""
    directory = directory or records_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = _record_path(mount.mountpoint, directory)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(mount.to_json(), f)
    os.replace(tmp, path)
    return path


def remove_record(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _read_record(mountpoint: str, directory: str) -> dict[str, Any] | None:
    try:
        with open(_record_path(mountpoint, directory), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("mountpoint") != mountpoint:
        return None
    pid = data.get("pid")
    return data if isinstance(pid, int) and is_alive(pid) else None


def running_mounts(
    directory: str | None = None, proc_mounts: str = "/proc/mounts"
) -> list[RunningMount]:
    """The kernel's tiercache mounts, each with its process's record where it left one."""
    directory = directory or records_dir()
    found = []
    for mount in active_mounts(proc_mounts):
        record = _read_record(mount.mountpoint, directory) or {}
        local_dir, shared_dir = record.get("local_dir"), record.get("shared_dir")
        found.append(
            RunningMount(
                mountpoint=mount.mountpoint,
                url=mount.url,
                read_only=mount.read_only,
                pid=record.get("pid"),
                local_dir=local_dir if isinstance(local_dir, str) else None,
                shared_dir=shared_dir if isinstance(shared_dir, str) else None,
            )
        )
    return found


def start_background(argv: Sequence[str], mountpoint: str, log_path: str) -> int:
    """Run ``argv`` (the same mount in the foreground) detached; return once it is mounted.

    The child gets its own session, so it outlives the shell; its output goes to
    ``log_path``. Raises ``MountError`` with the child's last words if it exits or does not
    come up within ``READY_TIMEOUT`` seconds. Returns the child's pid.
    """
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
    real = os.path.realpath(mountpoint)
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if any(m.mountpoint == real for m in active_mounts()):
            return child.pid
        if child.poll() is not None:
            raise MountError(f"the mount did not come up: {_last_line(log_path)} (log: {log_path})")
        time.sleep(0.05)
    child.kill()
    child.wait()
    raise MountError(
        f"the mount did not come up within {READY_TIMEOUT:.0f} s (log: {log_path}); "
        f"check {mountpoint} with: tiercache doctor"
    )


def _last_line(log_path: str) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    except OSError:
        return "no output"
    # libfuse and fusermount say why they failed in lines of their own; prefer those.
    said = [line for line in lines if line.startswith(("fuse:", "fusermount"))]
    return (said or lines or ["no output"])[-1]


def unmount(mountpoint: str, lazy: bool = False, timeout: float = 10.0) -> None:
    """Unmount a tiercache mount; ``lazy`` detaches it now and finishes when files close."""
    real = os.path.realpath(mountpoint)
    if not any(m.mountpoint == real for m in active_mounts()):
        raise MountError(f"{mountpoint} is not a tiercache mount (see: tiercache status)")
    helper = fusermount_path()
    command = [helper, "-u"] if helper else ["umount"]
    if lazy:
        command.append("-z" if helper else "-l")
    done = subprocess.run([*command, real], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        text = reason[-1] if reason else f"exit {done.returncode}"
        if "busy" in text.lower():
            raise MountError(
                f"{mountpoint} is busy: close the files and shells using it "
                f"(fuser -vm {mountpoint}), or detach it now with --lazy"
            )
        raise MountError(f"unmounting {mountpoint} failed: {text}")
    deadline = time.monotonic() + timeout
    while any(m.mountpoint == real for m in active_mounts()):
        if time.monotonic() > deadline:
            raise MountError(f"{mountpoint} is still mounted after {timeout:.0f} s")
        time.sleep(0.05)
