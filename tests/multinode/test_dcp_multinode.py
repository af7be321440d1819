"""DCP checkpoints committed across nodes: 3 ranks, 3 local tiers, gloo, the real S3 server."""

# Each rank is a process of its own (``dcp_rank.run_rank``) with its own ``local_dir``, so each
# stands in for a node whose tier uploads only its own files. Rank 2 reaches the store through
# the fault proxy, which holds its data back where a test needs the other ranks to be ahead.

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import queue
import socket
import threading
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from support.proxy import FaultProxy

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (the adapters need the tiercache[torch] extra)"
)
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from dcp_rank import TENSORS_PER_RANK, rank_state, run_rank  # noqa: E402
from tiercache.adapters.torch_checkpoint import dcp_load  # noqa: E402

from tiercache import TierCacheFileSystem, UploadFailedError  # noqa: E402

pytestmark = pytest.mark.multinode

WORLD = 3
BOUND = 90.0  # seconds any rank may take to finish or fail: past it, it hangs
RANK_BYTES = TENSORS_PER_RANK * 256 * 1024 * 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# One forkserver, which imports torch, tiercache and boto3 once; each rank is a process forked
# from it (a fresh process, not a copy of this multi-threaded one). Installed modules only:
# Python 3.11's forkserver does not take this process's sys.path for its preload.
_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "tiercache.adapters.torch_checkpoint", "boto3"])


class Ranks:
    """Three rank processes and the events they send, in the order they came."""

    def __init__(
        self,
        s3: Any,
        bucket: str,
        tmp_path: Path,
        steps: list[list[Any]],
        rank2_endpoint: str,
        tiercache: Callable[[int], dict[str, Any]] = lambda rank: {},
        endpoint: str | None = None,
    ) -> None:
        """``tiercache``: each rank's extra options; ``endpoint``: every rank's store (by
        default rank 2's is ``rank2_endpoint`` and the others' the server)."""
        self.tmp_path = tmp_path
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        port = _free_port()
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.logs: list[Path] = []
        for rank in range(WORLD):
            log = tmp_path / f"rank{rank}.log"
            self.logs.append(log)
            job = {
                "rank": rank,
                "world": WORLD,
                "port": port,
                "pg_timeout": 60,
                "timeout": 60,
                "bucket": bucket,
                "local_dir": str(self.local_dir(rank)),
                "endpoint": endpoint or (rank2_endpoint if rank == 2 else s3.endpoint),
                "tiercache": tiercache(rank),
                "direct_endpoint": s3.endpoint,
                "key": s3.key,
                "secret": s3.secret,
                "region": s3.region,
                "gate_dir": str(tmp_path),
                "log": str(log),
                "steps": steps,
            }
            reader, writer = _CTX.Pipe(duplex=False)
            proc = _CTX.Process(target=run_rank, args=(job, writer), name=f"rank{rank}")
            proc.start()
            writer.close()
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(reader,), daemon=True).start()

    def local_dir(self, rank: int) -> Path:
        return self.tmp_path / f"node{rank}"

    def _read(self, reader: Connection) -> None:
        with reader:
            while True:
                try:
                    self.events.put(reader.recv())
                except (EOFError, OSError):
                    return

    def wait_for(self, event: str, ranks: range | list[int] = range(WORLD), **match: Any) -> None:
        """Wait until each of ``ranks`` sent ``event`` (with ``match``); fail on a hang."""
        missing = set(ranks)
        give_up = time.monotonic() + BOUND
        while missing:
            for row in self.seen:
                if row["event"] == event and all(row.get(k) == v for k, v in match.items()):
                    missing.discard(row["rank"])
            if not missing:
                return
            try:
                self.seen.append(self.events.get(timeout=max(0.0, give_up - time.monotonic())))
            except queue.Empty:
                pytest.fail(f"ranks {sorted(missing)} never sent {event}: {self.tails()}")

    def finish(self) -> list[int | None]:
        """Wait for every rank to exit (killing those past the bound) and take their events."""
        codes: list[int | None] = []
        for proc in self.procs:
            proc.join(timeout=BOUND)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
                codes.append(None)  # hung
            else:
                codes.append(proc.exitcode)
        time.sleep(0.2)  # the readers' last events
        while not self.events.empty():
            self.seen.append(self.events.get())
        return codes

    def kill(self, rank: int) -> None:
        self.procs[rank].kill()  # SIGKILL
        self.procs[rank].join()

    def of(self, event: str, rank: int) -> list[dict[str, Any]]:
        return [e for e in self.seen if e["event"] == event and e["rank"] == rank]

    def tails(self) -> str:
        """For a failure's message: the events so far and the end of each rank's log."""
        logs = (f"rank {r}: {log.read_text()[-1500:]}" for r, log in enumerate(self.logs))
        return "\n".join([self.timeline(), *logs])

    def timeline(self) -> str:
        t0 = min((e["t"] for e in self.seen), default=0.0)
        rows = sorted(self.seen, key=lambda e: e["t"])
        return "\n".join(f"{e['t'] - t0:7.2f} rank {e['rank']} {e['event']}" for e in rows)

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join()


