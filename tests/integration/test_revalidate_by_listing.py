"""Revalidation by listing against the real server: one LIST of a prefix vouches for its objects.

In ``ttl`` mode a cached copy older than the ttl is checked against the listing of its parent
prefix, not a HEAD of its own: a warm epoch from a new process costs one LIST per prefix, and
an object changed, deleted or added under the prefix is seen as such.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

TTL = 1.0


def _put_many(client: Any, bucket: str, prefix: str, count: int) -> dict[str, bytes]:
    bodies = {f"{prefix}{i:04d}": os.urandom(1000 + i) for i in range(count)}
    for key, body in bodies.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    return bodies


def _read_all(fs: Any, bucket: str, bodies: dict[str, bytes]) -> None:
    for key, body in bodies.items():
        with fs.open(f"{bucket}/{key}", "rb") as f:
            assert f.read() == body, key


def _requests_between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Store requests by operation between two ``fs.stats()``."""
    old = before["store_requests"]
    return {op: n - old.get(op, 0) for op, n in after["store_requests"].items()}


def test_a_warm_epoch_after_the_ttl_sends_one_list_and_no_head(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    bodies = _put_many(s3_client, bucket, "train/", 150)
    fs = make_fs(consistency="ttl", ttl=TTL)
    _read_all(fs, bucket, bodies)
    fs.wait_fetches()
    time.sleep(TTL + 0.2)
    before = fs.stats()
    _read_all(fs, bucket, bodies)
    sent = _requests_between(before, fs.stats())
    assert sent.get("HeadObject", 0) == 0
    assert sent.get("GetObject", 0) == 0
    assert sent.get("ListObjectsV2", 0) == 1  # 150 objects: one page


def test_a_new_process_revalidates_by_the_listing_the_host_keeps(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    """A DataLoader worker started after the ttl: no HEAD, one LIST for all processes while
    the listing is fresh (the metadata cache keeps it beside the tier)."""
    bodies = _put_many(s3_client, bucket, "shards/", 120)
    tier = str(tmp_path / "tier")
    # Longer than ``TTL``: the second worker, a new interpreter that imports tiercache first,
    # must start within the ttl of the first one's listing even on a busy machine.
    ttl = 4.0
    script = f"""
import json, sys
from tiercache import TierCacheFileSystem
fs = TierCacheFileSystem(target_options={s3.target_options()!r}, local_dir={tier!r},
                         consistency="ttl", ttl={ttl!r}, skip_instance_cache=True)
keys = sorted(json.loads(sys.argv[1]))
for key in keys:
    fs.cat_file({bucket!r} + "/" + key)
fs.wait_fetches()
print(json.dumps(fs.stats()["store_requests"]))
"""
    keys = list(bodies)

    def run() -> dict[str, int]:
        done = subprocess.run(
            [sys.executable, "-c", script, json.dumps(keys)],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    assert run().get("GetObject", 0) == 120  # cold
    time.sleep(ttl + 0.2)
    first = run()
    assert first.get("HeadObject", 0) == 0 and first.get("GetObject", 0) == 0
    assert first.get("ListObjectsV2", 0) == 1
    second = run()  # within the ttl of the listing the first worker made
    assert second == {} or sum(second.values()) == 0


def test_a_listing_sees_an_object_changed_deleted_and_added(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    bodies = _put_many(s3_client, bucket, "data/", 20)
    fs = make_fs(consistency="ttl", ttl=TTL)
    _read_all(fs, bucket, bodies)
    fs.wait_fetches()
    changed, deleted, added = "data/0003", "data/0007", "data/9999"
    bodies[changed] = b"a new version, of another size"
    s3_client.put_object(Bucket=bucket, Key=changed, Body=bodies[changed])
    s3_client.delete_object(Bucket=bucket, Key=deleted)
    del bodies[deleted]
    bodies[added] = b"added after the first epoch"
    s3_client.put_object(Bucket=bucket, Key=added, Body=bodies[added])
    time.sleep(TTL + 0.2)
    before = fs.stats()
    _read_all(fs, bucket, bodies)
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{bucket}/{deleted}")
    assert not fs.is_cached(f"{bucket}/{deleted}")
    after = fs.stats()
    requests = _requests_between(before, after)
    assert requests.get("HeadObject", 0) == 0
    assert requests.get("GetObject", 0) == 2  # the changed object and the added one
    assert after["invalidations"] - before["invalidations"] == 2  # changed and deleted


def test_an_overwrite_of_the_same_size_is_seen_by_its_etag(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    """The ETag decides, not only the size: same-length new bytes are fetched again."""
    s3_client.put_object(Bucket=bucket, Key="p/k", Body=b"A" * 64)
    fs = make_fs(consistency="ttl", ttl=TTL)
    assert fs.cat_file(f"{bucket}/p/k") == b"A" * 64
    fs.wait_fetches()
    s3_client.put_object(Bucket=bucket, Key="p/k", Body=b"B" * 64)
    time.sleep(TTL + 0.2)
    assert fs.cat_file(f"{bucket}/p/k") == b"B" * 64


def test_readers_while_objects_change_under_a_listed_prefix(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    """Readers loop over a prefix while another client rewrites, deletes and re-adds objects:
    every read returns one whole version that the store held, never a mix; once the writes
    stop and a ttl has passed, every read returns the store's last version."""
    versions: dict[str, list[bytes]] = {}
    keys = [f"live/{i:02d}" for i in range(12)]
    for key in keys:
        body = f"{key} v0 ".encode() * 50
        versions[key] = [body]
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    fs = make_fs(consistency="ttl", ttl=0.3)
    stop = threading.Event()
    errors: list[str] = []
    lock = threading.Lock()

    def reader() -> None:
        while not stop.is_set():
            for key in keys:
                try:
                    got = fs.cat_file(f"{bucket}/{key}")
                except FileNotFoundError:
                    continue  # deleted for a while: a valid answer
                with lock:
                    wrong = got not in versions[key]
                if wrong:  # what the cache and the store say now, to tell which one erred
                    errors.append(
                        f"{key}: {got[:20]!r} ({len(got)} bytes) was never stored; "
                        f"info then {_said(fs.info, f'{bucket}/{key}')}, the store "
                        f"{_said(s3_client.head_object, Bucket=bucket, Key=key)}"
                    )

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for round_ in range(1, 25):
            key = keys[round_ % len(keys)]
            if round_ % 5 == 0:
                s3_client.delete_object(Bucket=bucket, Key=key)
                time.sleep(0.1)
            body = f"{key} v{round_} ".encode() * (50 + round_)
            with lock:
                versions[key].append(body)
            s3_client.put_object(Bucket=bucket, Key=key, Body=body)
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors[:5]
    fs.wait_fetches()
    time.sleep(0.4)
    for key in keys:
        assert fs.cat_file(f"{bucket}/{key}") == versions[key][-1], key


def _said(ask: Any, *args: Any, **kwargs: Any) -> str:
    """An answer, or the error it raised, for a failure's message."""
    try:
        return repr(ask(*args, **kwargs))[:300]
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
