"""Awkward S3 keys round-trip through the cache, and the tier's files never leave its root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# Keys this server accepts (SeaweedFS rejects `..` segments and keys over its length limit;
# the tier itself is tested with every such key in tests/unit/test_tier_keys.py).
KEYS = [
    "a",
    "a/b",
    "a/b/c",
    "unicode/\u00e9\u00e8\u2603/\U0001f600.bin",
    "spaces and ?&=%+#",
    "x/" + "y" * 250 + "/z",
    "dotted/.hidden",
    "trailing.dot.",
]


@pytest.mark.parametrize("consistency", ["immutable", "always"])
def test_awkward_keys_round_trip(
    make_fs: Any, s3_client: Any, bucket: str, tmp_path: Path, consistency: str
) -> None:
    for i, key in enumerate(KEYS):
        s3_client.put_object(Bucket=bucket, Key=key, Body=f"{i}:{key}".encode())
    fs = make_fs(consistency=consistency)
    for _ in range(2):  # cold, then from the tier
        for i, key in enumerate(KEYS):
            assert fs.cat_file(f"{bucket}/{key}") == f"{i}:{key}".encode()
        fs.wait_fetches()
    tier_root = os.path.realpath(str(tmp_path / "tier"))
    for dirpath, _, files in os.walk(tier_root):
        assert os.path.realpath(dirpath).startswith(tier_root)
        for name in files:
            assert len(name) < 100 and "/" not in name
    assert all(fs.is_cached(f"{bucket}/{key}") for key in KEYS)
