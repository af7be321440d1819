"""Upload while writing, against the real server: parts leave early, the object lands only
after close(), and what a killed writer began is aborted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support.servers_under_test import S3Endpoint

from tiercache import TierCacheFileSystem

MiB = 1024 * 1024
PART = 5 * MiB


def _fs(s3: S3Endpoint, local_dir: Path) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=str(local_dir),
        skip_instance_cache=True,
        part_size=PART,
        upload_while_writing="on",
    )


def _open_uploads(s3_client: Any, bucket: str, key: str) -> list[str]:
    uploads = s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return [u["UploadId"] for u in uploads if u["Key"] == key]


def _parts_in_store(s3_client: Any, bucket: str, key: str) -> int:
    ids = _open_uploads(s3_client, bucket, key)
    if not ids:
        return 0
    listed = s3_client.list_parts(Bucket=bucket, Key=key, UploadId=ids[0])
    return len(listed.get("Parts", []))


def _wait_for(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _exists(s3_client: Any, bucket: str, key: str) -> bool:
    try:
        s3_client.head_object(Bucket=bucket, Key=key)
    except s3_client.exceptions.ClientError:
        return False
    return True


def test_parts_reach_the_store_before_close_and_the_object_after_it(
    s3: S3Endpoint, bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    fs = _fs(s3, tmp_path / "tier")
    data = os.urandom(3 * PART + 4321)
    f = fs.open(f"{bucket}/ckpt/model.pt", "wb")
    for offset in range(0, 3 * PART, MiB):
        f.write(data[offset : offset + MiB])
    _wait_for(lambda: _parts_in_store(s3_client, bucket, "ckpt/model.pt") == 3)
    assert not _exists(s3_client, bucket, "ckpt/model.pt")  # nothing visible before close()
    f.write(data[3 * PART :])
    f.close()
    fs.flush(f"{bucket}/ckpt/", timeout=120)
    stored = s3_client.get_object(Bucket=bucket, Key="ckpt/model.pt")
    assert stored["Body"].read() == data
    assert stored["ETag"].strip('"').endswith("-4")  # one multipart upload of four parts
    assert fs.stats()["uploads_streamed"] == 1
    assert _open_uploads(s3_client, bucket, "ckpt/model.pt") == []


def test_what_a_killed_writer_began_is_aborted_by_fsck(
    s3: S3Endpoint, bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    local_dir = tmp_path / "tier"
    ready = tmp_path / "parts-sent"
    script = f"""
import os, signal, sys, time
from tiercache import TierCacheFileSystem
fs = TierCacheFileSystem(target_options={s3.target_options()!r}, local_dir={str(local_dir)!r},
    skip_instance_cache=True, part_size={PART}, upload_while_writing="on")
f = fs.open({bucket + "/ckpt/killed.pt"!r}, "wb")
for _ in range(2 * {PART} // {MiB} + 1):
    f.write(os.urandom({MiB}))
while fs.stats()["multipart_aborted"] == 0 and not os.path.exists({str(ready)!r}):
    time.sleep(0.05)
"""
    writer = subprocess.Popen([sys.executable, "-c", script])
    try:
        _wait_for(lambda: _parts_in_store(s3_client, bucket, "ckpt/killed.pt") == 2)
    finally:
        writer.kill()
        writer.wait(30)
    assert len(_open_uploads(s3_client, bucket, "ckpt/killed.pt")) == 1
    staging = local_dir / "staging"
    sidecars = [p for p in staging.iterdir() if p.name.endswith(".mpu")]
    assert len(sidecars) == 1
    fs = _fs(s3, local_dir)
    assert fs.fsck()["multipart_aborted"] == 0  # young: it may belong to a live writer
    for path in staging.iterdir():
        os.utime(path, (time.time() - 60, time.time() - 60))
    report = fs.fsck()
    assert report["multipart_aborted"] == 1
    assert _open_uploads(s3_client, bucket, "ckpt/killed.pt") == []
    assert list(staging.iterdir()) == []
    assert not _exists(s3_client, bucket, "ckpt/killed.pt")
    assert fs.pending() == []
