"""One rank of a DCP checkpoint on a CephFS "host": saves, says so, then waits to be killed.

The job comes on stdin as one JSON line (credentials included, never in argv): rank, world,
rendezvous port, the checkpoint's URL, ``storage_options`` and how to save (``durable``,
``level``). The rank prints ``@@saved`` once ``dcp_save`` returned (or ``@@error <type>``),
then blocks until its stdin closes or it is killed.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from tiercache.adapters.torch_checkpoint import dcp_save


def rank_state(rank: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` saves: keys of its own, so each rank writes a data file."""
    g = torch.Generator().manual_seed(7000 + rank)
    return {f"rank{rank}.w{i}": torch.randn(512, 1024, generator=g) for i in range(2)}


def main() -> None:
    job = json.loads(sys.stdin.readline())
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{job['port']}",
        rank=job["rank"],
        world_size=job["world"],
        timeout=timedelta(seconds=120),
    )
    try:
        dcp_save(
            rank_state(job["rank"]),
            job["url"],
            storage_options=job["storage_options"],
            durable=job["durable"],
            level=job["level"],
            timeout=120,
        )
    except Exception as exc:
        print(f"@@error {type(exc).__name__}: {exc}", flush=True)
    else:
        print("@@saved", flush=True)
    sys.stdin.read()  # until the test closes it, or kills this host


if __name__ == "__main__":
    main()
