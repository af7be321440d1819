"""``tiercache evict``: remove least-recently-used clean objects from the local or shared tier."""

from __future__ import annotations

import argparse
from typing import Any

from tiercache.cli.common import (
    add_json_flag,
    add_tier_flags,
    filesystem_from_args,
    human_bytes,
    print_json,
)
from tiercache.config import parse_size
from tiercache.errors import ConfigError
from tiercache.tiers.entry import read_meta
from tiercache.tiers.local import LocalTier

NAME = "evict"
HELP = "remove least-recently-used cached objects until the tier is under a target size"
EPILOG = """\
examples:
  tiercache evict --dry-run --target 0      # what would go if the tier were emptied
  tiercache evict --target 100GiB           # shrink the tier to 100 GiB
  tiercache evict                           # down to the budget (--local-max-bytes)
  tiercache evict --tier shared --shared-dir /gpfs/cache --dry-run

Objects pinned, open for reading, being fetched, or written and not yet uploaded are never
removed.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_tier_flags(parser)
    parser.add_argument(
        "--target",
        metavar="BYTES",
        help="bytes to leave in the tier, e.g. 0 or 100GiB (default: the tier's budget)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would be removed; remove nothing"
    )
    parser.add_argument(
        "--tier",
        choices=("local", "shared"),
        default="local",
        help="which tier to evict from (shared: needs --shared-dir or TIERCACHE_SHARED_DIR)",
    )
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    fs = filesystem_from_args(args)
    target = None if args.target is None else parse_size(args.target, "--target")
    if target is not None and target < 0:
        raise ConfigError("--target must be >= 0")
    tier = fs.tier_named(args.tier)
    before = tier.usage(fresh=True)
    # Names come from the entries' metadata, which a real eviction removes: read them first.
    planned = fs.evict(target, dry_run=True, tier=args.tier)
    names = {entry_id: _source(tier, entry_id) for entry_id in planned.removed}
    report = planned if args.dry_run else fs.evict(target, dry_run=False, tier=args.tier)
    result: dict[str, Any] = {
        "tier": args.tier,
        "dry_run": args.dry_run,
        "target_bytes": tier.max_bytes if target is None else target,
        "usage_before": before,
        "usage_after": report.usage_after,
        "removed_bytes": report.removed_bytes,
        "kept_busy": report.kept_busy,
        "kept_pinned": report.kept_pinned,
        "removed": [names.get(entry_id) or entry_id for entry_id in report.removed],
    }
    if args.json:
        print_json(result)
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for name in result["removed"]:
        print(f"{verb}  {name}")
    kept = (
        f"; {report.kept_busy + report.kept_pinned} kept (pinned, open, fetching or not uploaded)"
    )
    print(
        f"{verb} {len(result['removed'])} object(s), {human_bytes(result['removed_bytes'])}; "
        f"tier {human_bytes(before)} -> {human_bytes(result['usage_after'])}"
        + (kept if report.kept_busy + report.kept_pinned else "")
    )
    return 0


def _source(tier: LocalTier, entry_id: str) -> str | None:
    meta = read_meta(tier.paths(entry_id).meta)
    return meta.source if meta is not None else None
