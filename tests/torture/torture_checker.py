"""The history of one torture round and the contract it is checked against.

Each key's operations are writes (a ``close()``) and deletes (an ``rm``), each with the
CLOCK_MONOTONIC instants its call started and returned. One is *acknowledged* when it
returned without error and its worker reported that; otherwise (killed, hung, raised) it is
*in doubt* and may take effect at any instant after it started.

The promise checked: the key ends with the version *committed* last. Each operation takes
effect at one instant, its commit, inside its call: for a write-behind ``close()`` the moment
its version becomes the object's newest on the host (the generation ``f.info["generation"]``
reports, which the worker sends with its ``done``); the ``close()`` that returned last need
not be the one that committed last when two overlap. So a key may end in the effect of an
operation V exactly when V's commit can be the last one: no acknowledged operation W on the
key has to commit after V returned (W started after V returned, or W's generation is above
that of a write that did), and no acknowledged write committed after V by generation (an
in-doubt V never returned, and its generation is unknown). With no acknowledged operation at
all the key may also still be absent. An operation that never started (its writer was
killed, or failed, before ``close()``/``rm``) never takes effect, and neither does a
*dropped* write (an exception inside its ``with`` block), even when parts of it were sent to
the store while it was written.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from torture_workers import ABSENT, Message

INF = math.inf


@dataclass
class Op:
    """One write or delete of one key."""

    uid: str
    kind: str  # "write" | "rm"
    path: str
    who: str
    sent: float
    start: float | None = None
    ret: float | None = None
    size: int = 0
    digest: str = ""
    error: str | None = None
    generation: int | None = None  # an acknowledged write's commit order on its host

    @property
    def acked(self) -> bool:
        return self.ret is not None and self.start is not None and self.error is None

    @property
    def effect(self) -> str:
        """What the key holds if this operation is the last to take effect."""
        return ABSENT if self.kind == "rm" else self.uid

    @property
    def returned(self) -> float:
        return self.ret if self.acked and self.ret is not None else INF


@dataclass
class FlushObs:
    who: str
    path: str
    start: float
    ret: float
    ok: bool
    error: str | None
    seen: str  # what the worker read from the store right after an ok flush
    seen_at: float


@dataclass
class ReadObs:
    who: str
    path: str
    start: float
    ret: float
    result: str


@dataclass
class Violation:
    kind: str
    message: str
    paths: list[str] = field(default_factory=list)


@dataclass
class Final:
    """The end of a round: the final flush, then what the store and fresh tiers hold."""

    how: str  # "fs" (a process that never touched the tier) or "cli"
    flush: str  # "ok" or why not
    seconds: float
    store: dict[str, str]
    tier: dict[str, str]
    tier_immutable: dict[str, str]
    pending: list[str]
    journal: list[str]


class History:
    """Everything reported during one round."""

    def __init__(self, t0: float, paths: list[str]) -> None:
        self.t0 = t0
        self.paths = paths
        self.ops: dict[str, Op] = {}
        self.dropped: dict[str, Op] = {}  # writes dropped inside their ``with``: never land
        self.flushes: list[FlushObs] = []
        self.reads: list[ReadObs] = []
        self.notes: list[str] = []
        self.soft: list[str] = []  # findings reported, not counted as violations
        self.counters: Counter[str] = Counter()  # what the workers' ``stats`` steps reported
        self.final: Final | None = None

    def add(self, op: Op) -> None:
        self.ops[op.uid] = op

    def add_dropped(self, op: Op) -> None:
        self.dropped[op.uid] = op

    def record(self, msg: Message) -> None:
        kind = msg[0]
        if kind == "begin":
            _, uid, start, digest, size = msg
            op = self.ops[uid]
            op.start, op.digest, op.size = start, digest, size
        elif kind == "done":
            _, uid, start, ret, error, *generation = msg
            op = self.ops[uid]
            op.start, op.ret, op.error = start, ret, error
            op.generation = generation[0] if generation else None
        elif kind == "flushed":
            self.flushes.append(FlushObs(*msg[1:]))
        elif kind == "read":
            self.reads.append(ReadObs(*msg[1:]))
        elif kind == "stats":
            self.counters.update(msg[2])
        elif kind == "dropped":
            _, uid, start, ret, written, error = msg
            op = self.dropped[uid]
            op.start, op.ret, op.error = start, ret, error
            op.digest = f"dropped after {written}B"
        else:
            self.notes.append(f"unexpected message {msg!r}")

    def ops_on(self, path: str) -> list[Op]:
        return sorted(
            (o for o in self.ops.values() if o.path == path),
            key=lambda o: (o.start if o.start is not None else o.sent, o.uid),
        )

    # -- the checks ------------------------------------------------------------------------

    def allowed(self, path: str, acked_before: float = INF) -> set[str]:
        """States the key may be in once every operation acknowledged before ``acked_before``
        has taken effect (the rule in the module docstring)."""
        ops = self.ops_on(path)
        acked = [w for w in ops if w.acked and w.returned < acked_before]
        earliest = _earliest_commits(acked)
        states = set() if acked else {ABSENT}
        for v in ops:
            if v.start is None:
                continue  # never closed (killed or failed before): nothing of it may land
            if any(earliest[w.uid] > v.returned for w in acked):
                continue  # W committed after V returned
            if v.acked and v.generation is not None:
                gen = v.generation
                if any(w.generation is not None and w.generation > gen for w in acked):
                    continue  # W committed after V
            states.add(v.effect)
        return states

    def check(self) -> list[Violation]:
        found = [*self._check_reads(), *self._check_flushes()]
        if self.final is not None:
            found += self._check_final(self.final)
        return found

    def _check_reads(self) -> list[Violation]:
        found = []
        for read in self.reads:
            if read.result == ABSENT or read.result.startswith("error:"):
                continue
            op = self.ops.get(read.result)
            if read.result in self.dropped:
                found.append(
                    Violation(
                        "bad-read",
                        f"{read.who} read {read.path} at {self.at(read.start)} and got "
                        f"{read.result!r}, a write dropped inside its with block",
                        [read.path],
                    )
                )
            elif op is None or op.path != read.path:
                found.append(
                    Violation(
                        "bad-read",
                        f"{read.who} read {read.path} at {self.at(read.start)} and got "
                        f"{read.result!r}, not a version written to that key",
                        [read.path],
                    )
                )
        return found

    def _check_flushes(self) -> list[Violation]:
        found = []
        for flush in self.flushes:
            if not flush.ok or not flush.seen or flush.seen.startswith("error:"):
                continue
            allowed = self.allowed(flush.path, acked_before=flush.start)
            if flush.seen not in allowed:
                found.append(
                    Violation(
                        "flush-lied",
                        f"{flush.who} flush({flush.path}) started {self.at(flush.start)}, "
                        f"returned ok {self.at(flush.ret)}, but the store then held "
                        f"{flush.seen}; allowed: {_names(allowed)}",
                        [flush.path],
                    )
                )
        return found

    def _check_final(self, final: Final) -> list[Violation]:
        if final.flush != "ok":
            why = f"final flush ({final.how}) failed with the store healthy: {final.flush}"
            if any(not o.acked for o in self.ops.values()):
                # Reporting the leftovers of a write killed in close() is allowed; losing
                # them silently is not. Counted apart, so a run still shows it.
                self.soft.append(f"{why} (after in-doubt operations)")
                return []
            return [Violation("final-flush-failed", why, list(self.paths))]
        if final.journal:
            self.soft.append(f"journal records left after a successful flush: {final.journal}")
        found = []
        for path in self.paths:
            stored = final.store.get(path, "?")
            allowed = self.allowed(path)
            if stored in self.dropped:
                drop = self.dropped[stored]
                found.append(
                    Violation(
                        "dropped-write-landed",
                        f"after the final flush the store holds {stored} at {path}: "
                        f"{drop.who} dropped it inside its with block ({drop.digest}, "
                        f"{drop.size}B body); allowed: {_names(allowed)}",
                        [path],
                    )
                )
            elif stored not in allowed:
                found.append(
                    Violation(
                        "lost-write",
                        f"after a successful final flush the store holds {stored} at {path}; "
                        f"allowed: {_names(allowed)}",
                        [path],
                    )
                )
            for label, tier in (("default", final.tier), ("immutable", final.tier_immutable)):
                got = tier.get(path, "?")
                if got != stored:
                    found.append(
                        Violation(
                            "tier-diverges",
                            f"a fresh filesystem ({label}) reads {got} at {path}, "
                            f"the store holds {stored}",
                            [path],
                        )
                    )
        if final.pending:
            found.append(
                Violation(
                    "pending-after-flush",
                    f"pending() after a successful flush: {final.pending}",
                    list(self.paths),
                )
            )
        return found

    def stats(self) -> str:
        ops = list(self.ops.values())
        acked = sum(o.acked for o in ops)
        began = sum(o.start is not None and not o.acked for o in ops)
        flushed = sum(f.ok for f in self.flushes)
        dropped = f", {len(self.dropped)} dropped" if self.dropped else ""
        return (
            f"{len(ops)} ops ({acked} acked, {len(ops) - acked} in doubt, {began} of them begun"
            f"{dropped}), flushes {flushed} ok/{len(self.flushes) - flushed} failed, "
            f"{len(self.reads)} reads"
        )

    # -- the report --------------------------------------------------------------------------

    def at(self, t: float | None) -> str:
        return "-" if t is None else f"+{(t - self.t0) * 1000:.1f}ms"

    def describe(self, paths: list[str]) -> str:
        lines = []
        for path in paths or self.paths:
            lines.append(f"  history of {path} (times from the round's start):")
            dropped = sorted(
                (o for o in self.dropped.values() if o.path == path),
                key=lambda o: (o.start if o.start is not None else o.sent, o.uid),
            )
            for op in [*self.ops_on(path), *dropped]:
                if op.uid in self.dropped and op.ret is None:
                    state = "NOT REPORTED (killed while writing what it was to drop)"
                elif op.uid in self.dropped:
                    state = f"DROPPED ({op.digest}; {op.error or 'as planned'})"
                elif op.acked:
                    state = "acked" if op.generation is None else f"acked, gen {op.generation}"
                elif op.start is None:
                    state = f"NEVER CLOSED ({op.error or 'killed before close()'}): must not land"
                elif op.error is not None:
                    state = f"IN DOUBT (raised {op.error})"
                else:
                    state = "IN DOUBT (no return reported)"
                what = f"{op.kind:5} {op.uid}"
                if op.kind == "write" and op.uid not in self.dropped:
                    what += f" {op.size}B sha256={op.digest[:12] or '?'}"
                elif op.kind == "write":
                    what += f" {op.size}B"
                lines.append(
                    f"    {op.who:8} {what:58} start {self.at(op.start):>11} "
                    f"return {self.at(op.ret):>11}  {state}"
                )
            for flush in (f for f in self.flushes if f.path == path):
                outcome = f"ok, store then held {flush.seen or '(not read)'}"
                if not flush.ok:
                    outcome = f"{flush.error}"
                lines.append(
                    f"    {flush.who:8} flush {'':52} start {self.at(flush.start):>11} "
                    f"return {self.at(flush.ret):>11}  {outcome}"
                )
            for read in (r for r in self.reads if r.path == path):
                lines.append(
                    f"    {read.who:8} read  {'':52} start {self.at(read.start):>11} "
                    f"return {self.at(read.ret):>11}  got {read.result}"
                )
            lines.append(f"    allowed final states: {_names(self.allowed(path))}")
        if self.final is not None:
            lines += _describe_final(self.final, paths or self.paths)
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _earliest_commits(acked: list[Op]) -> dict[str, float]:
    """The earliest instant each acknowledged operation can have committed at: its start, or
    later where a write of a lower generation (committed before it) started later."""
    earliest = {op.uid: op.start if op.start is not None else -INF for op in acked}
    floor = -INF
    for op in sorted(
        (o for o in acked if o.generation is not None), key=lambda o: o.generation or 0
    ):
        floor = max(floor, earliest[op.uid])
        earliest[op.uid] = floor
    return earliest


def _describe_final(final: Final, paths: list[str]) -> list[str]:
    lines = [f"  final flush ({final.how}): {final.flush} in {final.seconds:.2f}s"]
    for path in paths:
        lines.append(
            f"  {path}: store {final.store.get(path, '?')} | tier {final.tier.get(path, '?')}"
            f" | tier (immutable) {final.tier_immutable.get(path, '?')}"
        )
    lines.append(f"  pending after flush: {final.pending or 'none'}")
    if final.journal:
        lines.append(f"  journal records left: {final.journal}")
    return lines


def _names(states: set[str]) -> str:
    return "{" + ", ".join(sorted(states)) + "}"
