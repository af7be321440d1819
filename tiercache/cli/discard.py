"""``tiercache discard``: drop writes that will not be uploaded (refused, lost, unwanted)."""

from __future__ import annotations

import argparse
from typing import Any

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    endpoint_flags,
    filesystem_from_args,
    print_json,
    report_error,
    store_name,
)
from tiercache.filesystem import TierCacheFileSystem
from tiercache.store.endpoint import store_label

NAME = "discard"
HELP = "drop pending, failed or lost writes under a path without uploading them"

EPILOG = """\
examples:
  tiercache discard my-bucket/tmp/bad-key.bin
  tiercache discard my-bucket/run-7/         # everything pending below a prefix

The bytes are removed from the tier; reads then get the store's version, if any.
A write is recorded with the store (endpoint) it is for: discard drops those of the
store it is pointed at (--endpoint-url), and exits 1, naming the other endpoint, when
the path's writes are all for another one, or when nothing is pending under the path.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("path", help="bucket/key, or a prefix ending in /")
    add_tier_flags(parser)
    add_store_flags(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    fs = filesystem_from_args(args)
    try:
        dropped = fs.discard(args.path)
    except ValueError as exc:  # no bucket in the path
        return report_error(args, str(exc))
    if not dropped:
        return _nothing_dropped(args, fs)
    if args.json:
        print_json({"discarded": dropped})
    else:
        print(f"discarded {len(dropped)} write(s)")
        for name in dropped:
            print(f"  {name}")
    return 0


def _nothing_dropped(args: argparse.Namespace, fs: TierCacheFileSystem) -> int:
    """Say why nothing under the path was dropped: its writes are for another endpoint (and
    how to discard them), or nothing is pending there."""
    path = TierCacheFileSystem._strip_protocol(args.path)  # as ``discard`` reads it
    elsewhere = [r for r in fs.pending_elsewhere() if _under(r["name"], path)]
    if not elsewhere:
        return report_error(
            args,
            f"nothing pending under {args.path} for {store_name(fs.store)} in "
            f"{fs.config.local_dir} (see: tiercache status)",
            discarded=[],
        )
    stores = sorted({r["store"] for r in elsewhere})
    how = "; ".join(f"tiercache discard {args.path} {endpoint_flags(s)}" for s in stores)
    return report_error(
        args,
        f"discarded nothing: {len(elsewhere)} write(s) under {args.path} are pending for "
        f"another endpoint ({', '.join(store_label(s) for s in stores)}) than "
        f"{store_name(fs.store)}, e.g. {elsewhere[0]['name']}; to discard them: {how}",
        discarded=[],
        elsewhere=[_row(r) for r in elsewhere],
    )


def _under(name: str, path: str) -> bool:
    """Whether the write ``name`` is one ``discard`` of ``path`` (no trailing ``/``) would
    drop: that object, and everything below ``path/``."""
    return name == path or name.startswith(path + "/")


def _row(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "endpoint": store_label(record["store"])}
