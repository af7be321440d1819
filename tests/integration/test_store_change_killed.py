"""A process killed between changing an object in the store (rm, put) and dropping its cached
copy leaves no copy that a fresh reader is served over the store's change (real server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.servers_under_test import S3Endpoint

from tiercache import TierCacheFileSystem

# The change reaches the store, then the process dies before it records that it did.
_KILLED_AFTER_THE_STORE = """
import os, sys
from tiercache import TierCacheFileSystem
from tiercache.write.state import WriteState
WriteState.store_written = lambda *args, **kwargs: os._exit(9)
fs = TierCacheFileSystem(target_options={options!r}, local_dir={local_dir!r},
    skip_instance_cache=True, **{extra!r})
{change}
"""


def _fs(s3: S3Endpoint, local_dir: str, **extra: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=s3.target_options(),
        local_dir=local_dir,
        skip_instance_cache=True,
        consistency="immutable",  # a cached copy is served without asking the store
        **extra,
    )


def _killed_after_the_store(s3: S3Endpoint, local_dir: str, change: str, **extra: Any) -> None:
    script = _KILLED_AFTER_THE_STORE.format(
        options=s3.target_options(), local_dir=local_dir, extra=extra, change=change
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=120, check=False)
    assert done.returncode == 9


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
def test_a_killed_rm_leaves_no_cached_copy_of_the_deleted_object(
    s3: S3Endpoint, bucket: str, s3_client: Any, tmp_path: Path, shared: bool
) -> None:
    extra = {"shared_dir": str(tmp_path / "shared"), "write_tier": "shared"} if shared else {}
    local_dir = str(tmp_path / "tier")
    path = f"{bucket}/k"
    fs = _fs(s3, local_dir, **extra)
    with fs.open(path, "wb") as f:
        f.write(b"the old version")
    fs.flush(timeout=60)
    assert fs.cat_file(path) == b"the old version"  # cached, clean
    _killed_after_the_store(s3, local_dir, f"fs.rm({path!r})", **extra)
    assert "Contents" not in s3_client.list_objects_v2(Bucket=bucket, Prefix="k")
    fresh = _fs(s3, local_dir, **extra)
    fresh.flush(timeout=60)
    with pytest.raises(FileNotFoundError):
        fresh.cat_file(path)


def test_a_killed_put_leaves_no_cached_copy_of_the_replaced_object(
    s3: S3Endpoint, bucket: str, tmp_path: Path
) -> None:
    local_dir = str(tmp_path / "tier")
    path = f"{bucket}/k"
    fs = _fs(s3, local_dir)
    fs.pipe_file(path, b"the old version")
    assert fs.cat_file(path) == b"the old version"
    source = tmp_path / "new"
    source.write_bytes(b"the new version")
    _killed_after_the_store(s3, local_dir, f"fs.put_file({str(source)!r}, {path!r})")
    assert _fs(s3, local_dir).cat_file(path) == b"the new version"
