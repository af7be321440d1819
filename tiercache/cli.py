"""The ``tiercache`` command: ``status`` of a cache and ``flush`` of its pending uploads."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from tiercache.config import TierCacheConfig
from tiercache.errors import CacheTimeoutError, TierCacheError
from tiercache.filesystem import TierCacheFileSystem
from tiercache.journal import Journal
from tiercache.tiers.local import LocalTier

MiB = 1024 * 1024


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiercache",
        description="Inspect a tiercache cache and finish its uploads. Options not given here "
        "come from TIERCACHE_* variables; the store's endpoint and credentials from boto3's "
        "own (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_PROFILE, ...).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="tier usage and the uploads still pending")
    status.add_argument("--local-dir", help="the local tier (default: TIERCACHE_LOCAL_DIR)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    flush = sub.add_parser(
        "flush", help="upload everything written behind and not yet in the store"
    )
    flush.add_argument("--local-dir", help="the local tier (default: TIERCACHE_LOCAL_DIR)")
    flush.add_argument("--endpoint-url", help="S3 endpoint (default: boto3's configuration)")
    flush.add_argument("--timeout", type=float, help="give up after this many seconds")
    flush.add_argument(
        "--watch", action="store_true", help="keep draining new uploads until interrupted"
    )
    flush.add_argument("--json", action="store_true", help="machine-readable summary")
    return parser


def _config(local_dir: str | None) -> TierCacheConfig:
    return TierCacheConfig.from_options({"local_dir": local_dir} if local_dir else {})


def _status(args: argparse.Namespace) -> int:
    config = _config(args.local_dir)
    tier = LocalTier(config.local_dir, config.local_max_bytes, config.file_mode, config.dir_mode)
    journal = Journal(tier.root, config.file_mode, config.dir_mode)
    now = time.time()
    pending: list[dict[str, Any]] = [
        {
            "name": f"{r.bucket}/{r.key}",
            "size": r.size,
            "age_s": round(now - r.created_at, 1),
            "store": r.namespace,
        }
        for r in journal.records()
    ]
    report: dict[str, Any] = {
        "local_dir": tier.root,
        "local_usage_bytes": tier.usage(fresh=True),
        "local_max_bytes": config.local_max_bytes,
        "pending_uploads": len(pending),
        "pending_bytes": sum(p["size"] for p in pending),
        "pending": pending,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"local tier  {report['local_dir']}")
    print(
        f"  usage     {report['local_usage_bytes'] / MiB:,.1f} MiB "
        f"of {report['local_max_bytes'] / MiB:,.0f} MiB"
    )
    print(f"  pending   {len(pending)} upload(s), {report['pending_bytes'] / MiB:,.1f} MiB")
    for row in pending:
        print(f"    {row['name']}  {row['size'] / MiB:,.1f} MiB  waiting {row['age_s']:.0f} s")
    return 0


def _flush(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.local_dir:
        options["local_dir"] = args.local_dir
    target = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    fs = TierCacheFileSystem(target_options=target, skip_instance_cache=True, **options)
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
        print(json.dumps(summary))
    else:
        print(
            f"uploaded {summary['uploaded']} object(s), {summary['bytes'] / MiB:,.1f} MiB "
            f"in {summary['seconds']:.1f} s; nothing pending"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        return _status(args) if args.command == "status" else _flush(args)
    except (TierCacheError, OSError) as exc:
        print(f"tiercache {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