def _keys(client: Any, bucket: str, step: int) -> dict[str, int]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"ckpt/step-{step}/")
    return {o["Key"]: o["Size"] for o in listed.get("Contents", [])}


def _marker(step: int) -> str:
    return f"ckpt/step-{step}/.metadata"


def _data_of(step: int, rank: int) -> str:
    return f"ckpt/step-{step}/__{rank}_0.distcp"


def _has_every_rank(keys: dict[str, int], step: int) -> bool:
    return all(keys.get(_data_of(step, r), 0) >= RANK_BYTES for r in range(WORLD))


def _poll(check: Callable[[], bool], what: str) -> None:
    give_up = time.monotonic() + BOUND
    while not check():
        if time.monotonic() > give_up:
            pytest.fail(f"never: {what}")
        time.sleep(0.1)


def _assert_loads(s3: Any, bucket: str, step: int, tier: Path) -> None:
    """Load the whole checkpoint in this (non-distributed) process from a fresh tier."""
    want = {k: v for r in range(WORLD) for k, v in rank_state(r, step).items()}
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    options = {"s3": s3.target_options(), "tiercache": {"local_dir": str(tier)}}
    with warnings.catch_warnings():  # torch: "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(got, f"tiercache::s3://{bucket}/ckpt/step-{step}", storage_options=options)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


@pytest.fixture
def launch(tmp_path: Path) -> Any:
    started: list[Ranks] = []

    def start(*args: Any) -> Ranks:
        ranks = Ranks(*args)
        started.append(ranks)
        return ranks

    yield start
    for ranks in started:
        ranks.close()


def test_metadata_reaches_the_store_after_every_nodes_data(
    s3: Any, bucket: str, proxy: FaultProxy, tmp_path: Path, launch: Any
) -> None:
    # Rank 2's upload is refused a few times first (503, retried): without a commit across
    # nodes, rank 0's .metadata would reach the store before rank 2's data file.
    proxy.fail_next(3, 503, method="PUT", path_contains=_data_of(1, 2))
    client = s3.client()
    violations: list[list[str]] = []
    seen_complete = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            keys = _keys(client, bucket, 1)
            if _marker(1) in keys:
                if _has_every_rank(keys, 1):
                    seen_complete.set()
                else:
                    violations.append(sorted(keys))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        ranks = launch(s3, bucket, tmp_path, [["save", 1, True], ["load", 1]], proxy.url)
        codes = ranks.finish()
        _poll(seen_complete.is_set, "the watcher saw the complete checkpoint")
    finally:
        done.set()
        watcher.join()
    assert codes == [0, 0, 0], ranks.tails()
    assert violations == []
    assert proxy.count("PUT", _data_of(1, 2)) > 3  # the faults were hit, then it went through
    for rank in range(WORLD):
        (saved,) = ranks.of("saved", rank)
        assert _marker(1) in saved["stored"]  # durable=True: committed when it returns
        assert all(_data_of(1, r) in saved["stored"] for r in range(WORLD))
        assert [e["equal"] for e in ranks.of("loaded", rank)] == [True]


