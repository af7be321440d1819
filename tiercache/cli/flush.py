"""``tiercache flush``: upload everything written behind and not yet in the store."""

from __future__ import annotations

import argparse
import sys
import time

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    filesystem_from_args,
    human_bytes,
    print_json,
)
from tiercache.errors import CacheTimeoutError

NAME = "flush"
HELP = "upload everything written behind and not yet in the store (after a job or a crash)"


EPILOG = """\
examples:
  tiercache flush                       # after a job or a crash: upload what is pending
  tiercache flush --timeout 600         # exit 1, naming what is left, if not done in 10 min
  tiercache flush --watch               # keep draining, as a service

Exit status 0 means everything written behind in this local tier is in the store.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_tier_flags(parser)
    add_store_flags(parser)
    parser.add_argument("--timeout", type=float, help="give up after this many seconds")
    parser.add_argument(
        "--watch", action="store_true", help="keep draining new uploads until interrupted"
    )
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    fs = filesystem_from_args(args)
    started = time.monotonic()
    before = fs.pending()
    try:
        fs.flush(timeout=args.timeout)
        while args.watch:
            time.sleep(1.0)
            fs.flush(timeout=args.timeout)
    except CacheTimeoutError as exc:
        print(f"tiercache flush: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tiercache flush: interrupted; what is left stays in the journal", file=sys.stderr)
        return 130
    summary = {
        "uploaded": len(before),
        "bytes": sum(p["size"] for p in before),
        "seconds": round(time.monotonic() - started, 3),
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"uploaded {summary['uploaded']} object(s), {human_bytes(summary['bytes'])} "
            f"in {summary['seconds']:.1f} s; nothing pending"
        )
    return 0
