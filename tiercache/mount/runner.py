"""Serving a mount in the foreground: the FUSE binding, kernel options and the counters file."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiercache.metrics import publish
from tiercache.metrics.serve import parse_listen, start_http
from tiercache.mount.binding import caller_pid, fuse_class
from tiercache.mount.control import (
    MountError,
    RunningMount,
    remove_record,
    state_path,
    write_record,
)
from tiercache.mount.operations import MountOperations, MountOptions
from tiercache.mount.readahead import DirectoryReadAhead

log = logging.getLogger("tiercache.mount")

_STATS_SECONDS = 1.0
# A failure that repeats (the counters file cannot be written) is logged when it starts, then
# at most once per this many seconds while it lasts, and once when it ends.
REPEAT_LOG_SECONDS = 600.0
# Requests libfuse serves at once (its default is 10). A cold read holds its request for a
# round trip to the store, so 16 readers of cold files would otherwise wait on each other.
MAX_REQUESTS = 64
# How long the kernel trusts a found entry and its attributes on a read-only mount of
# immutable objects when --attr-timeout is not given: such an object never changes, so a
# warm epoch sends no lookup. Names not found are still trusted only ``attr_ttl``.
IMMUTABLE_ENTRY_TTL = 3600.0


@dataclass(frozen=True)
class MountSpec:
    """What to serve where, and how."""

    url: str
    bucket: str
    prefix: str
    mountpoint: str
    read_only: bool = False
    attr_ttl: float = 1.0
    allow_other: bool = False
    passthrough: bool = True  # see ``passthrough``; off: every read reaches the mount
    kernel_opens: bool = False  # opens need no request (read-only, immutable): ``kernel_opens``
    entry_ttl: float | None = None  # the kernel's trust in found entries (None: attr_ttl)
    debug: bool = False
    metrics_listen: str | None = None  # HOST:PORT: serve the node's Prometheus metrics


def kernel_options(spec: MountSpec) -> dict[str, Any]:
    """Mount options for libfuse; the source names the URL (never a credential)."""
    found_ttl = spec.attr_ttl if spec.entry_ttl is None else spec.entry_ttl
    options: dict[str, Any] = {
        "fsname": f"tiercache:{spec.url}",
        "subtype": "tiercache",
        "default_permissions": True,  # the kernel checks the modes getattr reports
        "attr_timeout": found_ttl,
        "entry_timeout": found_ttl,
        "negative_timeout": spec.attr_ttl,
        # A killed mount process is unmounted by fusermount3 instead of leaving a dead mount.
        "auto_unmount": True,
        # unlink of an open file reaches the mount (which never commits it) instead of being
        # turned into a rename to a hidden name that would be uploaded.
        "hard_remove": True,
        "max_threads": MAX_REQUESTS,
    }
    if spec.read_only:
        options["ro"] = True
    if spec.allow_other:
        options["allow_other"] = True
    return options


def operation_options(spec: MountSpec, consistency: str) -> MountOptions:
    """Kernel page cache: always kept across opens when objects never change (immutable).

    In the other modes an open keeps a file's cached pages only when the object is the version
    opened last time (``handles.KeptPages``), so a reader sees a replaced object the next time
    it opens it and reads an unchanged one from the kernel's pages.
    """
    return MountOptions(
        read_only=spec.read_only,
        attr_ttl=spec.attr_ttl,
        keep_cache=consistency == "immutable",
        direct_io=False,
        passthrough=spec.passthrough,
        kernel_opens=spec.kernel_opens,
    )


def serve(spec: MountSpec, fs: Any) -> None:
    """Mount and serve until unmounted (blocks). Raises ``MountError`` if libfuse fails."""
    fuse = fuse_class(spec.mountpoint)
    logging.basicConfig(
        level=logging.DEBUG if spec.debug else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    consistency = fs.config.consistency
    root = f"{spec.bucket}/{spec.prefix}".rstrip("/")
    # Opening a file prefetches the next ones of its directory (``readahead``; 0: off).
    observer = DirectoryReadAhead(fs, root, fs.config.readahead) if fs.config.readahead else None
    options = operation_options(spec, consistency)
    operations = MountOperations(fs, root, options, observer, caller=caller_pid)
    stats_file = state_path(fs.config.local_dir, spec.mountpoint, "json")
    stop = threading.Event()
    writer = threading.Thread(
        target=_write_stats,
        args=(fs, spec, stats_file, stop, operations.counters),
        name="mount-stats",
        daemon=True,
    )
    writer.start()
    # The node's metrics count the mount's own ranged reads too, while it serves.
    publish.track(
        fs.tier.root, operations, operations.counters, fs.tier.file_mode, fs.tier.dir_mode
    )
    stop_metrics = _serve_metrics(spec, fs)
    record = _record_self(spec, fs)
    log.info("serving %s on %s (pid %d)", spec.url, spec.mountpoint, os.getpid())
    try:
        fuse(
            operations,
            spec.mountpoint,
            raw_fi=True,
            foreground=True,
            debug=spec.debug,
            **kernel_options(spec),
        )
    except RuntimeError as exc:  # libfuse printed its reason just before
        raise MountError(f"libfuse could not serve {spec.mountpoint} (status {exc})") from None
    finally:
        stop.set()
        writer.join(5)
        if stop_metrics is not None:
            stop_metrics()
        if record is not None:
            remove_record(record)
        try:
            os.unlink(stats_file)
        except FileNotFoundError:
            pass
        log.info("unmounted %s; uploads still pending: %d", spec.mountpoint, len(fs.pending()))


def _serve_metrics(spec: MountSpec, fs: Any) -> Callable[[], None] | None:
    """Serve the node's metrics from this process when asked (``--metrics-listen``)."""
    if spec.metrics_listen is None:
        return None
    bound, stop = start_http(fs.config, parse_listen(spec.metrics_listen))
    log.info("serving metrics on %s", bound.url())
    return stop