def test_durable_false_then_the_wait_durable_collective(
    s3: Any, bucket: str, tmp_path: Path, launch: Any
) -> None:
    client = s3.client()
    steps = [["save", 1, False], ["gate", 1], ["wait", 1], ["load", 1]]
    ranks = launch(s3, bucket, tmp_path, steps, s3.endpoint)
    ranks.wait_for("saved", step=1)
    # Every rank's data file reaches the store in the background; .metadata stays held
    # until the ranks agree in wait_durable.
    _poll(lambda: _has_every_rank(_keys(client, bucket, 1), 1), "every data file stored")
    time.sleep(1.5)  # the uploaders' scans and retries have their chance at the marker
    assert _marker(1) not in _keys(client, bucket, 1)
    (tmp_path / "go-1").touch()
    codes = ranks.finish()
    assert codes == [0, 0, 0], ranks.tails()
    for rank in range(WORLD):
        (durable,) = ranks.of("durable", rank)
        assert _marker(1) in durable["stored"], durable  # on every rank, when it returns
        assert [e["equal"] for e in ranks.of("loaded", rank)] == [True]
    assert _keys(client, bucket, 1).keys() == {_marker(1), *(_data_of(1, r) for r in range(3))}


def test_a_rank_killed_mid_save_commits_nothing(
    s3: Any, bucket: str, proxy: FaultProxy, tmp_path: Path, launch: Any
) -> None:
    client = s3.client()
    proxy.fail_next(10**6, 503, path_contains=_data_of(2, 2))  # rank 2's step-2 data: never
    steps = [["save", 1, True], ["save", 2, False], ["wait", 2]]
    ranks = launch(s3, bucket, tmp_path, steps, proxy.url)
    ranks.wait_for("saved", step=2)
    _poll(lambda: proxy.count(path_contains=_data_of(2, 2)) > 0, "rank 2 uploads step 2")
    ranks.kill(2)
    codes = ranks.finish()

    assert codes[:2] == [3, 3], ranks.tails()  # an error on both survivors, no hang
    for rank in (0, 1):
        (error,) = ranks.of("error", rank)
        assert error["type"].startswith("CheckpointCommit"), error
        assert "step-2" in error["message"], error
    assert _marker(2) not in _keys(client, bucket, 2)
    # The coordinator's tier, opened again (as the next process or `tiercache flush` does):
    # its marker was dropped, so nothing there can upload it.
    fs = TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=str(ranks.local_dir(0)),
        skip_instance_cache=True,
    )
    assert [
        r["name"] for r in fs.pending(f"{bucket}/ckpt/step-2/") if ".metadata" in r["name"]
    ] == []
    fs.flush(f"{bucket}/ckpt/", timeout=BOUND)
    assert _marker(2) not in _keys(client, bucket, 2)
    # The previous checkpoint is intact and loads, from the store alone.
    assert _has_every_rank(_keys(client, bucket, 1), 1) and _marker(1) in _keys(client, bucket, 1)
    _assert_loads(s3, bucket, 1, tmp_path / "load-tier")


def test_a_killed_coordinator_leaves_its_marker_held(
    s3: Any, bucket: str, proxy: FaultProxy, tmp_path: Path, launch: Any
) -> None:
    client = s3.client()
    proxy.fail_next(10**6, 503, path_contains=_data_of(2, 2))  # the ranks cannot agree yet
    ranks = launch(s3, bucket, tmp_path, [["save", 2, False], ["wait", 2]], proxy.url)
    ranks.wait_for("saved", step=2)
    _poll(lambda: proxy.count(path_contains=_data_of(2, 2)) > 0, "rank 2 uploads step 2")
    ranks.kill(0)  # its .metadata is journaled, held
    proxy.clear()  # rank 2's data goes now; the agreement finds rank 0 gone
    codes = ranks.finish()

    assert codes[1:] == [3, 3], ranks.tails()
    for rank in (1, 2):
        (error,) = ranks.of("error", rank)
        assert error["type"].startswith("CheckpointCommit"), error
    # Whoever resumes the coordinator's journal uploads its data but never the marker: the
    # hold outlived its holder, so the marker is reported failed.
    fs = TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=str(ranks.local_dir(0)),
        skip_instance_cache=True,
    )
    with pytest.raises(UploadFailedError, match=r"\.metadata.*never committed"):
        fs.flush(f"{bucket}/ckpt/step-2/", timeout=BOUND)
    keys = _keys(client, bucket, 2)
    assert _has_every_rank(keys, 2), keys
    assert _marker(2) not in keys


