"""``tiercache ls``: list a URL through the cache, marking the objects the local tier holds."""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    filesystem_from_args,
    human_bytes,
    print_json,
)
from tiercache.cli.progress import ProgressBar
from tiercache.mount.control import parse_url

NAME = "ls"
HELP = "list s3://BUCKET[/PREFIX] through the cache; C marks cached objects, P pending uploads"
EPILOG = """\
examples:
  tiercache ls s3://datasets/imagenet/train
  tiercache ls -R s3://ckpt/run-7 --json

Columns: C (in the local tier) or P (written, upload pending), size, modification time,
name. Directories end in '/'.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("url", metavar="URL", help="s3://BUCKET or s3://BUCKET/PREFIX")
    parser.add_argument(
        "-R", "--recursive", action="store_true", help="every object under the prefix"
    )
    add_tier_flags(parser)
    add_store_flags(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    bucket, prefix = parse_url(args.url)
    fs = filesystem_from_args(args)
    path = f"{bucket}/{prefix}".rstrip("/")
    rows = list(fs.find(path, detail=True).values()) if args.recursive else fs.ls(path, detail=True)
    progress = ProgressBar("checking the tier", total_items=len(rows))
    entries: list[dict[str, Any]] = []
    for row in rows:
        name = str(row["name"])
        is_file = row.get("type") == "file"
        entries.append(
            {
                "name": f"s3://{name}",
                "type": row.get("type"),
                "size": int(row.get("size") or 0),
                "mtime": row.get("mtime"),
                "cached": bool(is_file and fs.is_cached(name)),
                "pending": bool(row.get("pending", False)),
            }
        )
        progress.update(items=1, nbytes=int(row.get("size") or 0))
    progress.close()
    if args.json:
        print_json(entries)
        return 0
    for entry in entries:
        mark = "P" if entry["pending"] else "C" if entry["cached"] else " "
        if entry["type"] == "directory":
            print(f"{mark} {'':>12}  {'':<19}  {entry['name']}/")
            continue
        stamp = ""
        if entry["mtime"]:
            when = datetime.datetime.fromtimestamp(float(entry["mtime"]))
            stamp = when.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{mark} {human_bytes(entry['size']):>12}  {stamp:<19}  {entry['name']}")
    return 0
