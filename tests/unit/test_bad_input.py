"""Bad input anywhere gets an error that names the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import pytest

from tiercache import ConfigError, MemoryStore, TierCacheFileSystem


def _fs(tmp_path: Path, **options: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=MemoryStore(["b"]), local_dir=str(tmp_path), skip_instance_cache=True, **options
    )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"write_mode": "sideways"}, "write_mode"),
        ({"verify": "sometimes"}, "verify"),
        ({"upload_workers": 0}, "upload_workers"),
        ({"upload_deadline": -1}, "upload_deadline"),
        ({"dirty_max_bytes": "-5"}, "dirty_max_bytes"),
        ({"commit_marker": "a/b"}, "commit_marker"),
        ({"keep_checkpoints": -1}, "keep_checkpoints"),
        ({"ttl": float("nan")}, "ttl"),
        ({"retries": True}, "retries"),
        ({"file_mode": "rwx"}, "file_mode"),
    ],
)
def test_bad_option_values(tmp_path: Path, options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        _fs(tmp_path, **options)


def test_empty_local_dir_is_refused() -> None:
    with pytest.raises(ConfigError, match="local_dir"):
        TierCacheFileSystem(store=MemoryStore(["b"]), local_dir="", skip_instance_cache=True)


@pytest.mark.parametrize("path", ["", "/", "s3://", "tiercache://", "b/with\x00nul"])
def test_malformed_paths(tmp_path: Path, path: str) -> None:
    fs = _fs(tmp_path)
    with pytest.raises((ValueError, IsADirectoryError)):
        fs.open(path, "rb")


def test_malformed_urls(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="target_protocol"):
        fsspec.open("tiercache::memory://bucket/key", tiercache={"local_dir": str(tmp_path)}).open()
    with pytest.raises(ValueError, match="endpoint_url"):
        fsspec.open(
            "tiercache::s3://bucket/key",
            s3={"endpoint_url": "not a url"},
            tiercache={"local_dir": str(tmp_path)},
        ).open()


def test_wrong_modes_and_missing_objects(tmp_path: Path) -> None:
    fs = _fs(tmp_path)
    for mode in ("ab", "r+b", "rb+", "a"):
        with pytest.raises(ValueError, match="mode"):
            fs.open("b/k", mode)
    with pytest.raises(FileNotFoundError):
        fs.open("b/missing", "rb")
    with pytest.raises(FileNotFoundError):
        fs.open("no-such-bucket/k", "rb")
