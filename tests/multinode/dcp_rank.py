"""One rank of a distributed DCP checkpoint, standing in for one node (its own local tier)."""

# test_dcp_multinode.py starts ``run_rank`` in a process of its own per rank (forked by a
# forkserver that imported this module once, so torch is not imported three times per test).
# The job names the rank, the rendezvous port, the bucket, this rank's local_dir and endpoint,
# the store's credentials and the steps to run; each step sends one event as it finishes.

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import boto3
import torch
import torch.distributed as dist
from tiercache.adapters.torch_checkpoint import (
    CheckpointCommitError,
    dcp_load,
    dcp_save,
    wait_durable,
)

TENSORS_PER_RANK = 2


def rank_state(rank: int, step: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` saves at ``step``: keys of its own, so each rank writes a data file."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {
        f"rank{rank}.w{i}": torch.randn(256, 1024, generator=g) for i in range(TENSORS_PER_RANK)
    }


class Rank:
    def __init__(self, job: dict[str, Any], events: Connection) -> None:
        self.job = job
        self.rank: int = job["rank"]
        self.bucket: str = job["bucket"]
        self.events = events
        self.region = job["region"]
        self.s3 = {
            "endpoint_url": job["endpoint"],
            "key": job["key"],
            "secret": job["secret"],
            "client_kwargs": {"region_name": self.region},
        }

    def emit(self, event: str, **detail: Any) -> None:
        self.events.send({"rank": self.rank, "event": event, "t": time.time(), **detail})

    def options(self, local_dir: str) -> dict[str, Any]:
        return {"s3": self.s3, "tiercache": {"local_dir": local_dir, **self.job["tiercache"]}}

    def url(self, step: int) -> str:
        return f"tiercache::s3://{self.bucket}/ckpt/step-{step}"

    def stored(self, step: int) -> list[str]:
        """The keys of ``step`` in the store, as plain boto3 sees them (not through a proxy)."""
        client = boto3.client(
            "s3",
            endpoint_url=self.job["direct_endpoint"],
            aws_access_key_id=self.s3["key"],
            aws_secret_access_key=self.s3["secret"],
            region_name=self.region,
        )
        listed = client.list_objects_v2(Bucket=self.bucket, Prefix=f"ckpt/step-{step}/")
        return sorted(o["Key"] for o in listed.get("Contents", []))

    def save(self, step: int, durable: bool, level: str = "store") -> None:
        dcp_save(
            rank_state(self.rank, step),
            self.url(step),
            storage_options=self.options(self.job["local_dir"]),
            durable=durable,
            timeout=self.job["timeout"],
            level=level,  # type: ignore[arg-type]
        )
        self.emit("saved", step=step, durable=durable, stored=self.stored(step))

    def wait(self, step: int) -> None:
        wait_durable(
            self.url(step),
            storage_options=self.options(self.job["local_dir"]),
            timeout=self.job["timeout"],
        )
        self.emit("durable", step=step, stored=self.stored(step))

    def load(self, step: int) -> None:
        """Load this rank's part from a fresh local tier: every byte comes from the store."""
        want = rank_state(self.rank, step)
        got = {name: torch.zeros_like(t) for name, t in want.items()}
        fresh = f"{self.job['local_dir']}-load-{step}"
        options = {"s3": self.s3, "tiercache": {"local_dir": fresh}}  # no shared tier
        dcp_load(got, self.url(step), storage_options=options)
        equal = all(torch.equal(got[name], t) for name, t in want.items())
        self.emit("loaded", step=step, equal=equal)

    def gate(self, step: int) -> None:
        """Wait until the test opens the gate of ``step`` (it looks at the store meanwhile)."""
        gate = os.path.join(self.job["gate_dir"], f"go-{step}")
        give_up = time.monotonic() + self.job["timeout"]
        while not os.path.exists(gate):
            if time.monotonic() > give_up:
                raise TimeoutError(f"the test never opened {gate}")
            time.sleep(0.05)
        self.emit("gate", step=step)


def run_rank(job: dict[str, Any], events: Connection) -> None:
    """Join the process group and run the job's steps; exit 3 on a checkpoint commit error."""
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    torch.set_num_threads(1)
    node = Rank(job, events)
    node.emit("started")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{job['port']}",
        rank=node.rank,
        world_size=job["world"],
        timeout=timedelta(seconds=job["pg_timeout"]),
    )
    started = time.monotonic()
    try:
        for action, step, *rest in job["steps"]:
            if action == "save":
                node.save(step, bool(rest[0]), *rest[1:])
            else:
                getattr(node, action)(step)
    except CheckpointCommitError as exc:
        node.emit(
            "error",
            type=type(exc).__name__,
            message=str(exc),
            failures=exc.failures,
            seconds=time.monotonic() - started,
        )
        sys.exit(3)
    dist.destroy_process_group()
    node.emit("done")
