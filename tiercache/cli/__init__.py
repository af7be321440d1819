"""The ``tiercache`` command line: one module per subcommand, registered in ``COMMANDS``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tiercache.cli import flush, prefetch, status
from tiercache.cli.common import Command
from tiercache.errors import TierCacheError

# Each command module offers ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args)``.
COMMANDS: tuple[Command, ...] = (status, flush, prefetch)

_DESCRIPTION = """\
Operate a tiercache cache: see what it holds, fill it ahead of a job, finish its uploads.

Options not given as flags come from TIERCACHE_* environment variables; the store's
endpoint and credentials from boto3's own configuration (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_PROFILE, ...). Every command takes --json for machine-readable
output and exits non-zero when it fails.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiercache",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        child = sub.add_parser(command.NAME, help=command.HELP, description=command.HELP)
        command.add_arguments(child)
        child.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except (TierCacheError, OSError) as exc:
        print(f"tiercache {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tiercache {args.command}: interrupted", file=sys.stderr)
        return 130
    return code
