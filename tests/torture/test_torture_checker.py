"""The torture checker's contract on made-up histories (no server, no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torture_checker import Final, FlushObs, History, Op, ReadObs
from torture_workers import ABSENT, identify, make_content

P = "b/r1/k0"


def _history(*ops: Op) -> History:
    history = History(0.0, [P])
    for op in ops:
        history.add(op)
    return history


def _write(
    uid: str,
    start: float | None,
    ret: float | None,
    error: str | None = None,
    generation: int | None = None,
) -> Op:
    return Op(
        uid=uid,
        kind="write",
        path=P,
        who="w",
        sent=0.0,
        start=start,
        ret=ret,
        error=error,
        generation=generation,
    )


def _final(store: str, tier: str | None = None, flush: str = "ok") -> Final:
    tier = store if tier is None else tier
    return Final("fs", flush, 0.1, {P: store}, {P: tier}, {P: tier}, [], [])


def test_a_close_that_began_after_another_returned_wins() -> None:
    history = _history(_write("a", 1.0, 2.0), _write("b", 3.0, 4.0))
    assert history.allowed(P) == {"b"}


def test_overlapping_closes_of_unknown_commit_order_may_end_either_way() -> None:
    history = _history(_write("a", 1.0, 3.0), _write("b", 2.0, 4.0))
    assert history.allowed(P) == {"a", "b"}


def test_overlapping_closes_end_with_the_last_committed_not_the_last_returned() -> None:
    # b's close() returned last, but a committed after it: a is what the key must hold.
    history = _history(_write("a", 1.0, 3.0, generation=20), _write("b", 2.0, 4.0, generation=10))
    assert history.allowed(P) == {"a"}
    history.add(_write("c", None, None))
    history.record(("done", "c", 2.5, 3.5, None, 30))  # the worker's report carries it
    assert history.allowed(P) == {"c"}
    history.final = _final("a")
    assert [v.kind for v in history.check()] == ["lost-write"]


def test_a_commit_after_a_later_started_one_is_after_it_too() -> None:
    # b started at 5 and a committed after b: a delete that returned at 4 cannot be last.
    rm = Op(uid="d", kind="rm", path=P, who="w", sent=0.0, start=2.0, ret=4.0)
    history = _history(_write("a", 1.0, 7.0, generation=20), _write("b", 5.0, 6.0, generation=10))
    history.add(rm)
    assert history.allowed(P) == {"a"}


def test_an_in_doubt_close_may_land_at_any_time_after_it_began() -> None:
    history = _history(_write("a", 1.0, None), _write("b", 3.0, 4.0), _write("c", 5.0, 6.0, "X"))
    assert history.allowed(P) == {"a", "b", "c"}


def test_absent_only_without_an_acknowledged_operation_or_after_a_delete() -> None:
    assert _history(_write("a", 1.0, None)).allowed(P) == {"a", ABSENT}
    rm = Op(uid="d", kind="rm", path=P, who="w", sent=0.0, start=3.0, ret=4.0)
    assert _history(_write("a", 1.0, 2.0), rm).allowed(P) == {ABSENT}


def test_an_operation_that_never_began_never_takes_effect() -> None:
    history = _history(_write("a", 1.0, 2.0), _write("k", None, None), _write("f", None, 3, "X"))
    assert history.allowed(P) == {"a"}
    assert _history(_write("k", None, None)).allowed(P) == {ABSENT}


def test_a_dropped_write_must_never_land() -> None:
    history = _history(_write("a", 1.0, 2.0))
    history.add_dropped(_write("d", None, None))
    history.record(("dropped", "d", 2.5, 3.0, 6_000_000, None))
    history.final = _final("d")
    kinds = [v.kind for v in history.check()]
    assert kinds == ["dropped-write-landed"]
    history.reads.append(ReadObs("w", P, 3.0, 3.5, "d"))
    history.final = _final("a")
    assert [v.kind for v in history.check()] == ["bad-read"]
    assert "DROPPED" in history.describe([])


def test_a_lost_write_and_a_diverging_tier_are_violations() -> None:
    history = _history(_write("a", 1.0, 2.0), _write("b", 3.0, 4.0))
    history.final = _final("a", tier="b")
    assert {v.kind for v in history.check()} == {"lost-write", "tier-diverges"}
    history.final = _final("b")
    assert history.check() == []


def test_a_flush_that_returns_while_its_write_is_missing_lied() -> None:
    history = _history(_write("a", 1.0, 2.0), _write("b", 2.5, 3.5))
    history.flushes.append(FlushObs("w", P, 2.1, 2.2, True, None, ABSENT, 2.3))
    history.flushes.append(FlushObs("w", P, 2.1, 2.2, True, None, "a", 2.3))  # b may be later
    history.flushes.append(FlushObs("w", P, 5.0, 9.0, False, "CacheTimeoutError", "", 9.0))
    assert [v.kind for v in history.check()] == ["flush-lied"]


def test_a_failed_final_flush_counts_unless_a_write_is_in_doubt() -> None:
    history = _history(_write("a", 1.0, 2.0))
    history.final = _final(ABSENT, flush="exit 1: pending")
    assert [v.kind for v in history.check()] == ["final-flush-failed"]
    history.add(_write("b", 3.0, None))
    assert history.check() == [] and history.soft


def test_reads_must_return_a_whole_version_of_that_key() -> None:
    history = _history(_write("a", 1.0, 2.0))
    history.reads.append(ReadObs("w", P, 1.0, 1.5, "a"))
    history.reads.append(ReadObs("w", P, 1.0, 1.5, "corrupt: a body does not match its digest"))
    history.reads.append(ReadObs("w", P, 1.0, 1.5, "r9-w0-1"))
    assert [v.kind for v in history.check()] == ["bad-read", "bad-read"]


def test_versions_name_themselves_and_catch_damage() -> None:
    data = make_content("r1-w0-7", 1000)
    assert identify(data) == "r1-w0-7"
    assert identify(data[:-1]).startswith("corrupt:")
    assert identify(data[:-1] + bytes([data[-1] ^ 1])).startswith("corrupt:")
    assert identify(b"").startswith("corrupt:")
