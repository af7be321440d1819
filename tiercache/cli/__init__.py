"""The ``tiercache`` command line: one module per subcommand, registered in ``COMMANDS``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tiercache.cli import (
    discard,
    doctor,
    evict,
    flush,
    fsck,
    ls,
    mount,
    prefetch,
    stats,
    status,
    unmount,
)
from tiercache.cli.common import Command
from tiercache.errors import TierCacheError

# Each command module offers ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args)``.
COMMANDS: tuple[Command, ...] = (
    mount,
    unmount,
    status,
    stats,
    ls,
    prefetch,
    flush,
    fsck,
    discard,
    evict,
    doctor,
)

_DESCRIPTION = """\
Operate a tiercache cache: mount a bucket, see what the cache holds, fill it ahead
of a job, finish its uploads.

Options come from flags, then TIERCACHE_* environment variables, then the [tiercache]
table of the config file (--config, TIERCACHE_CONFIG or ~/.config/tiercache/config.toml),
then defaults. The store's endpoint and credentials: --endpoint-url, then boto3's own
environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_PROFILE, ...), then the file's [s3]
table. Every command takes --json for machine-readable output and exits non-zero when it
fails; `tiercache COMMAND --help` shows examples.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiercache",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        child = sub.add_parser(
            command.NAME,
            help=command.HELP,
            description=command.HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(child)
        child.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # a background mount re-runs it
    try:
        code: int = args.run(args)
    except (TierCacheError, OSError) as exc:
        print(f"tiercache {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tiercache {args.command}: interrupted", file=sys.stderr)
        return 130
    return code
