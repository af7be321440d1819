"""The ``tiercache`` command line: one module per subcommand, registered in ``COMMANDS``."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from tiercache.cli import (
    discard,
    doctor,
    evict,
    flush,
    fsck,
    ls,
    metrics,
    mount,
    prefetch,
    stats,
    status,
    unmount,
)
from tiercache.cli.common import Command, report_error
from tiercache.errors import TierCacheError

# Each command module offers ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args)``.
COMMANDS: tuple[Command, ...] = (
    mount,
    unmount,
    status,
    stats,
    metrics,
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


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are JSON on stdout when the command line asks for JSON."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            print(json.dumps({"error": f"{self.prog}: {message}", "usage": self.format_usage()}))
            sys.exit(2)
        super().error(message)


def build_parser(json_errors: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tiercache",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.json_errors = json_errors
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        child = sub.add_parser(
            command.NAME,
            help=command.HELP,
            description=command.HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        child.json_errors = json_errors
        command.add_arguments(child)
        child.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(json_errors="--json" in argv).parse_args(argv)
    args.argv = argv  # a background mount re-runs it
    try:
        code: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError as exc:
        if _stdout_gone():  # the reader went away (``tiercache status | head -1``)
            _drop_stdout()
            return 141
        return _fail(args, str(exc))
    except (TierCacheError, OSError) as exc:
        return _fail(args, str(exc), **getattr(exc, "details", {}))
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends it at once
        return _fail(args, "interrupted", code=130)
    return code


def _fail(args: argparse.Namespace, message: str, code: int = 1, **details: object) -> int:
    try:
        return report_error(args, message, code, **details)
    except BrokenPipeError:  # nobody reads the error either
        _drop_stdout()
        return code


def _stdout_gone() -> bool:
    """Whether stdout is a pipe nobody reads any more (poll reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, ValueError, OSError):
        return False


def _drop_stdout() -> None:
    """Send what is still buffered for stdout nowhere, so exiting does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, ValueError, OSError):
        pass
