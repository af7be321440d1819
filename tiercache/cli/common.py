"""What the subcommands share: tier and store flags, building the config or filesystem, output."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Protocol

from tiercache.config import TierCacheConfig
from tiercache.config_file import FileSettings, load_config, store_options
from tiercache.config_file import tier_options as merge_tier_options
from tiercache.filesystem import TierCacheFileSystem
from tiercache.store.base import ObjectStore
from tiercache.store.endpoint import AWS_NAMESPACE, store_label
from tiercache.store.s3 import S3Store

MiB = 1024 * 1024


class Command(Protocol):
    """A subcommand module."""

    NAME: str
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def add_tier_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that choose the cache: config file, local and shared tier directories, budgets."""
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="TOML config file (default: TIERCACHE_CONFIG, ~/.config/tiercache/config.toml)",
    )
    parser.add_argument(
        "--local-dir", metavar="DIR", help="the local tier (default: TIERCACHE_LOCAL_DIR)"
    )
    parser.add_argument(
        "--local-max-bytes",
        metavar="SIZE",
        help="byte budget of the local tier, e.g. 500GiB (default: TIERCACHE_LOCAL_MAX_BYTES)",
    )
    parser.add_argument(
        "--shared-dir",
        metavar="DIR",
        help="the shared tier on a filesystem every host mounts (default: TIERCACHE_SHARED_DIR)",
    )
    parser.add_argument(
        "--shared-max-bytes",
        metavar="SIZE",
        help="byte budget of the shared tier (default: TIERCACHE_SHARED_MAX_BYTES)",
    )


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that choose the store: ``--endpoint-url``, ``--region``."""
    parser.add_argument(
        "--endpoint-url", metavar="URL", help="S3 endpoint (default: boto3's configuration)"
    )
    parser.add_argument(
        "--region", metavar="NAME", help="S3 region (default: boto3's configuration)"
    )


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def file_settings(args: argparse.Namespace) -> FileSettings:
    """The config file the flags or environment name (read once per command)."""
    cached = getattr(args, "_file_settings", None)
    if cached is None:
        cached = load_config(getattr(args, "config", None))
        args._file_settings = cached
    return cached


def tier_options(args: argparse.Namespace) -> dict[str, Any]:
    """The tiercache options: flags over environment over the config file over defaults."""
    # A flag's dest is its option's name, so a flag added to a parser needs no entry here.
    flags = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TierCacheConfig)
        if getattr(args, f.name, None) is not None
    }
    return merge_tier_options(file_settings(args), flags)


def target_options(args: argparse.Namespace) -> dict[str, Any]:
    """The store options: flags over ``AWS_*`` environment over the config file."""
    flags = {
        "endpoint_url": getattr(args, "endpoint_url", None),
        "region": getattr(args, "region", None),
    }
    return store_options(file_settings(args), flags)


def config_from_args(args: argparse.Namespace) -> TierCacheConfig:
    return TierCacheConfig.from_options(tier_options(args))


def filesystem_from_args(args: argparse.Namespace, **overrides: Any) -> TierCacheFileSystem:
    """A filesystem over the store and tiers the flags, environment and config file name."""
    options = {**tier_options(args), **overrides}
    return TierCacheFileSystem(
        target_options=target_options(args), skip_instance_cache=True, **options
    )


def store_name(store: ObjectStore) -> str:
    """The store as the user named it, for messages: its endpoint URL as configured (or
    ``AWS S3``), never its repr."""
    if isinstance(store, S3Store) and store.endpoint != "aws":
        return store.endpoint
    return store_label(store.namespace)


def endpoint_flags(namespace: str) -> str:
    """The flags that point a command at the store of a journal record's ``namespace``."""
    if namespace == AWS_NAMESPACE:
        return "no --endpoint-url (and AWS_ENDPOINT_URL unset)"
    return f"--endpoint-url {store_label(namespace)}"


def print_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))


def report_error(args: argparse.Namespace, message: str, code: int = 1, **details: Any) -> int:
    """Say why the command failed (JSON on stdout with ``--json``, else one line on stderr)."""
    if getattr(args, "json", False):
        print_json({"error": message, "command": args.command, **details})
    else:
        print(f"tiercache {args.command}: {message}", file=sys.stderr)
    return code


def human_bytes(nbytes: float) -> str:
    """``1536`` → ``"1.5 KiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
