"""A mounted bucket used from the shell and from Python: reads, writes, uploads, unmount."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, mount_entry, requires_fuse

from tiercache.mount import active_mounts

pytestmark = [pytest.mark.integration, requires_fuse]

MiB = 1024 * 1024


def sh(*argv: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(argv), capture_output=True, timeout=60, check=True, **kwargs)


def stored(s3_client: Any, bucket: str, key: str) -> bytes:
    return bytes(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_read_with_shell_tools_then_unmount(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path], tmp_path: Path
) -> None:
    small = b"hello through the mount\n"
    big = os.urandom(12 * MiB + 123)
    s3_client.put_object(Bucket=bucket, Key="data/hello.txt", Body=small)
    s3_client.put_object(Bucket=bucket, Key="data/shards/shard-0.bin", Body=big)
    s3_client.put_object(Bucket=bucket, Key="data/shards/deep/x.txt", Body=b"x")
    s3_client.put_object(Bucket=bucket, Key="other/not-shown.txt", Body=b"no")

    mnt = mount(
        f"s3://{bucket}/data",
        "--read-only",
        "--consistency",
        "immutable",
        "--local-max-bytes",
        "500MiB",
    )

    listing = sh("ls", "-R", str(mnt)).stdout.decode()
    for name in ("hello.txt", "shards", "shard-0.bin", "deep", "x.txt"):
        assert name in listing
    assert "not-shown" not in listing
    assert sh("cat", str(mnt / "hello.txt")).stdout == small
    sh("cp", str(mnt / "shards/shard-0.bin"), str(tmp_path / "copy.bin"))
    assert (tmp_path / "copy.bin").read_bytes() == big
    dd = sh("dd", f"if={mnt / 'shards/shard-0.bin'}", "bs=1M", "status=none").stdout
    assert dd == big
    digest = sh("sha256sum", str(mnt / "shards/shard-0.bin")).stdout.split()[0].decode()
    assert digest == hashlib.sha256(big).hexdigest()
    with open(mnt / "shards/shard-0.bin", "rb") as f:
        f.seek(5 * MiB)
        assert f.read(MiB) == big[5 * MiB : 6 * MiB]
    assert os.stat(mnt / "shards/shard-0.bin").st_size == len(big)
    assert (mnt / "shards").is_dir()

    ours = mount_entry(cli.json("status"), mnt)  # other tiercache mounts are listed too
    assert ours is not None and ours["url"] == f"s3://{bucket}/data"
    assert ours["read_only"] is True

    done = cli("unmount", str(mnt))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"unmounted {mnt}"
    assert str(mnt) not in {m.mountpoint for m in active_mounts()}
    assert os.listdir(mnt) == []


def test_writes_reach_the_store_after_flush(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path], tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="out/replaced.bin", Body=b"old contents, longer")
    mnt = mount(f"s3://{bucket}/out")
    source = tmp_path / "source.bin"
    copied = os.urandom(9 * MiB + 7)
    source.write_bytes(copied)

    sh("cp", str(source), str(mnt / "copied.bin"))
    sh("dd", f"if={source}", f"of={mnt / 'dd.bin'}", "bs=1M", "status=none")
    sh("sh", "-c", f"echo new > {mnt / 'replaced.bin'}")  # truncate-on-open of an object
    (mnt / "ckpt").mkdir()
    python_bytes = os.urandom(3 * MiB)
    with open(mnt / "ckpt/model.pt", "wb") as f:
        for i in range(0, len(python_bytes), 100_000):
            f.write(python_bytes[i : i + 100_000])
    with open(mnt / "ckpt/patched.bin", "wb") as f:  # a writer that seeks back
        f.write(b"\0" * 8 + b"payload")
        f.seek(0)
        f.write(b"HEADER!!")

    # Read-your-writes through the mount, before any upload.
    assert sh("sha256sum", str(mnt / "copied.bin")).stdout.split()[0].decode() == (
        hashlib.sha256(copied).hexdigest()
    )
    assert (mnt / "replaced.bin").read_bytes() == b"new\n"
    assert sorted(os.listdir(mnt)) == ["ckpt", "copied.bin", "dd.bin", "replaced.bin"]

    done = cli("flush", "--timeout", "120")
    assert done.returncode == 0, done.stderr
    assert stored(s3_client, bucket, "out/copied.bin") == copied
    assert stored(s3_client, bucket, "out/dd.bin") == copied
    assert stored(s3_client, bucket, "out/replaced.bin") == b"new\n"
    assert stored(s3_client, bucket, "out/ckpt/model.pt") == python_bytes
    assert stored(s3_client, bucket, "out/ckpt/patched.bin") == b"HEADER!!payload"

    sh("mv", str(mnt / "copied.bin"), str(mnt / "renamed.bin"))
    assert stored(s3_client, bucket, "out/renamed.bin") == copied
    assert sorted(os.listdir(mnt)) == ["ckpt", "dd.bin", "renamed.bin", "replaced.bin"]
    sh("rm", str(mnt / "dd.bin"))
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="out/dd.bin").get("Contents", [])
    assert listed == []
    assert not (mnt / "dd.bin").exists()


def test_opening_a_file_prefetches_the_next_ones_of_its_directory(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path], s3: Any
) -> None:
    import time

    from tiercache import TierCacheFileSystem

    shards = {f"train/shard-{i}.bin": os.urandom(MiB) for i in range(7)}
    for key, body in shards.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    mnt = mount(f"s3://{bucket}/train", "--read-only", "--consistency", "immutable")
    assert sh("cat", str(mnt / "shard-0.bin")).stdout == shards["train/shard-0.bin"]
    view = TierCacheFileSystem(
        target_options=s3.target_options(), local_dir=cli.local_dir, skip_instance_cache=True
    )
    ahead = [f"{bucket}/train/shard-{i}.bin" for i in range(1, 5)]  # readahead: 4 (default)
    deadline = time.monotonic() + 30
    while not all(view.is_cached(path) for path in ahead):
        assert time.monotonic() < deadline, [view.is_cached(p) for p in ahead]
        time.sleep(0.05)
    assert not view.is_cached(f"{bucket}/train/shard-6.bin")  # beyond the window of 4
    for i in range(1, 5):  # read through the mount: the prefetched bytes
        assert (mnt / f"shard-{i}.bin").read_bytes() == shards[f"train/shard-{i}.bin"]
