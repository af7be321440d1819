"""``tiercache doctor``: check the tier directories, the store, and FUSE; say what to fix."""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
from dataclasses import asdict, dataclass

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    config_from_args,
    file_settings,
    filesystem_from_args,
    human_bytes,
    print_json,
)
from tiercache.config import TierCacheConfig
from tiercache.errors import TierCacheError
from tiercache.mount.control import parse_url
from tiercache.mount.library import fuse_support

NAME = "doctor"
HELP = "check the local tier, the store's reachability and credentials, and FUSE"
EPILOG = """\
examples:
  tiercache doctor
  tiercache doctor s3://datasets --local-dir /nvme/tiercache --json

Prints one line per check, OK or FAIL with what to fix; exits 1 if any check fails.
Given a URL, the store check is a HEAD of its bucket; otherwise a ListBuckets. Given a
URL, --probe-writes also finds out whether the store honours conditional writes (uploads
are then fenced against a paused host): it writes, then deletes, a scratch object named
.tiercache-probe-* beside the URL's key.
"""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("url", nargs="?", metavar="URL", help="s3://BUCKET to check access to")
    parser.add_argument(
        "--probe-writes",
        action="store_true",
        help="with a URL: find out whether the store honours conditional writes (writes and "
        "deletes a scratch object)",
    )
    add_tier_flags(parser)
    add_store_flags(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    checks: list[Check] = []
    config: TierCacheConfig | None = None
    try:
        settings = file_settings(args)
        config = config_from_args(args)
    except TierCacheError as exc:
        checks.append(Check("config", False, str(exc), "correct the option or the config file"))
    else:
        where = settings.path or "no config file"
        checks.append(Check("config", True, f"{where}; local_dir {config.local_dir}"))
    if config is not None:
        checks.extend(_tier_checks(config))
        checks.append(_store_check(args))
        if args.url and args.probe_writes:
            checks.append(_conditional_writes_check(args))
    checks.extend(_fuse_checks())
    failed = [c for c in checks if not c.ok]
    if args.json:
        print_json({"ok": not failed, "checks": [asdict(c) for c in checks]})
    else:
        for check in checks:
            line = f"{'OK  ' if check.ok else 'FAIL'}  {check.name}: {check.detail}"
            if check.fix:
                line += f"; fix: {check.fix}"
            print(line)
    return 1 if failed else 0


def _tier_checks(config: TierCacheConfig) -> list[Check]:
    root = config.local_dir
    if not os.path.exists(root):
        parent = os.path.dirname(os.path.abspath(root)) or "/"
        if os.access(parent, os.W_OK):
            return [Check("local tier", True, f"{root} does not exist yet (created private)")]
        return [
            Check(
                "local tier",
                False,
                f"{root} does not exist and {parent} is not writable",
                f"mkdir -m 700 {root} as a user who may, or choose --local-dir",
            )
        ]
    if not os.path.isdir(root) or os.path.islink(root):
        return [Check("local tier", False, f"{root} is not a directory", "choose --local-dir")]
    checks = []
    mode = stat.S_IMODE(os.stat(root).st_mode)
    allowed = config.dir_mode
    private = mode & ~allowed == 0
    checks.append(
        Check(
            "tier private",
            private,
            f"{root} has mode {mode:04o}" + ("" if private else f", more open than {allowed:04o}"),
            "" if private else f"chmod {allowed:o} {root}",
        )
    )
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
        checks.append(Check("tier writable", True, f"{root} accepts new files"))
    except OSError as exc:
        checks.append(
            Check("tier writable", False, f"{root}: {exc.strerror}", f"chown/chmod {root}")
        )
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    enough = free >= min(config.local_max_bytes, 1 << 30)
    checks.append(
        Check(
            "free space",
            enough,
            f"{human_bytes(free)} free for a budget of {human_bytes(config.local_max_bytes)}",
            "" if enough else "free space on the tier's filesystem or lower --local-max-bytes",
        )
    )
    return checks


def _store_check(args: argparse.Namespace) -> Check:
    try:
        # A check must answer quickly: one attempt, short timeouts.
        fs = filesystem_from_args(args, retries=1, connect_timeout=5, read_timeout=10)
        if args.url:
            bucket, _ = parse_url(args.url)
            fs.info(bucket)
            return Check("store", True, f"bucket {bucket} reachable at {fs.store!r}")
        count = len(fs.store.list_buckets())
        return Check("store", True, f"{count} bucket(s) listed at {fs.store!r}")
    except FileNotFoundError as exc:
        return Check("store", False, str(exc), "check the bucket name in the URL")
    except PermissionError as exc:
        return Check(
            "store",
            False,
            str(exc),
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or [s3] in the config",
        )
    except (TierCacheError, OSError) as exc:
        return Check(
            "store", False, str(exc), "check --endpoint-url / AWS_ENDPOINT_URL and the network"
        )


def _conditional_writes_check(args: argparse.Namespace) -> Check:
    bucket, key = parse_url(args.url)
    try:
        fs = filesystem_from_args(args, retries=1, connect_timeout=5, read_timeout=10)
        honoured = fs.store.probe_conditional_writes(bucket, key)
    except (TierCacheError, OSError) as exc:
        return Check("conditional writes", False, str(exc), "check write access to the bucket")
    if honoured:
        return Check("conditional writes", True, "honoured: uploads are fenced by the store")
    return Check(
        "conditional writes",
        True,
        "not honoured: uploads are fenced by their claim alone (a request on the wire from a "
        "host paused past its lease can still land; see the shared-tier guide)",
    )


def _fuse_checks() -> list[Check]:
    support = fuse_support()
    checks = []
    for name, problem, fine in (
        ("fuse library", support.library, "libfuse found"),
        ("fuse binding", support.binding, "mfusepy loads libfuse"),
        ("fusermount", support.fusermount, "fusermount3 found"),
        ("/dev/fuse", support.device, "present and usable"),
    ):
        if problem is None:
            checks.append(Check(name, True, fine))
        else:
            what, _, fix = problem.partition(" (")
            checks.append(Check(name, False, what, fix.rstrip(")") or "see tiercache doctor"))
    return checks
