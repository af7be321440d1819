"""The write torture's host_loss scenario on CephFS: no acknowledged write is lost with its host.

Host A's processes write behind through a shared tier on CephFS (``write_tier="shared"``) and
host A is lost at a random instant; host B's flush must put every acknowledged write in the
store (``torture_checker``). The seed comes from ``TIERCACHE_TORTURE_SEED`` (else the clock)
and is printed; ``TIERCACHE_HOST_LOSS_ROUNDS`` rounds (default 6), none started after
``TIERCACHE_HOST_LOSS_SECONDS`` (default 150). A longer run: ``harness.py`` with
``Options(cephfs=...)`` from a session that holds the cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import harness  # beside this file, on the path pytest gives a test folder
import pytest

ROUNDS = int(os.environ.get("TIERCACHE_HOST_LOSS_ROUNDS", "6"))
TIME_LIMIT = float(os.environ.get("TIERCACHE_HOST_LOSS_SECONDS", "150"))

pytestmark = [
    pytest.mark.integration,
    pytest.mark.distributed_fs,
    pytest.mark.multinode,
    pytest.mark.node_loss,
]


def test_no_write_acknowledged_on_the_shared_tier_is_lost_with_its_host(
    tmp_path: Path, cephfs: Any, cephfs_dir: str
) -> None:
    summary, reports = harness.run_in_test(
        rounds=ROUNDS,
        scenarios=["host_loss"],
        cephfs=cephfs,
        cephfs_dir=cephfs_dir,
        workdir=str(tmp_path),
        time_limit=TIME_LIMIT,
    )
    assert summary.violations == 0, reports
    assert summary.scenarios["host_loss"] >= min(2, ROUNDS)
