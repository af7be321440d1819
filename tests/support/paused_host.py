"""Trials of a host paused past its lease while its upload is on the wire (issue N1).

One trial: host A writes ``v1`` of a key behind (``write_tier="shared"``). The store refuses
A's first attempts (503, at once or slowly); one of A's requests (the PUT, a part, or the
completion of a multipart upload) is then taken whole by the proxy, A's process is stopped
(SIGSTOP) and the request is held, as a request stuck on the wire behind a frozen host.
Host B (stopped until then, so that A's request is the one held) runs again; its ``flush``
takes the upload over once A's lease is stale, uploads ``v1``, writes ``v2``
and flushes it. Then the held request goes to the store and A runs again; A flushes. The
store must hold ``v2`` (the newest acknowledged version), and every flush that reported
success must have been right.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from support.cephfs_hosts import HostProcess
from support.proxy import FaultProxy

MiB = 1024 * 1024


@dataclass(frozen=True)
class Scenario:
    """Where host A is stopped, and how the store refused it before."""

    name: str
    size: int  # bytes of each version (over part_size: a multipart upload)
    method: str  # the held request's method
    target: str  # and a piece of its target ("{key}" stands for the key)
    refusals: int = 2  # 503s before the held request
    slow_refusals: bool = False  # each refusal answered after 0.3 s
    part: int = 0  # hold this part (its number ends the target)


SCENARIOS = (
    Scenario("put in the retry loop", 1 * MiB, "PUT", "/{key}"),
    Scenario("put after slow refusals", 1 * MiB, "PUT", "/{key}", slow_refusals=True),
    Scenario("between parts", 12 * MiB, "PUT", "/{key}?uploadId=", refusals=0, part=2),
    Scenario("before the completion", 12 * MiB, "POST", "/{key}?uploadId=", refusals=0),
)
PART_SIZE = 5 * MiB


def _store_sha256(s3_client: Any, path: str) -> str:
    bucket, key = path.split("/", 1)
    body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return hashlib.sha256(body).hexdigest()


def _check(reply: dict[str, Any], what: str) -> dict[str, Any]:
    assert "error" not in reply, f"{what}: {reply}"
    return reply


def run_trial(
    scenario: Scenario,
    path: str,
    host_a: HostProcess,
    host_b: HostProcess,
    proxy: FaultProxy,
    s3_client: Any,
    lease: float,
) -> dict[str, Any]:
    """One trial on ``path``; returns what happened (the assertions are made here)."""
    pid_a = int(host_a.ready()["pid"])
    key = path.split("/", 1)[1]
    if scenario.refusals:
        if scenario.slow_refusals:
            proxy.delay(0.3)
        proxy.fail_next(
            scenario.refusals,
            status=503,
            method="PUT",
            path_contains=f"/{key}",
            user_agent_contains=f"app/{host_a.host}",
        )

    def stop_a() -> None:
        os.kill(pid_a, signal.SIGSTOP)

    target = scenario.target.format(key=key)
    if scenario.part:  # a part's target is ?uploadId=…&partNumber=N
        proxy.hold_next(0, stop_a)  # (a rule that matches nothing keeps the order plain)
        target = f"&partNumber={scenario.part}"
    release, answered = proxy.hold_next(
        1,
        stop_a,
        method=scenario.method,
        path_contains=target,
        user_agent_contains=f"app/{host_a.host}",
    )
    # B stays stopped until A is: otherwise B's background scan may take the upload over
    # between two of A's attempts, and A never sends the request the trial holds.
    pid_b = int(host_b.ready()["pid"])
    os.kill(pid_b, signal.SIGSTOP)
    stopped = False
    try:
        v1 = _check(host_a.call("write_behind", sizes={path: scenario.size}), "A writes v1")
        deadline = time.monotonic() + 60
        while not _stopped(pid_a):
            assert time.monotonic() < deadline, (
                f"host A's request never reached the proxy: {[e[:2] for e in proxy.log[-8:]]}"
            )
            time.sleep(0.02)
        stopped = True
        proxy.clear()
        os.kill(pid_b, signal.SIGCONT)
        time.sleep(lease * 1.5)  # A's lease goes stale: it sends no heartbeat while stopped
        _check(host_b.call("flush", seconds=120.0, timeout=180), "B flushes v1")
        assert _store_sha256(s3_client, path) == v1["sha256"][path]
        v2 = _check(host_b.call("write_behind", sizes={path: scenario.size}), "B writes v2")
        _check(host_b.call("flush", seconds=120.0, timeout=180), "B flushes v2")
        assert _store_sha256(s3_client, path) == v2["sha256"][path]
        release.set()  # the request stuck on the wire reaches the store now
        assert answered.wait(60), "the held request was never answered"
    finally:
        os.kill(pid_b, signal.SIGCONT)
        release.set()
        if stopped or _stopped(pid_a):
            os.kill(pid_a, signal.SIGCONT)
    flushed_a = host_a.call("flush", seconds=60.0, timeout=120)
    pending_a = host_a.call("pending")["rows"]
    pending_b = host_b.call("pending")["rows"]
    held = _store_sha256(s3_client, path)
    assert held == v2["sha256"][path], (
        f"{scenario.name}: the store holds {'v1' if held == v1['sha256'][path] else held}, "
        "not the newest acknowledged version v2"
    )
    assert "error" not in flushed_a, f"{scenario.name}: A's flush failed: {flushed_a}"
    assert [r for r in pending_a + pending_b if r["name"] == path] == []
    return {"scenario": scenario.name, "path": path}


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state T in /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"
