"""``tiercache unmount``: unmount a tiercache mount (uploads go on in its process or via flush)."""

from __future__ import annotations

import argparse
import os

from tiercache.cli.common import add_json_flag, print_json
from tiercache.mount.control import unmount

NAME = "unmount"
HELP = "unmount a tiercache mount"
EPILOG = """\
examples:
  tiercache unmount /mnt/ckpt
  tiercache unmount --lazy /mnt/ckpt     # detach now, finish when the last file closes

Files closed before the unmount are durable in the local tier; the mount process keeps
uploading them as it exits, and `tiercache flush` uploads whatever is left.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("mountpoint", metavar="MOUNTPOINT")
    parser.add_argument(
        "--lazy", action="store_true", help="detach even if busy; finishes when files close"
    )
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    unmount(args.mountpoint, lazy=args.lazy)
    mountpoint = os.path.realpath(args.mountpoint)
    if args.json:
        print_json({"unmounted": mountpoint, "lazy": args.lazy})
    else:
        print(f"unmounted {mountpoint}")
    return 0
