"""``tiercache discard``: drop writes that will not be uploaded (refused, lost, unwanted)."""

from __future__ import annotations

import argparse

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    filesystem_from_args,
    print_json,
)

NAME = "discard"
HELP = "drop pending, failed or lost writes under a path without uploading them"

EPILOG = """\
examples:
  tiercache discard my-bucket/tmp/bad-key.bin
  tiercache discard my-bucket/run-7/         # everything pending below a prefix

The bytes are removed from the tier; reads then get the store's version, if any.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("path", help="bucket/key, or a prefix ending in /")
    add_tier_flags(parser)
    add_store_flags(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    fs = filesystem_from_args(args)
    dropped = fs.discard(args.path)
    if args.json:
        print_json({"discarded": dropped})
    else:
        print(f"discarded {len(dropped)} write(s)")
        for name in dropped:
            print(f"  {name}")
    return 0
