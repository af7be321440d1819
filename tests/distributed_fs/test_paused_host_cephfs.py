"""A host paused past its lease never overwrites a newer acknowledged version, on CephFS.

The trials of ``support/paused_host.py`` with the shared tier on the project's CephFS, each
host on its own ``ceph-fuse`` mount: host A is stopped while one of its requests is held
on the wire, host B takes the upload over and writes a newer version, then A's request
reaches the store and A runs again.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.cephfs_hosts import Hosts
from support.paused_host import PART_SIZE, SCENARIOS, run_trial
from support.proxy import FaultProxy

pytestmark = [
    pytest.mark.distributed_fs,
    pytest.mark.multinode,
    pytest.mark.integration,
    pytest.mark.partition,
]

LEASE = 2.0  # lease_stale_after of both hosts (ceph-fuse's metadata calls are slower)
ROUNDS = 3  # trials of each scenario


def test_a_paused_host_never_overwrites_the_newer_version_on_cephfs(
    hosts: Hosts, proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    options = {
        "write_tier": "shared",
        "lease_stale_after": LEASE,
        "part_size": PART_SIZE,
        "retries": 1,
    }
    host_a = hosts.start("hostA", **options)
    host_b = hosts.start("hostB", **options)
    for round_ in range(ROUNDS):
        for number, scenario in enumerate(SCENARIOS):
            path = f"{bucket}/ckpt/trial-{round_}-{number}.pt"
            print(f"trial {round_ * len(SCENARIOS) + number + 1}: {scenario.name} on {path}")
            run_trial(scenario, path, host_a, host_b, proxy, s3_client, LEASE)
