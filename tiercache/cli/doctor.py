"""``tiercache doctor``: check the tier directories, the store, and FUSE; say what to fix."""

from __future__ import annotations

import argparse
import errno
import os
import pwd
import stat
import tempfile
from dataclasses import asdict, dataclass

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    config_from_args,
    file_settings,
    human_bytes,
    print_json,
    store_name,
    target_options,
)
from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError, StoreUnavailableError, TierCacheError
from tiercache.mount.control import MountError, parse_url
from tiercache.mount.library import fuse_support
from tiercache.store.retry import RetryPolicy
from tiercache.store.s3 import S3Store
from tiercache.store.s3_options import S3Options

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
        usable = _tier_usable_check(config)
        if usable is not None:
            checks.append(usable)
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
        make = f"sudo install -d -m {config.dir_mode:o} -o {_user()} {root}"
        return [
            Check(
                "local tier",
                False,
                f"{root} does not exist and {parent} is not writable",
                f"{make}, or choose --local-dir",
            )
        ]
    if not os.path.isdir(root) or os.path.islink(root):
        return [Check("local tier", False, f"{root} is not a directory", "choose --local-dir")]
    checks = [_privacy_check(config)]
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
        checks.append(Check("tier writable", True, f"{root} accepts new files"))
    except OSError as exc:
        fix = f"chmod u+w {root}"
        if exc.errno == errno.EROFS:
            fix = f"choose a --local-dir on a filesystem mounted read-write ({root}'s is not)"
        elif os.stat(root).st_uid != os.geteuid():
            fix = f"sudo chown {_user()} {root}"
        checks.append(Check("tier writable", False, f"{root}: {exc.strerror}", fix))
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


def _privacy_check(config: TierCacheConfig) -> Check:
    """Whether other users can change the tier or read what it holds.

    A root more open than ``dir_mode`` is a problem when others may write to it (they could
    remove entries or plant the directories tiercache writes into). One they may only list or
    enter (a ``mkdir`` under umask 022 makes 0755) shows them the names of the tier's own
    directories, each made ``dir_mode`` and holding files of ``file_mode``: a problem only if
    one of those entries is open too, which is checked one level down.
    """
    root = config.local_dir
    allowed = config.dir_mode
    mode = stat.S_IMODE(os.stat(root).st_mode) & 0o777
    extra = mode & ~allowed
    if extra & 0o022:
        return Check(
            "tier private",
            False,
            f"{root} has mode {mode:04o}: other users may add, rename or remove what is in it",
            f"chmod {allowed:o} {root}",
        )
    if not extra:
        return Check("tier private", True, f"{root} has mode {mode:04o}")
    exposed = _open_entries(config)
    if exposed:
        fixes = "; ".join(f"chmod {limit:o} {path}" for path, limit in exposed)
        return Check(
            "tier private",
            False,
            f"{root} has mode {mode:04o} and other users may enter or read "
            + ", ".join(os.path.basename(path) for path, _ in exposed),
            fixes,
        )
    return Check(
        "tier private",
        True,
        f"{root} has mode {mode:04o}: other users see the names in it, and nothing in it is "
        f"open to them (directories {allowed:04o}, files {config.file_mode:04o} at most)",
    )


def _open_entries(config: TierCacheConfig) -> list[tuple[str, int]]:
    """The tier root's entries more open than tiercache makes them, with the mode each wants."""
    exposed = []
    with os.scandir(config.local_dir) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                continue  # its own mode means nothing; tiercache refuses to use it
            limit = config.dir_mode if stat.S_ISDIR(st.st_mode) else config.file_mode
            if stat.S_IMODE(st.st_mode) & 0o777 & ~limit:
                exposed.append((entry.path, limit))
    return sorted(exposed)


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # no passwd entry (a container's arbitrary uid)
        return str(os.geteuid())


def _store(args: argparse.Namespace) -> S3Store:
    """The store the flags, environment and config file name, without a tier: what a failing
    tier does is the tier checks' to say. A check must answer quickly: one attempt, short
    timeouts."""
    options = S3Options.from_storage_options(target_options(args))
    return S3Store(options, retry=RetryPolicy(attempts=1), connect_timeout=5, read_timeout=10)


def _store_check(args: argparse.Namespace) -> Check:
    try:
        bucket = parse_url(args.url)[0] if args.url else None
    except MountError as exc:
        return Check("store", False, str(exc), "give the URL as s3://BUCKET")
    try:
        store = _store(args)
        if bucket is not None:
            next(iter(store.list_objects(bucket, "", "/")), None)  # raises if no bucket
            return Check("store", True, f"bucket {bucket} reachable at {store_name(store)}")
        count = len(store.list_buckets())
        return Check("store", True, f"{count} bucket(s) listed at {store_name(store)}")
    except ConfigError as exc:
        return Check(
            "store",
            False,
            str(exc),
            "correct --endpoint-url / AWS_ENDPOINT_URL or [s3] in the config",
        )
    except FileNotFoundError as exc:
        return Check("store", False, str(exc), "check the bucket name in the URL")
    except PermissionError as exc:
        return Check(
            "store",
            False,
            str(exc),
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or [s3] in the config",
        )
    except (StoreUnavailableError, ConnectionError, TimeoutError) as exc:
        return Check(
            "store", False, str(exc), "check --endpoint-url / AWS_ENDPOINT_URL and the network"
        )
    except (TierCacheError, OSError) as exc:
        return Check(
            "store",
            False,
            str(exc),
            "the store's answer above says what it refused: check --endpoint-url, --region "
            "and the credentials",
        )


def _tier_usable_check(config: TierCacheConfig) -> Check | None:
    """Whether the tier's own directories, where they exist, are directories the cache may
    use (no file or symlink in their place); None where the tier checks already failed."""
    root = config.local_dir
    if not os.path.isdir(root) or os.path.islink(root):
        return None
    for name in ("objects", "staging"):
        path = os.path.join(root, name)
        if os.path.lexists(path) and (os.path.islink(path) or not os.path.isdir(path)):
            return Check(
                "tier usable",
                False,
                f"{path} is a {'symlink' if os.path.islink(path) else 'file'}, not a directory",
                f"remove {path}, or choose another --local-dir",
            )
    return None


def _conditional_writes_check(args: argparse.Namespace) -> Check:
    bucket, key = parse_url(args.url)
    try:
        honoured = _store(args).probe_conditional_writes(bucket, key)
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
