"""``tiercache flush``: upload everything written behind and not yet in the store."""

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
from tiercache.cli.which_tier import add_mount_flag, choose_tier
from tiercache.errors import CacheTimeoutError, UploadFailedError
from tiercache.filesystem import TierCacheFileSystem

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

Exit status 0 means everything written behind in this local tier is in the store. Before
uploading, the journal is reconciled with the tier (what a crash left is repaired or
reported). Exit 1 names what is still pending at the timeout, what the store refused for
good (`tiercache discard PATH` drops it) or what was lost, and uploads pending for another
endpoint than the one given (run flush again with that --endpoint-url).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_tier_flags(parser)
    add_mount_flag(parser)
    add_store_flags(parser)
    parser.add_argument("--timeout", type=float, help="give up after this many seconds")
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
    fs = filesystem_from_args(args)
    started = time.monotonic()
    repairs = fs.fsck(scrub=False)
    before = fs.pending()
    try:
        fs.flush(timeout=args.timeout, retry_failed=args.retry_failed)
        while args.watch:
            time.sleep(1.0)
            fs.flush(timeout=args.timeout)
    except (CacheTimeoutError, UploadFailedError) as exc:
        return _fail(args, str(exc), fs)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends it at once
        return report_error(args, "interrupted; what is left stays in the journal", code=130)
    elsewhere = fs.pending_elsewhere()
    if elsewhere:
        stores = sorted({r["store"] for r in elsewhere})
        return _fail(
            args,
            f"{len(elsewhere)} upload(s) in this tier are for another endpoint "
            f"({', '.join(stores)}), e.g. {elsewhere[0]['name']}; run `tiercache flush` "
            "with that --endpoint-url",
            fs,
        )
    summary = {
        "local_dir": fs.config.local_dir,
        "uploaded": len(before),
        "bytes": sum(p["size"] for p in before),
        "seconds": round(time.monotonic() - started, 3),
        "repaired": repairs["repaired"],
        "leftovers_removed": repairs["leftovers_removed"],
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"uploaded {summary['uploaded']} object(s), {human_bytes(summary['bytes'])} "
            f"in {summary['seconds']:.1f} s; nothing pending"
        )
    return 0


def _fail(args: argparse.Namespace, message: str, fs: TierCacheFileSystem) -> int:
    if args.json:
        print_json({"error": message, "pending": fs.pending()})
    else:
        print(f"tiercache flush: {message}", file=sys.stderr)
    return 1
