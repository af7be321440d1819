"""write_mode="through": writes reach the store before close() returns; bytes become the entry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import xxhash

MiB = 1024 * 1024


def test_write_then_read_back_without_a_download(make_fs: Any, s3_client: Any, bucket: str) -> None:
    fs = make_fs(part_size=5 * MiB, write_mode="through")
    data = os.urandom(12 * MiB + 3)  # above the part size: a parallel multipart upload
    with fs.open(f"{bucket}/ckpt/model.bin", "wb") as f:
        for i in range(0, len(data), MiB):
            f.write(data[i : i + MiB])
    stored = s3_client.get_object(Bucket=bucket, Key="ckpt/model.bin")
    assert stored["Body"].read() == data
    assert stored["Metadata"]["tiercache-xxh3"] == xxhash.xxh3_64(data).hexdigest()
    assert fs.cat_file(f"{bucket}/ckpt/model.bin") == data
    stats = fs.stats()
    assert stats["hits"] == 1 and stats["store_requests"].get("GetObject", 0) == 0
    assert stats["store_requests"]["UploadPart"] == 3


def test_failed_with_block_uploads_nothing(make_fs: Any, s3_client: Any, bucket: str) -> None:
    fs = make_fs(write_mode="through")
    with pytest.raises(RuntimeError), fs.open(f"{bucket}/half.bin", "wb") as f:
        f.write(b"partial")
        raise RuntimeError("training crashed")
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert os.listdir(fs.tier.staging_dir) == []


def test_overwrite_invalidates_cached_copy(make_fs: Any, bucket: str) -> None:
    fs = make_fs(consistency="immutable", write_mode="through")
    fs.pipe_file(f"{bucket}/k", b"one")
    assert fs.cat(f"{bucket}/k") == b"one"
    fs.wait_fetches()
    fs.pipe_file(f"{bucket}/k", b"two")
    assert fs.cat(f"{bucket}/k") == b"two"
    with fs.open(f"{bucket}/k", "wb") as f:
        f.write(b"three")
    assert fs.cat(f"{bucket}/k") == b"three"


def test_text_mode_round_trip(make_fs: Any, bucket: str) -> None:
    fs = make_fs(write_mode="through")
    with fs.open(f"{bucket}/notes.txt", "w") as f:
        f.write("h\u00e9llo\nw\u00f6rld\n")
    with fs.open(f"{bucket}/notes.txt", "r") as f:
        assert f.read() == "h\u00e9llo\nw\u00f6rld\n"


def test_put_copy_remove(make_fs: Any, bucket: str, tmp_path: Path) -> None:
    fs = make_fs(write_mode="through")
    local = tmp_path / "up.bin"
    local.write_bytes(os.urandom(MiB))
    fs.put_file(str(local), f"{bucket}/up.bin")
    fs.cp_file(f"{bucket}/up.bin", f"{bucket}/copy.bin")
    assert fs.cat(f"{bucket}/copy.bin") == local.read_bytes()
    fs.rm(f"{bucket}/copy.bin")
    assert not fs.exists(f"{bucket}/copy.bin")
    assert not fs.is_cached(f"{bucket}/copy.bin")
    fs.pipe({f"{bucket}/d/{i}": b"x" for i in range(5)})
    fs.rm(f"{bucket}/d", recursive=True)
    assert fs.find(f"{bucket}/d") == []


def test_exclusive_create(make_fs: Any, bucket: str) -> None:
    fs = make_fs(write_mode="through")
    fs.pipe_file(f"{bucket}/once", b"1")
    with pytest.raises(FileExistsError):
        fs.open(f"{bucket}/once", "xb")


def test_bucket_create_and_remove(make_fs: Any, s3_client: Any) -> None:
    fs = make_fs(write_mode="through")
    name = "tc-mkdir-" + os.urandom(4).hex()
    fs.mkdir(name)
    assert name in fs.ls("", detail=False)
    with pytest.raises(FileExistsError):
        fs.mkdir(name)
    fs.makedirs(f"{name}/deep/dir", exist_ok=True)
    fs.rmdir(name)
    assert name not in [b["Name"] for b in s3_client.list_buckets()["Buckets"]]
