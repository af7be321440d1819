"""A short run of the write torture (``harness.py``): no acknowledged write is ever lost.

The seed comes from ``TIERCACHE_TORTURE_SEED`` (else the clock) and is printed; the number of
rounds from ``TIERCACHE_TORTURE_ROUNDS``, and no round starts after
``TIERCACHE_TORTURE_SECONDS``. The first ``TIERCACHE_TORTURE_STREAM_ROUNDS`` rounds (default 3)
are ``stream`` rounds (parts uploaded while a file is written), the rest are drawn from all
scenarios. The run starts its own SeaweedFS server, because it pauses it;
with ``TIERCACHE_TEST_S3_ENDPOINT`` set it uses that server instead and skips the scenario
that pauses it. For a long run: ``.venv/bin/python tests/torture/harness.py --rounds 500``.
"""

from __future__ import annotations

import os
from pathlib import Path

import harness  # beside this file, on the path pytest gives a test folder
import pytest

ROUNDS = int(os.environ.get("TIERCACHE_TORTURE_ROUNDS", "50"))
TIME_LIMIT = float(os.environ.get("TIERCACHE_TORTURE_SECONDS", "60"))
STREAM_ROUNDS = int(os.environ.get("TIERCACHE_TORTURE_STREAM_ROUNDS", "3"))


@pytest.mark.integration
def test_no_acknowledged_write_is_lost(tmp_path: Path) -> None:
    summary, reports = harness.run_in_test(
        rounds=ROUNDS,
        workdir=str(tmp_path),
        # the long run writes multipart objects (big); this one stays quick
        lead=["stream"] * STREAM_ROUNDS,  # a few streamed multipart uploads all the same
        time_limit=TIME_LIMIT,
    )
    assert summary.violations == 0, reports
    assert summary.scenarios["overlap"] > 0 or summary.rounds <= STREAM_ROUNDS
    assert summary.scenarios["stream"] >= min(STREAM_ROUNDS, summary.rounds)
