"""``tiercache stats``: the cache's counters (``fs.stats()``) and those of each active mount."""

from __future__ import annotations

import argparse
from typing import Any

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    filesystem_from_args,
    human_bytes,
    print_json,
)
from tiercache.cli.which_tier import budget_in_use
from tiercache.metrics.node import NodeReader
from tiercache.mount.control import read_mount_stats, running_mounts

NAME = "stats"
HELP = "counters: hits, misses, bytes, store requests, tier usage, and each mount's own"
EPILOG = """\
examples:
  tiercache stats
  tiercache stats --json | jq '.mounts[].stats.hits'
  tiercache stats --json | jq '.node.hits'

Counters live in the process that does the work: a mount publishes its own every second
(listed under "mounts"); the top-level counters are this command's, so they show the
tier's usage and budget. "node" adds up every process that used this local tier, those
that have exited included: the totals `tiercache metrics` serves. No credential appears
in the output.
"""

_SHOWN = ("hits", "misses", "bytes_read", "bytes_fetched", "bytes_written", "uploads", "evictions")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_tier_flags(parser)
    add_store_flags(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    fs = filesystem_from_args(args)
    mounts = running_mounts()
    report: dict[str, Any] = {
        **fs.stats(),
        "local_dir": fs.config.local_dir,
        "pending_uploads": len(fs.pending()),
        "node": NodeReader(fs.config).counters(),
        "mounts": [],
    }
    # The budget the running mounts of the tier use, not this command's options.
    report["local_max_bytes"], _ = budget_in_use(
        mounts, fs.tier.root, "local", report["local_max_bytes"]
    )
    for mount in mounts:
        # A mount publishes its counters under its own tier, which its record names.
        published = read_mount_stats(mount.local_dir or fs.config.local_dir, mount.mountpoint)
        report["mounts"].append(
            {
                "mountpoint": mount.mountpoint,
                "url": mount.url,
                "pid": mount.pid or (published.get("pid") if published else None),
                "local_dir": mount.local_dir,
                "stats": published.get("stats") if published else None,
            }
        )
    if args.json:
        print_json(report)
        return 0
    print(f"local tier  {report['local_dir']}")
    print(
        f"  usage     {human_bytes(report['local_usage_bytes'])} "
        f"of {human_bytes(report['local_max_bytes'])}; "
        f"{report['pending_uploads']} upload(s) pending"
    )
    print("node        every process that used this tier, exited ones included")
    _print_counters(report["node"])
    for mount in report["mounts"]:
        print(f"mount {mount['mountpoint']}  {mount['url']}")
        if mount["stats"] is None:
            print("  (no counters: the mount uses another local tier, or just started)")
            continue
        _print_counters(mount["stats"])
    return 0


def _print_counters(counters: dict[str, Any]) -> None:
    for name in _SHOWN:
        value = counters.get(name, 0)
        shown = human_bytes(value) if name.startswith("bytes") else f"{value:,.0f}"
        print(f"  {name:<14}{shown}")
