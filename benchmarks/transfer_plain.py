"""A plain script's boto3 TransferManager download of objects into memory, as a reference."""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Sequence

import boto3
import xxhash


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--endpoint", required=True, help="the S3 endpoint URL")
    p.add_argument("--bucket", required=True)
    p.add_argument("keys", nargs="+", help="the objects, read one after another")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Print one JSON line: the seconds, CPU seconds, size and xxh3_128 digest of each object.

    Credentials and region come from the AWS_* environment variables. The client and the
    TransferConfig are boto3's defaults, nothing tuned: what a user's first script gets.
    The first object is read once untimed before the timed reads: a new process pays once for
    imports, its first connections and memory touched the first time (tens of ms, a third of
    a 16 MiB read on loopback), which a benchmark's process has paid before its timed passes.
    """
    args = parse_args(argv)
    client = boto3.client("s3", endpoint_url=args.endpoint)
    client.download_fileobj(args.bucket, args.keys[0], io.BytesIO())
    rows = []
    for key in args.keys:
        buf = io.BytesIO()
        cpu0, start = time.process_time(), time.perf_counter()
        client.download_fileobj(args.bucket, key, buf)
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        view = buf.getbuffer()
        rows.append(
            {
                "key": key,
                "seconds": seconds,
                "cpu_s": cpu,
                "bytes": view.nbytes,
                "digest": xxhash.xxh3_128_hexdigest(view),
            }
        )
        del view
    print(json.dumps({"objects": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
