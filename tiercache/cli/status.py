"""``tiercache status``: tier usage and the uploads still pending."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tiercache.cli.common import (
    add_json_flag,
    add_tier_flags,
    config_from_args,
    human_bytes,
    print_json,
)
from tiercache.cli.which_tier import add_mount_flag, budget_in_use, choose_tier, is_this_users
from tiercache.tiers.local import LocalTier
from tiercache.tiers.shared import shared_tier_of
from tiercache.write.reconcile import reconcile_journal
from tiercache.write.state import WriteState

NAME = "status"
HELP = "tier usage, uploads still pending and active mounts (no store access)"


EPILOG = """\
examples:
  tiercache status
  tiercache status --local-dir /nvme/tiercache --json | jq .pending_bytes
  tiercache status --mount /mnt/ckpt     # the tier of the mount on /mnt/ckpt

Without --local-dir it shows the tier of your running mount (TIERCACHE_LOCAL_DIR, the
config file or the default when none of yours runs: the tier prefetch fills), and
refuses, naming the mounts and their tiers, when your mounts with different tiers run.
Other users' mounts are listed, and never choose the tier. The budget shown is the one
the running mounts of the tier use, as they last published it. Reads only local files
(the tier, the upload journal, /proc/mounts, the mounts' records and counters): it works
while the store is down.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_tier_flags(parser)
    add_mount_flag(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    mounts = choose_tier(args)
    config = config_from_args(args)
    tier = LocalTier(config.local_dir, config.local_max_bytes, config.file_mode, config.dir_mode)
    shared = shared_tier_of(config)
    pending: list[dict[str, Any]] = []
    superseded: list[dict[str, Any]] = []
    for staging in (tier, shared):
        if staging is not None:
            journal = WriteState(staging, config.lock_timeout)
            pending += _pending_rows(journal)
            superseded += journal.superseded_notes()
    local_budget = budget_in_use(mounts, tier.root, "local", config.local_max_bytes)
    report: dict[str, Any] = {
        "local_dir": tier.root,
        "local_usage_bytes": tier.usage(fresh=True),
        "local_max_bytes": local_budget[0],
        "local_max_bytes_of": local_budget[1],
        "pending_uploads": len(pending),
        "pending_bytes": sum(p["size"] for p in pending),
        "failed_uploads": sum(p["state"] != "dirty" for p in pending),
        "pending": pending,
        "superseded": superseded,
        "mounts": [{**m.to_json(), "this_user": is_this_users(m)} for m in mounts],
        "tier_of_mounts": [m.mountpoint for m in mounts if m.local_dir == tier.root],
    }
    if shared is not None:
        shared_budget = budget_in_use(mounts, shared.root, "shared", config.shared_max_bytes)
        report["shared_dir"] = shared.root
        report["shared_usage_bytes"] = shared.usage(fresh=True)
        report["shared_max_bytes"] = shared_budget[0]
        report["shared_max_bytes_of"] = shared_budget[1]
    if args.json:
        print_json(report)
        return 0
    users = report["tier_of_mounts"]
    print(f"local tier  {report['local_dir']}" + (f"  (of {', '.join(users)})" if users else ""))
    print(
        f"  usage     {human_bytes(report['local_usage_bytes'])} "
        f"of {human_bytes(report['local_max_bytes'])}{_whose(report['local_max_bytes_of'])}"
    )
    print(f"  pending   {len(pending)} upload(s), {human_bytes(report['pending_bytes'])}")
    if "shared_dir" in report:
        print(f"shared tier {report['shared_dir']}")
        print(
            f"  usage     {human_bytes(report['shared_usage_bytes'])} "
            f"of {human_bytes(report['shared_max_bytes'])}{_whose(report['shared_max_bytes_of'])}"
        )
    if report["failed_uploads"]:
        print(f"  FAILED    {report['failed_uploads']} upload(s) need you: see below")
    if superseded:
        print(
            f"  superseded {len(superseded)} version(s) in the last week were never uploaded: "
            "the store held a newer one (not an error)"
        )
        for note in superseded:
            print(f"    {note['name']}  written by {note['host'] or '?'}: {note['why']}")
    for row in pending:
        what = "waiting" if row["state"] == "dirty" else row["state"].upper()
        line = (
            f"    {row['name']}  {human_bytes(row['size'])}  {what} {row['age_s']:.0f} s"
            f"  on {row['durability']} (written by {row['host'] or '?'}"
            + (f", uploading on {row['uploading_on']})" if row["uploading_on"] else ")")
        )
        print(line + (f": {row['error']}" if row["error"] else ""))
    print(f"mounts      {len(report['mounts'])}")
    for mount in report["mounts"]:
        mode = "ro" if mount["read_only"] else "rw"
        pid = mount["pid"] if mount["pid"] is not None else "?"
        where = mount["local_dir"] or "tier unknown (no record)"
        whose = "" if mount["this_user"] or mount["pid"] is None else ", another user's"
        print(f"  {mount['mountpoint']}  {mount['url']}  ({mode}, pid {pid}, {where}{whose})")
    return 0


def _whose(mountpoint: str | None) -> str:
    return f" (the budget of the mount on {mountpoint})" if mountpoint else ""


def _pending_rows(journal: WriteState) -> list[dict[str, Any]]:
    """The journal's records, after committing what a dead writer closed (a killed mount)."""
    reconcile_journal(journal)
    now = time.time()
    return [
        {
            "name": r.name,
            "size": r.size,
            "age_s": round(now - r.created_at, 1),
            "store": r.namespace,
            "state": r.state,
            "error": r.error,
            **journal.whereabouts(r),
        }
        for r in journal.records()
    ]
