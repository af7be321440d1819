"""Which local tier ``status``/``flush`` look at, and the budget its running mounts use.

The tier named, or that of this user's running mount; other users' mounts never choose it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from tiercache.cli.common import config_from_args, tier_options
from tiercache.errors import TierCacheError
from tiercache.mount.control import RunningMount, read_mount_stats, running_mounts


class TierChoiceError(TierCacheError):
    """Which tier to look at is not clear; the message names the flags that say it."""

    def __init__(self, message: str, mounts: list[RunningMount]) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = {"mounts": [m.to_json() for m in mounts]}


def add_mount_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mount",
        metavar="PATH",
        help="the tiers of the tiercache mount on PATH (default: those of the running mount "
        "when --local-dir is not given)",
    )


def choose_tier(args: argparse.Namespace) -> list[RunningMount]:
    """Point ``args`` at the tier to look at; returns the host's running mounts.

    ``--local-dir`` wins; ``--mount PATH`` takes that mount's tiers. Otherwise the tier the
    environment or config file names, or by default that of this user's running mounts when
    they all share one. A tier none of this user's running mounts uses while they run, or
    several mount tiers and no default among them, is refused: answering "nothing pending"
    for the wrong tier would read as "everything is in the store". Other users' mounts
    (their processes run as another user) never choose, nor refuse, this user's tier: it is
    the one the flags, environment or config file resolve to, as for ``prefetch``.
    """
    mounts = running_mounts()
    if getattr(args, "mount", None):
        _use_mount(args, _mount_at(args.mount, mounts))
        return mounts
    if args.local_dir is not None:
        return mounts
    own = [m for m in mounts if m.local_dir and is_this_users(m)]
    tiers = sorted({m.local_dir for m in own if m.local_dir})
    if not tiers:
        return mounts
    configured = os.path.realpath(config_from_args(args).local_dir)
    source = _configured_by(args)
    if source is not None and configured in tiers:
        return mounts
    if source is None and len(tiers) == 1:
        _use_mount(args, next(m for m in own if m.local_dir == tiers[0]))
        return mounts
    uses = "; ".join(f"{m.mountpoint} uses {m.local_dir}" for m in own)
    if source is None:
        message = f"the running mounts use different local tiers ({uses})"
    else:
        message = f"the local tier {configured} ({source}) is no running mount's ({uses})"
    raise TierChoiceError(
        f"{message}: name the tier with --local-dir DIR or the mount with --mount PATH", mounts
    )


def is_this_users(mount: RunningMount) -> bool:
    """Whether the mount's process runs as this user (a mount with no record, or whose
    process is gone, is not known to be). Where ``/proc`` is missing, every recorded mount
    counts as this user's: records are kept per user."""
    if mount.pid is None:
        return False
    if not os.path.isdir("/proc/self"):
        return True
    try:
        return os.stat(f"/proc/{mount.pid}").st_uid == os.geteuid()
    except OSError:
        return False


def budget_in_use(
    mounts: list[RunningMount], root: str, tier: str, configured: int
) -> tuple[int, str | None]:
    """The budget the running cache holds the ``tier`` (``local``, ``shared``) at ``root``
    to, and the mount that set it; ``configured`` and None when no running mount of the tier
    has said (this command's options then give it). Mounts that differ each evict to their
    own, so the tier stays within the smallest."""
    budgets = mount_budgets(mounts, root, tier)
    if not budgets:
        return configured, None
    mountpoint = min(budgets, key=lambda m: (budgets[m], m))
    return budgets[mountpoint], mountpoint


def mount_budgets(mounts: list[RunningMount], root: str, tier: str = "local") -> dict[str, int]:
    """The byte budget each running mount that uses the ``tier`` at ``root`` holds it to, by
    mountpoint, as the mount last published it with its counters (a mount that has not
    published them yet is left out)."""
    budgets: dict[str, int] = {}
    for mount in mounts:
        if mount.local_dir is None or getattr(mount, f"{tier}_dir") != root:
            continue
        published = read_mount_stats(mount.local_dir, mount.mountpoint) or {}
        stats = published.get("stats")
        value = stats.get(f"{tier}_max_bytes") if isinstance(stats, dict) else None
        if published.get("pid") == mount.pid and type(value) is int:
            budgets[mount.mountpoint] = value
    return budgets


def _configured_by(args: argparse.Namespace) -> str | None:
    """What names the local tier when no flag does (None: the built-in default)."""
    if os.environ.get("TIERCACHE_LOCAL_DIR"):
        return "from TIERCACHE_LOCAL_DIR"
    if "local_dir" in tier_options(args):
        return "from the config file"
    return None


def _mount_at(path: str, mounts: list[RunningMount]) -> RunningMount:
    real = os.path.realpath(path)
    for mount in mounts:
        if mount.mountpoint == real:
            if mount.local_dir is None:
                raise TierChoiceError(
                    f"the mount on {path} left no record of its tier (is it this user's?): "
                    "name the tier with --local-dir DIR",
                    mounts,
                )
            return mount
    raise TierChoiceError(f"{path} is not a tiercache mount (see: tiercache status)", mounts)


def _use_mount(args: argparse.Namespace, mount: RunningMount) -> None:
    if args.local_dir is not None and os.path.realpath(args.local_dir) != mount.local_dir:
        raise TierChoiceError(
            f"--local-dir {args.local_dir} is not the tier of the mount on {mount.mountpoint} "
            f"({mount.local_dir}): give one of the two",
            [mount],
        )
    args.local_dir = mount.local_dir
    if getattr(args, "shared_dir", None) is None and mount.shared_dir is not None:
        args.shared_dir = mount.shared_dir