# Ranks 0 and 1 on host A, rank 2 on host B, staging their writes on one shared tier.
_HOST_OF = {0: "hostA", 1: "hostA", 2: "hostB"}
_STALE = 2.0  # lease_stale_after: another host takes over a lost host's claims and holds


def _on_shared_tier(tmp_path: Path) -> Callable[[int], dict[str, Any]]:
    def options(rank: int) -> dict[str, Any]:
        return {
            "shared_dir": str(tmp_path / "shared"),
            "write_tier": "shared",
            "host_id": _HOST_OF[rank],
            "lease_stale_after": _STALE,
            "retries": 1,
        }

    return options


def _host_b(s3: Any, endpoint: str, tmp_path: Path) -> TierCacheFileSystem:
    """A process of host B on the shared tier (as `tiercache flush` there would be)."""
    return TierCacheFileSystem(
        target_options={**s3.target_options(), "endpoint_url": endpoint},
        local_dir=str(tmp_path / "hostB-flush"),
        shared_dir=str(tmp_path / "shared"),
        write_tier="shared",
        host_id="hostB",
        lease_stale_after=_STALE,
        skip_instance_cache=True,
    )


def _refuse_uploads(proxy: FaultProxy) -> None:
    for method in ("PUT", "POST"):
        proxy.fail_next(10**6, 503, method=method)


def test_a_save_durable_on_the_shared_tier_is_committed_from_another_host(
    s3: Any, bucket: str, proxy: FaultProxy, tmp_path: Path, launch: Any
) -> None:
    client = s3.client()
    _refuse_uploads(proxy)  # nothing reaches the store while the ranks live
    steps = [["save", 1, True, "shared"], ["gate", 1]]
    ranks = launch(s3, bucket, tmp_path, steps, proxy.url, _on_shared_tier(tmp_path), proxy.url)
    ranks.wait_for("saved", step=1)  # every rank returned: durable on the shared tier
    for rank in range(WORLD):
        (saved,) = ranks.of("saved", rank)
        assert saved["stored"] == []  # none of it in the store yet
    ranks.kill(0)
    ranks.kill(1)  # host A is lost, the coordinator with it
    ranks.kill(2)  # and host B's rank: the shared tier alone holds the checkpoint
    proxy.clear()
    violations: list[list[str]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            keys = _keys(client, bucket, 1)
            if _marker(1) in keys and not _has_every_rank(keys, 1):
                violations.append(sorted(keys))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        _host_b(s3, proxy.url, tmp_path).flush(timeout=BOUND)
    finally:
        done.set()
        watcher.join()
    assert violations == []
    keys = _keys(client, bucket, 1)
    assert _marker(1) in keys and _has_every_rank(keys, 1), keys
    _assert_loads(s3, bucket, 1, tmp_path / "load-tier")


def test_a_coordinator_lost_before_the_commit_leaves_no_metadata_in_the_store(
    s3: Any, bucket: str, proxy: FaultProxy, tmp_path: Path, launch: Any
) -> None:
    client = s3.client()
    _refuse_uploads(proxy)
    steps = [["save", 2, False], ["gate", 2]]  # the coordinator holds .metadata back
    ranks = launch(s3, bucket, tmp_path, steps, proxy.url, _on_shared_tier(tmp_path), proxy.url)
    ranks.wait_for("saved", step=2)
    ranks.kill(0)
    ranks.kill(1)  # host A, the coordinator's, is lost before wait_durable
    proxy.clear()
    survivor = _host_b(s3, proxy.url, tmp_path)
    # The data files go; the marker, whose holder's heartbeat stopped, is never committed.
    with pytest.raises(UploadFailedError, match=r"\.metadata.*never committed"):
        survivor.flush(timeout=BOUND)
    keys = _keys(client, bucket, 2)
    assert _has_every_rank(keys, 2), keys
    assert _marker(2) not in keys
    (tmp_path / "go-2").touch()
