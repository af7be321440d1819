"""``tiercache prefetch``: bring objects (one, a prefix or a glob) into the cache ahead of a job."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    filesystem_from_args,
    human_bytes,
    print_json,
    report_error,
)
from tiercache.cli.progress import ProgressBar
from tiercache.prefetch import PrefetchHandle
from tiercache.prefetch.targets import TIERS

NAME = "prefetch"
HELP = "bring objects (s3://bucket/key, a prefix or a glob) into the cache ahead of a job"

_POLL_SECONDS = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url", help="s3://bucket/key, a prefix (s3://bucket/train/) or a glob (s3://b/t/*.tar)"
    )
    parser.add_argument("--tier", choices=TIERS, default="local", help="the tier to fill")
    parser.add_argument(
        "--jobs", type=int, help="objects fetched at once (default: TIERCACHE_PREFETCH_WORKERS)"
    )
    add_tier_flags(parser)
    add_store_flags(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    extra = {"prefetch_workers": args.jobs} if args.jobs is not None else {}
    fs = filesystem_from_args(args, **extra)
    started = time.monotonic()
    # Not pinned: this process reads nothing, so it fills the tier up to its budget and skips
    # what does not fit rather than evicting what it brought itself.
    handle = fs.prefetch(args.url, tier=args.tier, pin=False)
    bar = ProgressBar("prefetch", enabled=False if args.json else None)
    try:
        while not handle.wait(_POLL_SECONDS):
            _draw(bar, handle)
    except KeyboardInterrupt:
        handle.cancel()
        bar.close()
        done = handle.progress()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends it at once
        return report_error(
            args,
            f"interrupted; {done.fetched + done.cached} object(s) in the cache, the rest cancelled",
            code=130,
        )
    _draw(bar, handle)
    bar.close()
    summary = _summary(handle, time.monotonic() - started)
    if args.json:
        print_json(summary)
    else:
        _print_summary(summary)
        for path, error in sorted(handle.errors.items()):
            print(f"tiercache prefetch: {path}: {error}", file=sys.stderr)
    return 1 if summary["failed"] else 0


def _draw(bar: ProgressBar, handle: PrefetchHandle) -> None:
    p = handle.progress()
    bar.total_items, bar.total_bytes = p.objects_total, p.bytes_total
    bar.set(p.objects_done, p.bytes_done)


def _summary(handle: PrefetchHandle, seconds: float) -> dict[str, object]:
    p = handle.progress()
    return {
        "objects": p.objects_total,
        "fetched": p.fetched,
        "cached": p.cached,
        "failed": p.failed,
        "skipped": p.skipped,
        "bytes": p.bytes_done,
        "seconds": round(seconds, 3),
        "bytes_per_second": round(p.bytes_done / seconds) if seconds > 0 else 0,
        "errors": {path: str(exc) for path, exc in sorted(handle.errors.items())},
        "skipped_objects": dict(sorted(handle.skipped.items())),
    }


def _print_summary(s: dict[str, object]) -> None:
    nbytes = int(str(s["bytes"]))
    rate = int(str(s["bytes_per_second"]))
    print(
        f"{s['objects']} object(s): {s['fetched']} fetched, {s['cached']} already cached, "
        f"{s['failed']} failed, {s['skipped']} skipped (no room); {human_bytes(nbytes)} "
        f"in {s['seconds']} s ({human_bytes(rate)}/s)"
    )
