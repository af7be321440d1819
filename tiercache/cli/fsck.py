"""``tiercache fsck``: reconcile the upload journal with the tier and scrub cached entries."""

from __future__ import annotations

import argparse
import sys

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    filesystem_from_args,
    print_json,
)

NAME = "fsck"
HELP = "check the tier: repair or report pending writes, evict corrupt cached entries"

EPILOG = """\
examples:
  tiercache fsck                        # journal, leftovers and a digest check of every entry
  tiercache fsck --no-scrub --json      # journal and leftovers only (fast)

Pending writes whose record or bytes a crash damaged are re-journaled from the bytes the tier
still holds, or reported LOST by name. A pending write whose cache entry is damaged or gone
(metadata garbled or missing, data truncated or removed) is published again from the journal's
own copy of its bytes, and reported DAMAGED; if that copy is damaged too it is LOST. With the
scrub, every whole cached entry is checked against its xxh3 digest: a corrupt clean entry is
evicted (the next read fetches it again), a corrupt pending write is restored from its journal
copy or reported LOST. Exit 0: nothing damaged, lost, failed or corrupt; 1 otherwise.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_tier_flags(parser)
    add_store_flags(parser)
    parser.add_argument(
        "--no-scrub", action="store_true", help="skip the digest check of cached entries"
    )
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    fs = filesystem_from_args(args)
    report = fs.fsck(scrub=not args.no_scrub)
    bad = [p for p in report["pending"] if p["state"] != "dirty"]
    if args.json:
        print_json(report)
    else:
        print(
            f"checked {report['entries_checked']} entries; repaired {len(report['repaired'])} "
            f"pending write(s); evicted {len(report['corrupt_evicted'])} corrupt entries; "
            f"removed {report['leftovers_removed']} leftover file(s)"
        )
        for name in report["corrupt_evicted"]:
            print(f"  corrupt, evicted: {name}")
        for name in report["damaged"]:
            print(
                f"  DAMAGED: {name}: its cache entry was damaged; restored from the journal's "
                "copy, it is still to be uploaded",
                file=sys.stderr,
            )
        for row in bad:
            print(f"  {row['state'].upper()}: {row['name']}: {row['last_error']}", file=sys.stderr)
    return 1 if bad or report["corrupt_evicted"] or report["damaged"] else 0
