"""``tiercache flush``: upload everything written behind and not yet in the store."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    endpoint_flags,
    filesystem_from_args,
    human_bytes,
    print_json,
    report_error,
    store_name,
)
from tiercache.cli.which_tier import add_mount_flag, choose_tier
from tiercache.errors import CacheTimeoutError, UploadFailedError
from tiercache.filesystem import TierCacheFileSystem
from tiercache.store.endpoint import store_label

NAME = "flush"
HELP = "upload everything written behind and not yet in the store (after a job or a crash)"


EPILOG = """\
examples:
  tiercache flush                       # after a job or a crash: upload what is pending
  tiercache flush --timeout 600         # exit 1, naming what is left, if not done in 10 min
  tiercache flush --retry-failed        # send again what the store refused (after a fix)
  tiercache flush --watch               # keep draining new uploads until interrupted
  tiercache flush --mount /mnt/ckpt     # what the mount on /mnt/ckpt wrote

Without --local-dir it flushes the tier of the running mount, and refuses, naming the
mounts, when mounts with different tiers run (or the configured tier is none of theirs).

With a shared tier (--shared-dir) it also finishes every write staged there
(write_tier="shared"), whichever host wrote it: on any host, after another was lost.

Exit status 0 means everything written behind in this local tier (and the shared tier) is
in the store. Before
uploading, the journal is reconciled with the tier (what a crash left is repaired or
reported). Exit 1 names what is still pending at the timeout, what the store refused for
good (`tiercache discard PATH` drops it) or what was lost, and uploads pending for another
endpoint than the one given (run flush again with that --endpoint-url).

While it waits, flush says on stderr what it waits for (at the first failed attempt, then
every 10 s). Without --timeout it gives up, exit 1, once no upload has reached the store
for --give-up-after seconds (default 300) while attempts keep failing (the store is down,
refuses connections or does not answer); what is pending stays in the journal for the next
flush. --give-up-after 0 waits for ever.
"""

GIVE_UP_AFTER = 300.0  # seconds without an upload landing, while attempts fail
PROGRESS_EVERY = 10.0  # seconds between two "still waiting" lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_tier_flags(parser)
    add_mount_flag(parser)
    add_store_flags(parser)
    parser.add_argument("--timeout", type=float, help="give up after this many seconds")
    parser.add_argument(
        "--give-up-after",
        type=float,
        metavar="SECONDS",
        help="give up once no upload has reached the store for this long while attempts "
        f"keep failing (default without --timeout: {GIVE_UP_AFTER:.0f}; 0: never)",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="retry uploads the store refused for good (after fixing the cause)",
    )
    parser.add_argument(
        "--watch", action="store_true", help="keep draining new uploads until interrupted"
    )
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    choose_tier(args)
    journals = _journals(args)
    started = time.monotonic()
    repairs = [fs.fsck(scrub=False) for fs in journals]
    before = [row for fs in journals for row in fs.pending()]
    current = journals[0]
    try:
        for current in journals:
            _flush_watched(current, args, args.retry_failed)
        while args.watch:
            time.sleep(1.0)
            for current in journals:
                _flush_watched(current, args, False)
    except (CacheTimeoutError, UploadFailedError, _GaveUpError) as exc:
        return _fail(args, str(exc), current)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends it at once
        return report_error(args, "interrupted; what is left stays in the journal", code=130)
    for fs in journals:
        elsewhere = fs.pending_elsewhere()
        if elsewhere:
            stores = sorted({r["store"] for r in elsewhere})
            how = " or ".join(endpoint_flags(s) for s in stores)
            return _fail(
                args,
                f"{len(elsewhere)} upload(s) in this tier are for another endpoint "
                f"({', '.join(store_label(s) for s in stores)}) than {store_name(fs.store)}, "
                f"e.g. {elsewhere[0]['name']}; run `tiercache flush` with {how}",
                fs,
            )
    since = time.time() - (time.monotonic() - started)
    superseded = [n for fs in journals for n in fs.superseded() if n["at"] >= since]
    summary = {
        "local_dir": journals[0].config.local_dir,
        "shared_dir": journals[0].config.shared_dir,
        "uploaded": len(before),
        "bytes": sum(p["size"] for p in before),
        "seconds": round(time.monotonic() - started, 3),
        "repaired": [name for r in repairs for name in r["repaired"]],
        "leftovers_removed": sum(r["leftovers_removed"] for r in repairs),
        "superseded": superseded,
    }
    if args.json:
        print_json(summary)
        return 0
    print(
        f"uploaded {summary['uploaded'] - len(superseded)} object(s), "
        f"{human_bytes(summary['bytes'])} in {summary['seconds']:.1f} s; nothing pending"
    )
    for note in superseded:
        print(
            f"  superseded, not sent: {note['name']} (written by {note['host'] or '?'}): "
            f"{note['why']}"
        )
    return 0


def _journals(args: argparse.Namespace) -> list[TierCacheFileSystem]:
    """A filesystem per journal to finish: the local tier's and, with a shared tier, the
    shared tier's (every host's writes staged there, ``write_tier="shared"``), whichever
    ``write_tier`` this host's configuration names."""
    local = filesystem_from_args(args, write_tier="local")
    if local.config.shared_dir is None:
        return [local]
    return [local, filesystem_from_args(args, write_tier="shared")]