def _record_self(spec: MountSpec, fs: Any) -> str | None:
    """Record this process and its tiers, for ``tiercache status``/``flush`` to find."""
    shared = fs.config.shared_dir
    mount = RunningMount(
        mountpoint=spec.mountpoint,
        url=spec.url,
        read_only=spec.read_only,
        pid=os.getpid(),
        local_dir=os.path.realpath(fs.config.local_dir),
        shared_dir=os.path.realpath(shared) if shared else None,
    )
    try:
        return write_record(mount)
    except OSError as exc:
        log.warning("no mount record (tiercache status will not know this tier): %s", exc)
        return None


def _write_stats(
    fs: Any,
    spec: MountSpec,
    path: str,
    stop: threading.Event,
    mount_counters: Callable[[], dict[str, int]],
) -> None:
    """Publish this process's counters for ``tiercache stats`` (temp file + rename).

    The mount's own (its ranged reads) are added to the cache's.
    """
    failures = RepeatedFailure("writing the mount's counters to " + path, REPEAT_LOG_SECONDS)
    while not stop.wait(_STATS_SECONDS):
        try:
            stats = fs.stats()
            for name, value in mount_counters().items():
                stats[name] = stats.get(name, 0) + value
            payload = {
                "mountpoint": spec.mountpoint,
                "url": spec.url,
                "pid": os.getpid(),
                "updated": time.time(),
                "stats": stats,
            }
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f)
            os.replace(tmp, path)
        except Exception as exc:
            failures.failed(exc)
        else:
            failures.succeeded()


class RepeatedFailure:
    """The log of something retried on a timer: a failure is logged with its traceback when it
    starts (or changes), then at most once per ``every`` seconds with how often it recurred,
    and once when it stops, so that a failure that lasts does not fill the log."""

    def __init__(
        self, what: str, every: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._what = what
        self._every = every
        self._clock = clock
        self._failures = 0  # in a row
        self._unlogged = 0  # failures since the last line about them
        self._logged_at = 0.0
        self._last: tuple[type[BaseException], str] | None = None

    def failed(self, exc: BaseException) -> None:
        now = self._clock()
        self._failures += 1
        kind = (type(exc), str(exc))
        if kind != self._last:
            self._last, self._logged_at, self._unlogged = kind, now, 0
            log.error("%s failed: %s", self._what, exc, exc_info=exc)
        elif now - self._logged_at >= self._every:
            log.error(
                "%s still fails (%d times more since the last report): %s",
                self._what,
                self._unlogged + 1,
                exc,
            )
            self._logged_at, self._unlogged = now, 0
        else:
            self._unlogged += 1

    def succeeded(self) -> None:
        if self._failures:
            log.info("%s works again after %d failures", self._what, self._failures)
        self._failures, self._unlogged, self._last = 0, 0, None
