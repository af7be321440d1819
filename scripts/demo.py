"""The tiercache demo: a dataset in an S3 server, read cold then warm through the cache.

Without ``--endpoint`` it starts the bundled server (SeaweedFS on 127.0.0.1). With
``--endpoint URL`` it uses that server instead, with the credentials of AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY (and AWS_DEFAULT_REGION, default us-east-1) from the environment; the
demo's bucket is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fsspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3server

MiB = 1024 * 1024


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=8, help="number of shards (default 8)")
    parser.add_argument("--shard-mib", type=int, default=32, help="MiB per shard (default 32)")
    parser.add_argument(
        "--endpoint",
        help="S3 endpoint URL to use instead of the bundled server; credentials from "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    )
    return parser.parse_args()


@contextmanager
def _store(endpoint: str | None, workdir: Path) -> Iterator[s3server.S3Endpoint]:
    if endpoint is None:
        print("starting the bundled S3 server (SeaweedFS on 127.0.0.1)...")
        with s3server.start_server(data_dir=str(workdir / "s3")) as server:
            yield server.s3
        return
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise SystemExit("demo: --endpoint needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set")
    print(f"using the S3 server at {endpoint}")
    yield s3server.S3Endpoint(
        endpoint, key, secret, os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    )


def _write_dataset(client: Any, bucket: str, shards: int, size: int) -> dict[str, bytes]:
    client.create_bucket(Bucket=bucket)
    dataset = {}
    for i in range(shards):
        key = f"dataset/shard-{i:05d}.bin"
        dataset[key] = os.urandom(size)
        client.put_object(Bucket=bucket, Key=key, Body=dataset[key])
    return dataset


def _read_all(urls: list[str], options: dict[str, Any]) -> tuple[float, list[bytes]]:
    started = time.perf_counter()
    blobs = []
    for url in urls:
        with fsspec.open(url, "rb", **options) as f:
            blobs.append(f.read())
    return time.perf_counter() - started, blobs


def main() -> int:
    args = _parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tiercache-demo-"))
    try:
        with _store(args.endpoint, workdir) as store:
            client = store.client()
            bucket = f"demo-{secrets.token_hex(4)}"
            try:
                dataset = _write_dataset(client, bucket, args.shards, args.shard_mib * MiB)
                total = sum(len(b) for b in dataset.values())
                print(
                    f"wrote {len(dataset)} shards, {total / MiB:.0f} MiB, to s3://{bucket}/dataset/"
                )
                options = {
                    "s3": store.target_options(),
                    "tiercache": {"local_dir": str(workdir / "tier"), "consistency": "immutable"},
                }
                urls = [f"tiercache::s3://{bucket}/{key}" for key in dataset]
                cold, cold_blobs = _read_all(urls, options)
                warm, warm_blobs = _read_all(urls, options)
                fs, _ = fsspec.core.url_to_fs(urls[0], **options)
                fs.wait_fetches()
                stats = fs.stats()
            finally:
                _remove_bucket(client, bucket)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    expected = list(dataset.values())
    verified = cold_blobs == expected and warm_blobs == expected
    _report(total, cold, warm, stats, verified)
    return 0 if verified else 1


def _remove_bucket(client: Any, bucket: str) -> None:
    """Leave the server as it was (the bundled one is thrown away anyway)."""
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=item["Key"])
    except client.exceptions.NoSuchBucket:
        return
    client.delete_bucket(Bucket=bucket)


def _report(total: int, cold: float, warm: float, stats: dict[str, Any], ok: bool) -> None:
    print()
    print(f"  cold read (from S3, through the cache): {total / MiB / cold:8.1f} MiB/s")
    print(f"  warm read (from the local tier):        {total / MiB / warm:8.1f} MiB/s")
    print(f"  warm / cold:                             {cold / warm:8.1f}x")
    print()
    print(
        f"  cache misses {stats['misses']:.0f}, hits {stats['hits']:.0f}, "
        f"GET requests {stats['store_requests'].get('GetObject', 0)}, "
        f"bytes fetched {stats['bytes_fetched'] / MiB:.0f} MiB, "
        f"bytes served {stats['bytes_read'] / MiB:.0f} MiB"
    )
    print(f"  local tier usage {stats['local_usage_bytes'] / MiB:.0f} MiB")
    print(f"  every byte verified: {'yes' if ok else 'NO - MISMATCH'}")


if __name__ == "__main__":
    sys.exit(main())
