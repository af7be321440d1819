"""What the subcommands share: tier and store flags, building the config or filesystem, output."""

from __future__ import annotations

import argparse
import json
from typing import Any, Protocol

from tiercache.config import TierCacheConfig
from tiercache.filesystem import TierCacheFileSystem

MiB = 1024 * 1024


class Command(Protocol):
    """A subcommand module."""

    NAME: str
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def add_tier_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that choose the cache: ``--local-dir``."""
    parser.add_argument("--local-dir", help="the local tier (default: TIERCACHE_LOCAL_DIR)")


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that choose the store: ``--endpoint-url``."""
    parser.add_argument("--endpoint-url", help="S3 endpoint (default: boto3's configuration)")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def tier_options(args: argparse.Namespace) -> dict[str, Any]:
    """The tiercache options the flags set (the rest come from the environment)."""
    options: dict[str, Any] = {}
    if getattr(args, "local_dir", None):
        options["local_dir"] = args.local_dir
    return options


def config_from_args(args: argparse.Namespace) -> TierCacheConfig:
    return TierCacheConfig.from_options(tier_options(args))


def filesystem_from_args(args: argparse.Namespace, **extra: Any) -> TierCacheFileSystem:
    """A filesystem over the store and tiers the flags name (``extra``: more options)."""
    endpoint = getattr(args, "endpoint_url", None)
    target = {"endpoint_url": endpoint} if endpoint else {}
    return TierCacheFileSystem(
        target_options=target, skip_instance_cache=True, **tier_options(args), **extra
    )


def print_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))


def human_bytes(nbytes: float) -> str:
    """``1536`` → ``"1.5 KiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
