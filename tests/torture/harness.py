"""Randomized, seeded torture of tiercache's write-behind against a real S3 server.

    .venv/bin/python tests/torture/harness.py --rounds 500 --seed 7 [--scenario overlap]

Each round picks a scenario (see ``torture_scenarios``) from the seed, runs it on a fresh
local tier with worker processes that report every acknowledged write, delete, read and
flush, then flushes through a process that never touched the tier (or ``tiercache flush``)
and checks the store and fresh filesystems on the tier against the contract (see
``torture_checker``). A round's keys are read once more at the end of the next round: a store
that changes after a successful final flush lost a write too. After ``stream`` and ``kill``
rounds, ``fsck`` runs on the tier (dead writers' multipart sidecars made older than their
grace) and no multipart upload of the round may then be open in the bucket. Exit status 1 on
any violation.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for _extra in (HERE, ROOT / "scripts", ROOT / "tests"):  # run as a script too
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

from torture_checker import History, Violation  # noqa: E402
from torture_round import Env, Round, Store  # noqa: E402
from torture_scenarios import SCENARIOS, WEIGHTS  # noqa: E402
from torture_workers import ABSENT, Pool, identify  # noqa: E402

KEEP_FAILED_TIERS = 20
HARNESS_ERRORS_IN_A_ROW = 3  # then the harness itself is broken: stop rather than cascade


@dataclass
class Options:
    rounds: int = 50
    seed: int = 0
    first_round: int = 0
    scenarios: list[str] = field(default_factory=lambda: list(SCENARIOS))
    # The CephFS cluster of the host_loss scenario (support.cephfs_hosts.CephFS) and the
    # directory of its mounts the rounds' shared tiers go under; None: host_loss is skipped.
    cephfs: Any = None
    cephfs_dir: str = "torture"
    workdir: str | None = None  # default: a temporary directory, removed unless a round failed
    store: Store | None = None  # default: a private SeaweedFS server started here
    big: bool = True  # now and then a write over 16 MiB (a multipart upload)
    lead: list[str] = field(default_factory=list)  # scenarios of the first rounds, in order
    stop_after: int = 0  # stop after this many failing rounds (0: never)
    time_limit: float = 0.0  # start no round after this many seconds (0: no limit)
    verbose: int = 0  # 1: a line per round, 2: and its whole history
    out: Callable[[str], None] = print


@dataclass
class Summary:
    seed: int
    rounds: int = 0
    scenarios: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    failed_rounds: list[int] = field(default_factory=list)
    notes: int = 0  # soft findings (see History.soft)
    seconds: float = 0.0
    counters: Counter[str] = field(default_factory=Counter)  # multipart activity, all rounds

    @property
    def violations(self) -> int:
        return sum(self.kinds.values())

    def line(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.scenarios.items()))
        kinds = " ".join(f"{k}={v}" for k, v in sorted(self.kinds.items()))
        failed = f" in {len(self.failed_rounds)} rounds ({kinds})" if self.violations else ""
        notes = f", {self.notes} notes" if self.notes else ""
        multipart = ""
        if self.counters:
            multipart = "; multipart: " + " ".join(
                f"{k}={v}" for k, v in sorted(self.counters.items())
            )
        return (
            f"torture: {self.rounds} rounds, {self.violations} violations{failed}{notes} "
            f"(scenario counts {counts}) seed={self.seed} {self.seconds:.0f}s{multipart}"
        )


def external_store() -> Store | None:
    """The server named by TIERCACHE_TEST_S3_ENDPOINT, as in tests/conftest.py."""
    endpoint = os.environ.get("TIERCACHE_TEST_S3_ENDPOINT")
    if not endpoint:
        return None
    return Store(
        endpoint,
        os.environ["TIERCACHE_TEST_S3_KEY"],
        os.environ["TIERCACHE_TEST_S3_SECRET"],
        os.environ.get("TIERCACHE_TEST_S3_REGION", "us-east-1"),
    )


def _stored(client: Any, path: str) -> str:
    bucket, _, key = path.partition("/")
    try:
        return identify(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except client.exceptions.NoSuchKey:
        return ABSENT
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"


class Harness:
    def __init__(self, options: Options, store: Store, workdir: str) -> None:
        self.options = options
        self.summary = Summary(options.seed)
        self.client = store.client()
        bucket = f"tc-torture-{secrets.token_hex(4)}"
        self.client.create_bucket(Bucket=bucket)
        ctx = multiprocessing.get_context("spawn")
        os.makedirs(os.path.join(workdir, "logs"), exist_ok=True)
        pool = Pool(ctx, store.endpoint_only(), os.path.join(workdir, "logs"))
        self.env = Env(
            pool=pool,
            store=store,
            bucket=bucket,
            workdir=workdir,
            big=options.big,
            cephfs=options.cephfs,
            cephfs_dir=options.cephfs_dir,
        )
        self.previous: tuple[Round, dict[str, str]] | None = None
        self.kept = 0
        self.harness_errors = 0  # in a row

    def close(self) -> None:
        self.env.pool.close()
        if self.env.proxy is not None:
            self.env.proxy.close()
        if self.env.store.server is None and not self.summary.failed_rounds:
            self.remove_bucket()  # someone else's server: leave it as it was

    def remove_bucket(self) -> None:
        bucket = self.env.bucket
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        self.client.delete_bucket(Bucket=bucket)

    def pick(self, rng: random.Random) -> str:
        names = self.options.scenarios
        return rng.choices(names, [WEIGHTS[n] for n in names])[0]

    def one_round(self, number: int) -> None:
        rng = random.Random(f"{self.options.seed}/{number}")
        scenario = self.pick(rng)  # always: a led round draws what ``--scenario`` replays
        lead = self.options.lead
        if 0 <= number - self.options.first_round < len(lead):
            scenario = lead[number - self.options.first_round]
        endpoint = self.env.store.endpoint
        if scenario == "faults":
            if self.env.proxy is None:
                from support.proxy import FaultProxy

                self.env.proxy = FaultProxy(self.env.store.endpoint, timeout=30)
            endpoint = self.env.proxy.url
        rnd = Round(number, scenario, rng, self.env, History(time.monotonic(), []), endpoint)
        started = time.monotonic()
        try:
            SCENARIOS[scenario](rnd)
            rnd.finish()
        except Exception:
            why = traceback.format_exc()
            rnd.violations.append(Violation("harness-error", why, list(rnd.history.paths)))
        found = rnd.violations + rnd.history.check()
        broken = any(v.kind == "harness-error" for v in found)
        self.harness_errors = self.harness_errors + 1 if broken else 0
        self.summary.rounds += 1
        self.summary.scenarios[scenario] += 1
        self.summary.counters.update(rnd.history.counters)
        self.summary.counters.update(_upload_counters(rnd))
        self.recheck_previous()
        final = rnd.history.final
        if found:
            self.report(rnd, found)
        elif final is not None and final.flush == "ok":
            self.previous = (rnd, dict(final.store))
        else:
            self.previous = None
        if self.options.verbose:
            outcome = f"{len(found)} violation(s)" if found else "ok"
            multipart = _upload_counters(rnd) + rnd.history.counters
            extra = "; " + " ".join(f"{k}={v}" for k, v in sorted(multipart.items()))
            self.options.out(
                f"round {number} {scenario}: {outcome} in {time.monotonic() - started:.2f}s; "
                f"{rnd.history.stats()}{extra if multipart else ''}"
            )
            if self.options.verbose > 1:
                self.options.out(rnd.history.describe([]))
        for note in rnd.history.soft:
            self.summary.notes += 1
            self.options.out(f"note: seed={self.options.seed} round={number} ({scenario}): {note}")
        self.env.pool.after_round()

    def recheck_previous(self) -> None:
        """A store that changes after a successful final flush lost a write after all."""
        if self.previous is None:
            return
        rnd, stored = self.previous
        self.previous = None
        changed = []
        for path, before in stored.items():
            now = _stored(self.client, path)
            if now != before:
                changed.append(
                    Violation(
                        "store-changed-later",
                        f"{path} held {before} after the final flush, and {now} a round later",
                        [path],
                    )
                )
        if changed:
            self.report(rnd, changed)
        else:
            shutil.rmtree(rnd.local_dir, ignore_errors=True)

    def report(self, rnd: Round, found: list[Violation]) -> None:
        self.summary.failed_rounds.append(rnd.number)
        self.summary.kinds.update(v.kind for v in found)
        opts = self.options
        paths = sorted({p for v in found for p in v.paths} & set(rnd.history.paths))
        lines = [f"VIOLATION seed={opts.seed} round={rnd.number} scenario={rnd.scenario}"]
        lines += [f"  {v.kind}: {v.message}" for v in found]
        lines.append(rnd.history.describe(paths))
        self.kept += 1
        if self.kept > KEEP_FAILED_TIERS:
            shutil.rmtree(rnd.local_dir, ignore_errors=True)
        else:
            lines.append(f"  tier kept at {rnd.local_dir}")
        lines.append(f"  worker logs: {os.path.join(self.env.workdir, 'logs')}")
        if rnd.uploads is not None:
            lines.append(f"  multipart uploads check: {_describe_uploads(rnd.uploads)}")
        led = 0 <= rnd.number - opts.first_round < len(opts.lead)
        scenarios = rnd.scenario if led else ",".join(opts.scenarios)
        lines.append(
            f"  rerun: python tests/torture/harness.py --seed {opts.seed} "
            f"--first-round {rnd.number} --rounds 1 --scenario {scenarios}"
        )
        opts.out("\n".join(lines))


def _upload_counters(rnd: Round) -> Counter[str]:
    """What the multipart uploads check of a round saw (empty when it did not run)."""
    seen = rnd.uploads
    if seen is None:
        return Counter()
    return Counter(
        {
            "open_before_fsck": len(seen["before"]),
            "aborted_by_fsck": sum(p["multipart_aborted"] for p in seen["fsck"]),
            "open_after_fsck": len(seen.get("open", [])),
            "settle_passes": seen["passes"] - 1,  # waits for live owners to abort theirs
        }
    )


def _describe_uploads(seen: dict[str, Any]) -> str:
    before = [f"{u['key']} ...{u['upload_id'][-12:]} parts={u['parts']}" for u in seen["before"]]
    sidecars = [
        f"{row['name'][:12]}...{row['name'][64:]} upload=...{str(row.get('upload_id'))[-12:]} "
        f"locked_by={row.get('locked_by')}"
        for row in seen["sidecars_before"]
    ]
    passes = seen["fsck"]
    aborted = sum(p["multipart_aborted"] for p in passes)
    removed = sum(p["leftovers_removed"] for p in passes)
    lost = sorted({name for p in passes for name in p["lost"]})
    return (
        f"open before fsck: {before or 'none'}; sidecars before fsck: {sidecars or 'none'}; "
        f"fsck: {len(passes)} passes, {aborted} multipart aborted, {removed} leftovers removed"
        f"{f', lost {lost}' if lost else ''}; still open: {len(seen.get('open', []))}"
    )


def _unsupported(options: Options) -> dict[str, str]:
    """Scenarios this store cannot host, and why."""
    store = options.store
    skipped = {}
    if store is not None and store.server is None and "freeze" in options.scenarios:
        skipped["freeze"] = "it pauses the server, and this one (an external endpoint) is not ours"
    if store is not None and not store.endpoint.startswith("http://"):
        skipped["faults"] = "the fault proxy forwards plain http only"
    if options.cephfs is None and "host_loss" in options.scenarios:
        skipped["host_loss"] = "it needs the CephFS cluster (tests/distributed_fs runs it)"
    return skipped


def run_in_test(**options: Any) -> tuple[Summary, str]:
    """A run for the test suite: the seed from ``TIERCACHE_TORTURE_SEED`` (else the clock),
    every line printed as it comes; the summary and the violations' reports."""
    seed = int(os.environ.get("TIERCACHE_TORTURE_SEED") or time.time_ns() % 1_000_000_007)
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    summary = run(Options(seed=seed, store=external_store(), big=False, out=out, **options))
    print(summary.line())
    reports = "\n".join(line for line in lines if line.startswith("VIOLATION"))
    return summary, f"{summary.line()}\n{reports}"


