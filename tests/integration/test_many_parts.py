"""Objects of more parts than S3 numbers (10,000): the upload takes larger parts, whether it
was streamed while written or sent after close()."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support.servers_under_test import S3Endpoint

from tiercache import TierCacheFileSystem
from tiercache.store import multipart

MiB = 1024 * 1024
PART = 5 * MiB


@pytest.mark.parametrize("while_writing", ["on", "off"])
def test_an_object_of_more_parts_than_s3_numbers_is_sent_in_larger_parts(
    s3: S3Endpoint,
    bucket: str,
    s3_client: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    while_writing: str,
) -> None:
    monkeypatch.setattr(multipart, "MAX_PARTS", 3)  # as 10,000 parts would, in 30 MiB
    fs = TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=str(tmp_path / "tier"),
        skip_instance_cache=True,
        part_size=PART,
        upload_while_writing=while_writing,
    )
    data = os.urandom(5 * PART + 99)  # six parts of part_size: twice what may be numbered
    with fs.open(f"{bucket}/big/model.pt", "wb") as f:
        for offset in range(0, len(data), MiB):
            f.write(data[offset : offset + MiB])
    fs.flush(f"{bucket}/big/", timeout=120)
    stored = s3_client.get_object(Bucket=bucket, Key="big/model.pt")
    assert stored["Body"].read() == data
    parts = int(stored["ETag"].strip('"').rpartition("-")[2])
    assert 1 < parts <= 3, stored["ETag"]
    uploads = s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u for u in uploads if u["Key"] == "big/model.pt"] == []  # none left behind
    assert fs.pending() == []