def _fail(args: argparse.Namespace, message: str, fs: TierCacheFileSystem) -> int:
    if args.json:
        print_json({"error": message, "pending": fs.pending()})
    else:
        print(f"tiercache flush: {message}", file=sys.stderr)
    return 1


class _GaveUpError(Exception):
    """No upload reached the store for ``--give-up-after`` seconds while attempts failed."""


def _flush_watched(fs: TierCacheFileSystem, args: argparse.Namespace, retry_failed: bool) -> None:
    """``fs.flush``, saying on stderr what it waits for, and giving up once the store has
    taken nothing for ``--give-up-after`` seconds while attempts fail (``_GaveUpError``)."""
    give_up = args.give_up_after
    if give_up is None:
        give_up = GIVE_UP_AFTER if args.timeout is None else 0.0
    outcome: list[BaseException | None] = []

    def flush() -> None:
        try:
            fs.flush(timeout=args.timeout, retry_failed=retry_failed)
        except BaseException as exc:  # handed to the waiting thread
            outcome.append(exc)
        else:
            outcome.append(None)

    flusher = threading.Thread(target=flush, name="tiercache-flush", daemon=True)
    flusher.start()
    watch = _Progress(fs, give_up)
    while True:
        flusher.join(2.0)  # returns as soon as the flush ends; a look reads the journal
        if outcome:
            if outcome[0] is not None:
                raise outcome[0]
            return
        watch.look()


class _Progress:
    """What a waiting flush has seen: when an upload last landed, the errors since."""

    def __init__(self, fs: TierCacheFileSystem, give_up: float) -> None:
        self._fs = fs
        self._give_up = give_up
        self._started = self._landed_at = time.monotonic()
        self._said_at = -PROGRESS_EVERY
        self._told_failure = False
        self._seen = self._counts()
        self._errors_at_landing = self._seen[2]

    def _counts(self) -> tuple[int, int, int]:
        stats = self._fs.stats()
        return len(self._fs.pending()), stats["uploads"], stats["upload_errors"]

    def look(self) -> None:
        now = time.monotonic()
        pending, uploads, errors = counts = self._counts()
        if pending < self._seen[0] or uploads > self._seen[1]:
            self._landed_at = now  # something reached the store: the store is there
            self._errors_at_landing = errors
        self._seen = counts
        failing = errors > self._errors_at_landing
        if failing and self._give_up and now - self._landed_at >= self._give_up:
            raise _GaveUpError(
                f"gave up: no upload has reached the store for {now - self._landed_at:.0f} s "
                f"while attempts failed; {self._waiting()}; what is pending stays in the "
                "journal: run `tiercache flush` again once the store answers "
                "(--give-up-after sets how long to wait, 0: for ever)"
            )
        first_failure = errors > 0 and not self._told_failure
        due = now - self._said_at >= PROGRESS_EVERY and now - self._started >= PROGRESS_EVERY
        if first_failure or due:
            self._told_failure = self._told_failure or errors > 0
            self._say(now)

    def _say(self, now: float) -> None:
        self._said_at = now
        left = ""
        if self._give_up:
            left = f"; giving up in {max(0.0, self._give_up - (now - self._landed_at)):.0f} s"
            left += " unless an upload lands"
        print(
            f"tiercache flush: waiting for {self._waiting()} ({now - self._started:.0f} s){left}",
            file=sys.stderr,
            flush=True,
        )

    def _waiting(self) -> str:
        rows = [r for r in self._fs.pending() if r["state"] == "dirty"]
        if not rows:
            return "the last uploads to finish"
        first = rows[0]
        why = first["last_error"] or "an upload under way"
        return (
            f"{len(rows)} object(s), {human_bytes(sum(r['size'] for r in rows))}, e.g. "
            f"{first['name']}: {why}"
            + (f" (attempt {first['attempts']})" if first["attempts"] else "")
        )
