"""The tier's ledger: every process of the node counts the others' reservations and
publications, a killed process's bytes go, a planted link is never followed, forks count apart."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tiercache.prefetch.items import Budget
from tiercache.tiers import ledger as ledger_module
from tiercache.tiers.ledger import NodeLedger, ProcessLedger
from tiercache.tiers.local import LocalTier

pytestmark = pytest.mark.partition

MiB = 1024 * 1024


def _tier(root: Path, budget: int = 10 * MiB) -> LocalTier:
    return LocalTier(str(root), budget)


def _other_process(root: Path, budget: int = 10 * MiB) -> LocalTier:
    """The tier as another process sees it: an open file and slot of the ledger of its own
    (the tiers of one process share one: ``ledger_at``)."""
    root.mkdir(parents=True, exist_ok=True)
    return LocalTier(str(root), budget, ledger=NodeLedger(str(root / "ledger"), 0o600))


def test_a_reservation_counts_in_every_process_of_the_tier(tmp_path: Path) -> None:
    one, other = _tier(tmp_path / "tier"), _other_process(tmp_path / "tier")
    assert isinstance(one.ledger, NodeLedger)
    assert one.usage() == other.usage() == 0
    one.reserve(3 * MiB)
    assert other.usage() == 3 * MiB  # the scan it keeps is not looked at again: memory only
    one.count_published(3 * MiB, reserved=3 * MiB)  # published: counted once, as published
    assert other.usage() == 3 * MiB
    other.release(0)
    assert one.ledger.totals()[1] == 0


def _plant_entry(tier: LocalTier, key: str, nbytes: int) -> str:
    paths = tier.paths(tier.entry_id("ns", "b", key))
    Path(paths.data).write_bytes(b"x" * nbytes)
    Path(paths.meta).write_text("{}")
    return paths.data


def test_eviction_makes_room_for_the_other_processes_fetches(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    fetching, other = _tier(root, 4 * MiB), _other_process(root, 4 * MiB)
    data = _plant_entry(other, "old", MiB)
    other.reserve(3 * MiB)  # 1 + 3: the budget, nothing to evict
    assert os.path.exists(data)
    # 1 + 3 + 1: over. Counting its own fetch alone (1 + 1), this process evicted nothing.
    fetching.reserve(MiB)
    assert not os.path.exists(data)
    data = _plant_entry(other, "older", MiB)
    report = fetching.evict(int(4 * MiB * 0.95), count_parts=False, less_reserved=True)
    assert report.unseen == 4 * MiB and report.removed_bytes == MiB  # 3.8 - 4 < 0: all of it
    other.release(3 * MiB)
    fetching.release(MiB)
    assert fetching.ledger.totals()[1] == 0


def _reserve_and_wait(root: str, nbytes: int, ready: Any) -> None:
    tier = _tier(Path(root))
    tier.reserve(nbytes)
    ready.set()
    signal.pause()


def test_a_killed_process_leaves_no_reservation_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "tier"
    tier = _tier(root)
    tier.reserve(0)  # this process's slot: the first
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    victim = ctx.Process(target=_reserve_and_wait, args=(str(root), 5 * MiB, ready))
    victim.start()
    assert ready.wait(30)
    assert tier.ledger.totals()[1] == 5 * MiB
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    assert tier.ledger.totals()[1] == 5 * MiB  # until a reservation looks
    monkeypatch.setattr(ledger_module, "_REAP_EVERY", 0.0)
    tier.reserve(MiB)
    assert tier.ledger.totals()[1] == MiB  # the dead process's slot holds nothing
    tier.release(MiB)
    again = _tier(root)  # and its slot is taken again, not a new one
    again.reserve(MiB)
    assert isinstance(again.ledger, NodeLedger)
    assert again.ledger._words[ledger_module._USED] == 2
    assert again.ledger.totals()[1] == MiB
    again.release(MiB)


def test_a_forked_child_counts_in_a_slot_of_its_own(tmp_path: Path) -> None:
    tier = _tier(tmp_path / "tier")
    tier.reserve(MiB)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    # The child inherits the parent's tier: its ``after_fork`` takes a slot of its own.
    child = ctx.Process(target=lambda: (tier.reserve(2 * MiB), out.put(tier.ledger.totals())))
    child.start()
    assert out.get(timeout=30) == (0, 3 * MiB)  # its 2 MiB and the parent's 1
    child.join(30)
    assert child.exitcode == 0
    tier.release(MiB)
    assert tier.ledger.totals()[1] == 2 * MiB  # the child exited: counted until reaped


def test_a_planted_link_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    (root / "ledger").symlink_to(outside)
    tier = _tier(root)
    assert isinstance(tier.ledger, ProcessLedger)  # counts alone, with a warning
    tier.reserve(MiB)
    assert tier.usage() == MiB
    assert outside.read_bytes() == b""
    assert (root / "ledger").is_symlink()


def test_the_prefetch_window_is_one_for_the_node(tmp_path: Path) -> None:
    one, other = _tier(tmp_path / "tier"), _other_process(tmp_path / "tier")
    mine = Budget(4 * MiB, node=one.ledger)
    theirs = Budget(4 * MiB, node=other.ledger)
    mine.charge(3 * MiB)
    assert theirs.elsewhere() == 3 * MiB
    assert theirs.fits(MiB) and not theirs.fits(2 * MiB)
    mine.charge(-3 * MiB)
    assert theirs.fits(4 * MiB)