def run(options: Options) -> Summary:
    """Run the rounds; the summary counts every violation found."""
    out = options.out
    import tiercache

    out(f"torture: seed={options.seed} rounds={options.rounds} scenarios={options.scenarios}")
    out(f"torture: tiercache from {os.path.dirname(tiercache.__file__)}")
    skipped = _unsupported(options)
    for name, why in skipped.items():
        out(f"torture: skipping scenario {name!r}: {why}")
    options.scenarios = [s for s in options.scenarios if s not in skipped]
    if not options.scenarios:
        return Summary(options.seed)
    own_workdir = options.workdir is None
    workdir = options.workdir or tempfile.mkdtemp(prefix="torture-of-tiercache-")
    started = time.monotonic()
    server = None
    store = options.store
    if store is None:
        import s3server

        server = s3server.start_server(data_dir=os.path.join(workdir, "s3"))
        store = Store(server.endpoint, server.access_key, server.secret_key, server.region, server)
    harness = Harness(options, store, workdir)
    try:
        first = options.first_round
        for number in range(first, first + options.rounds):
            harness.one_round(number)
            failed = len(harness.summary.failed_rounds)
            if options.stop_after and failed >= options.stop_after:
                out(f"torture: stopping after {failed} failing round(s)")
                break
            if harness.harness_errors >= HARNESS_ERRORS_IN_A_ROW:
                out(f"torture: {harness.harness_errors} harness errors in a row: stopping")
                break
            if options.time_limit and time.monotonic() - started > options.time_limit:
                out(f"torture: time limit of {options.time_limit:.0f}s reached")
                break
            if (number - first + 1) % 25 == 0:
                out(
                    f"torture: {number - first + 1} rounds, {failed} failing, "
                    f"{time.monotonic() - started:.0f}s"
                )
        harness.recheck_previous()
    finally:
        harness.close()
        if server is not None:
            server.stop()
    harness.summary.seconds = time.monotonic() - started
    if own_workdir and not harness.summary.failed_rounds:
        shutil.rmtree(workdir, ignore_errors=True)
    elif server is not None and not harness.summary.failed_rounds:
        shutil.rmtree(os.path.join(workdir, "s3"), ignore_errors=True)
    elif harness.summary.failed_rounds:
        out(f"torture: work directory kept at {workdir}")
    return harness.summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, help="default: from the clock (printed)")
    parser.add_argument("--first-round", type=int, default=0, help="to replay one round")
    parser.add_argument(
        "--scenario",
        default=",".join(SCENARIOS),
        help=f"comma-separated, from {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument("--workdir", help="default: a temporary directory")
    parser.add_argument("--no-big", action="store_true", help="never write over 16 MiB")
    parser.add_argument("--stop-after", type=int, default=0, help="failing rounds (0: never)")
    parser.add_argument("--time-limit", type=float, default=0.0, help="seconds (0: none)")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="a line per round (-vv: and its history)"
    )
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenario.split(",") if s]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    seed = args.seed if args.seed is not None else time.time_ns() % 1_000_000_007
    summary = run(
        Options(
            rounds=args.rounds,
            seed=seed,
            first_round=args.first_round,
            scenarios=scenarios,
            workdir=args.workdir,
            store=external_store(),
            big=not args.no_big,
            stop_after=args.stop_after,
            time_limit=args.time_limit,
            verbose=args.verbose,
            out=lambda line: print(line, flush=True),
        )
    )
    print(summary.line(), flush=True)
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
