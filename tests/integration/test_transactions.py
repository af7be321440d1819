"""``with fs.transaction:``: files written inside are committed together at the end of the
block (write-behind or write-through), and none of them if the block raises."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiercache import TierCacheFileSystem

WRITE_MODES = ["behind", "through"]


def _stored(s3_client: Any, bucket: str, key: str) -> bytes | None:
    try:
        return bytes(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3_client.exceptions.NoSuchKey:
        return None


def _staged_files(fs: TierCacheFileSystem) -> list[str]:
    return sorted(os.listdir(fs.tier.staging_dir))


def _write_three(fs: TierCacheFileSystem, bucket: str, source: Path) -> None:
    """One file by ``open``, one by ``pipe_file``, one by ``put_file``."""
    with fs.open(f"{bucket}/t/a", "wb") as f:
        f.write(b"alpha")
    fs.pipe_file(f"{bucket}/t/b", b"beta")
    source.write_bytes(b"gamma")
    fs.put_file(str(source), f"{bucket}/t/c")


@pytest.mark.parametrize("write_mode", WRITE_MODES)
def test_files_of_a_transaction_are_committed_at_its_end(
    make_fs: Callable[..., TierCacheFileSystem],
    s3_client: Any,
    bucket: str,
    tmp_path: Path,
    write_mode: str,
) -> None:
    fs = make_fs(write_mode=write_mode)
    with fs.transaction:
        _write_three(fs, bucket, tmp_path / "c")
        for key in ("t/a", "t/b", "t/c"):
            assert _stored(s3_client, bucket, key) is None, f"{key} reached the store early"
        assert fs.pending() == []
        assert len(_staged_files(fs)) == 3
    fs.flush(timeout=60)
    assert [_stored(s3_client, bucket, f"t/{k}") for k in "abc"] == [b"alpha", b"beta", b"gamma"]
    assert [fs.cat_file(f"{bucket}/t/{k}") for k in "abc"] == [b"alpha", b"beta", b"gamma"]
    assert _staged_files(fs) == []
    assert not fs._intrans


@pytest.mark.parametrize("write_mode", WRITE_MODES)
def test_files_of_a_transaction_that_raises_are_discarded(
    make_fs: Callable[..., TierCacheFileSystem],
    s3_client: Any,
    bucket: str,
    tmp_path: Path,
    write_mode: str,
) -> None:
    fs = make_fs(write_mode=write_mode)
    with pytest.raises(RuntimeError, match="the block failed"), fs.transaction:
        _write_three(fs, bucket, tmp_path / "c")
        raise RuntimeError("the block failed")
    fs.flush(timeout=60)
    assert [_stored(s3_client, bucket, f"t/{k}") for k in "abc"] == [None, None, None]
    assert fs.pending() == []
    assert _staged_files(fs) == []
    assert not any(fs.exists(f"{bucket}/t/{k}") for k in "abc")
    # The filesystem writes at once again after the transaction.
    fs.pipe_file(f"{bucket}/after", b"now")
    fs.flush(timeout=60)
    assert _stored(s3_client, bucket, "after") == b"now"


def test_a_file_whose_own_block_raises_is_not_committed_with_the_others(
    make_fs: Callable[..., TierCacheFileSystem], s3_client: Any, bucket: str
) -> None:
    fs = make_fs(write_mode="through")
    with fs.transaction:
        with fs.open(f"{bucket}/kept", "wb") as f:
            f.write(b"kept")
        with pytest.raises(ValueError, match="half"), fs.open(f"{bucket}/half", "wb") as f:
            f.write(b"half")
            raise ValueError("half written")
    assert _stored(s3_client, bucket, "kept") == b"kept"
    assert _stored(s3_client, bucket, "half") is None
    assert _staged_files(fs) == []
