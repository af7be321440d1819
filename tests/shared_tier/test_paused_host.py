"""A host paused past its lease never overwrites a newer acknowledged version (local shared dir).

Two processes with host identities of their own share one shared tier directory and the
session's S3 server behind a proxy; ``support/paused_host.py`` runs the trials: host A is
stopped while one of its requests is held on the wire, host B takes the upload over and
writes a newer version, then A's request reaches the store and A runs again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cephfs_hosts import HostProcess
from support.paused_host import PART_SIZE, SCENARIOS, Scenario, run_trial
from support.proxy import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.multinode, pytest.mark.partition]

LEASE = 1.5  # lease_stale_after of both hosts
ROUNDS = 5  # trials of each scenario


def _hosts(
    tmp_path: Path, options: dict[str, Any], lease: float
) -> tuple[HostProcess, HostProcess]:
    made = []
    for host in ("hostA", "hostB"):
        config = {
            "target_options": options,
            "local_dir": str(tmp_path / f"{host}-local"),
            "shared_dir": str(tmp_path / "shared"),
            "host_id": host,
            "write_tier": "shared",
            "consistency": "immutable",
            "lease_stale_after": lease,
            "part_size": PART_SIZE,
            "retries": 1,
        }
        made.append(HostProcess(host, config))
    return made[0], made[1]


@pytest.fixture
def two_hosts(
    tmp_path: Path, s3: Any, proxy: FaultProxy, request: pytest.FixtureRequest
) -> Iterator[tuple[HostProcess, HostProcess]]:
    lease = getattr(request, "param", LEASE)
    a, b = _hosts(tmp_path, {**s3.target_options(), "endpoint_url": proxy.url}, lease)
    try:
        yield a, b
    finally:
        for host in (a, b):
            if host.proc.poll() is None:
                host.kill()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name.replace(" ", "-"))
def test_a_paused_host_never_overwrites_the_newer_version(
    scenario: Scenario,
    two_hosts: tuple[HostProcess, HostProcess],
    proxy: FaultProxy,
    s3_client: Any,
    bucket: str,
) -> None:
    host_a, host_b = two_hosts
    for round_ in range(ROUNDS):
        path = f"{bucket}/ckpt/trial-{round_}.pt"
        print(f"trial {round_ + 1}/{ROUNDS}: {scenario.name} on {path}")
        run_trial(scenario, path, host_a, host_b, proxy, s3_client, LEASE)


@pytest.mark.parametrize("two_hosts", [30.0], indirect=True)
def test_with_the_default_lease(
    two_hosts: tuple[HostProcess, HostProcess], proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    host_a, host_b = two_hosts
    run_trial(
        SCENARIOS[0], f"{bucket}/ckpt/default-lease.pt", host_a, host_b, proxy, s3_client, 30.0
    )
