"""Read one object through tiercache in fixed chunks; print digest, time and peak RSS as JSON.

Run as a fresh process by ``test_load.test_large_object_memory`` so that the peak resident set
size (``VmHWM``) it reports is the read's own: ``python rss_probe.py '{"options": ...,
"local_dir": ..., "path": ..., "chunk": ...}'``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import xxhash

from tiercache import TierCacheFileSystem


def vm_hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    args = json.loads(sys.argv[1])
    fs = TierCacheFileSystem(
        target_options=args["options"], local_dir=args["local_dir"], skip_instance_cache=True
    )
    rss_before = vm_hwm_mib()
    digest = xxhash.xxh3_128()
    total = 0
    began = time.monotonic()
    with fs.open(args["path"], "rb") as f:
        while block := f.read(args["chunk"]):
            digest.update(block)
            total += len(block)
    fs.wait_fetches()
    seconds = time.monotonic() - began
    stats = fs.stats()
    print(
        json.dumps(
            {
                "bytes": total,
                "xxh3_128": digest.hexdigest(),
                "seconds": seconds,
                "rss_before_mib": rss_before,
                "peak_rss_mib": vm_hwm_mib(),
                "gets": stats["store_requests"].get("GetObject", 0),
                "hits": stats["hits"],
            }
        )
    )


if __name__ == "__main__":
    main()
