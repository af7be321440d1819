"""``tiercache mount``: serve ``s3://bucket/prefix`` as a directory through the cache (FUSE)."""

from __future__ import annotations

import argparse
import os
import sys

from tiercache.cli.common import (
    add_json_flag,
    add_store_flags,
    add_tier_flags,
    config_from_args,
    filesystem_from_args,
    print_json,
    store_name,
)
from tiercache.metrics.serve import parse_listen, require_prometheus_client
from tiercache.mount.control import (
    MountError,
    check_mountpoint,
    parse_url,
    start_background,
    state_path,
)
from tiercache.mount.library import fuse_support
from tiercache.mount.runner import IMMUTABLE_ENTRY_TTL, MountSpec, serve

NAME = "mount"
HELP = "serve s3://BUCKET[/PREFIX] as a directory through the cache (FUSE)"
EPILOG = """\
examples:
  tiercache mount s3://datasets/imagenet /mnt/imagenet --read-only --consistency immutable
  tiercache mount s3://ckpt/run-7 /mnt/ckpt --local-dir /nvme/tiercache --local-max-bytes 500GiB
  tiercache unmount /mnt/ckpt

Reads come from the local tier (fetched from the store on first use; reads out of
order of a file not in the tier fetch just their ranges); the kernel keeps the pages of
a file across opens while its object is unchanged. Files
written through a read-write mount are uploaded behind: close() returns once the bytes
are durable in the local tier; `tiercache flush` finishes uploads after a crash.
Without --foreground the command returns once the mount is up; the mount process logs
to LOCAL_DIR/mounts/.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("url", metavar="URL", help="s3://BUCKET or s3://BUCKET/PREFIX")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory")
    add_tier_flags(parser)
    add_store_flags(parser)
    parser.add_argument(
        "--consistency",
        choices=("immutable", "ttl", "always"),
        help="when cached objects are checked against the store (default: TIERCACHE_CONSISTENCY)",
    )
    access = parser.add_mutually_exclusive_group()
    access.add_argument(
        "--read-only", dest="read_only", action="store_true", help="refuse writes (EROFS)"
    )
    access.add_argument(
        "--read-write", dest="read_only", action="store_false", help="allow writes (default)"
    )
    parser.add_argument(
        "-f", "--foreground", action="store_true", help="stay in the foreground until unmounted"
    )
    parser.add_argument(
        "--attr-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds attributes and listings are trusted (default: 1; the kernel trusts found "
        f"entries {IMMUTABLE_ENTRY_TTL:.0f} s on a --read-only mount with --consistency immutable)",
    )
    parser.add_argument("--allow-other", action="store_true", help="let other users read the mount")
    parser.add_argument(
        "--no-passthrough",
        dest="passthrough",
        action="store_false",
        help="serve every read from the mount process, never by FUSE passthrough (which, where "
        "the kernel, libfuse >= 3.16 and root allow it, lets the kernel read a warm file opened "
        "read-only from its tier copy, and refuses writers while such readers hold it: ETXTBSY)",
    )
    parser.add_argument(
        "--kernel-opens",
        action="store_true",
        help="with --read-only and --consistency immutable: the kernel opens and closes files "
        "itself, with no request to the mount, and keeps their pages across opens (for "
        "datasets of many small files); a file's first read on this mount is served by the "
        "mount process, never by passthrough",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="also serve the node's Prometheus metrics (as `tiercache metrics --listen` does) "
        "from the mount process; needs the metrics extra",
    )
    parser.add_argument("--debug", action="store_true", help="log every FUSE request")
    add_json_flag(parser)


def _absolute_tier_dirs(args: argparse.Namespace) -> dict[str, str]:
    """The tier directories as absolute paths: libfuse makes ``/`` the mount process's working
    directory once it serves, where a relative path names another directory (``statfs`` and
    the counters file would fail). From flags, the environment or the config file alike."""
    config = config_from_args(args)
    dirs = {"local_dir": config.local_dir, "shared_dir": config.shared_dir}
    return {name: os.path.abspath(path) for name, path in dirs.items() if path}


def run(args: argparse.Namespace) -> int:
    bucket, prefix = parse_url(args.url)
    support = fuse_support()
    if not support.usable:
        raise MountError(f"FUSE is not usable here: {support.problems[0]}")
    mountpoint = check_mountpoint(args.mountpoint)
    if args.attr_timeout is not None and args.attr_timeout < 0:
        raise MountError("--attr-timeout must be >= 0")
    if args.metrics_listen is not None:  # said here, not in the background mount's log
        parse_listen(args.metrics_listen)
        require_prometheus_client()
    fs = filesystem_from_args(args, **_absolute_tier_dirs(args))
    try:
        fs.info(bucket)  # the bucket exists and the credentials work, before anything mounts
    except FileNotFoundError:
        raise MountError(
            f"bucket {bucket!r} does not exist at {store_name(fs.store)}: create it, or check "
            "the URL and --endpoint-url"
        ) from None
    url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    immutable = bool(args.read_only) and fs.config.consistency == "immutable"
    if args.kernel_opens and not immutable:
        access = "read-only" if args.read_only else "read-write"
        raise MountError(
            "--kernel-opens needs --read-only and --consistency immutable (the kernel keeps "
            f"a file's pages across opens); this mount is {access} with consistency "
            f"{fs.config.consistency!r}"
        )
    spec = MountSpec(
        url=url,
        bucket=bucket,
        prefix=prefix,
        mountpoint=mountpoint,
        read_only=bool(args.read_only),
        attr_ttl=1.0 if args.attr_timeout is None else args.attr_timeout,
        entry_ttl=IMMUTABLE_ENTRY_TTL if immutable and args.attr_timeout is None else None,
        allow_other=args.allow_other,
        passthrough=args.passthrough,
        kernel_opens=args.kernel_opens,
        debug=args.debug,
        metrics_listen=args.metrics_listen,
    )
    if args.foreground:
        serve(spec, fs)
        return 0
    log_path = state_path(fs.config.local_dir, mountpoint, "log")
    argv = [sys.executable, "-m", "tiercache.cli", *args.argv, "--foreground"]
    pid = start_background(argv, mountpoint, log_path)
    report = {
        "url": url,
        "mountpoint": mountpoint,
        "pid": pid,
        "log": log_path,
        "read_only": spec.read_only,
        "consistency": fs.config.consistency,
        "local_dir": fs.config.local_dir,
    }
    if args.json:
        print_json(report)
    else:
        mode = "read-only" if spec.read_only else "read-write"
        print(f"mounted {url} on {mountpoint} ({mode}, pid {pid}, log {log_path})")
    return 0
