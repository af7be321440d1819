"""Against the real server: cached bytes damaged on disk are never served, in any consistency
mode (the digest check of ``verify="first"``, and the size check of every revalidation)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.tier_damage import flip_byte, forget_checks

from tiercache import CacheCorruptError, TierCacheFileSystem

KiB = 1024
MiB = 1024 * KiB


def _cache(fs: TierCacheFileSystem, s3_client: Any, bucket: str, payload: bytes) -> str:
    s3_client.put_object(Bucket=bucket, Key="k", Body=payload)
    assert fs.cat(f"{bucket}/k") == payload
    fs.wait_fetches()
    entry = fs.read_path.cached(bucket, "k")
    assert entry is not None
    return entry.paths.data


def _read_or_error(fs: TierCacheFileSystem, path: str) -> bytes | None:
    """Every byte, read sequentially; None if the read ended in ``CacheCorruptError``."""
    out = bytearray()
    try:
        with fs.open(path, "rb") as f:
            while chunk := f.read(256 * KiB):
                out += chunk
    except CacheCorruptError as exc:
        assert exc.errno == 5 and path in str(exc)
        return None
    return bytes(out)


@pytest.mark.parametrize("size", [64 * KiB, 3 * MiB])
@pytest.mark.parametrize("mode", ["immutable", "ttl", "always"])
def test_a_flipped_byte_is_never_served(
    make_fs: Any, s3_client: Any, bucket: str, mode: str, size: int
) -> None:
    payload = os.urandom(size)
    fs = make_fs(consistency=mode, ttl=0.0)  # ttl 0: a HEAD at every open, as after the ttl
    flip_byte(_cache(fs, s3_client, bucket, payload), size // 2)
    forget_checks(fs)
    got = _read_or_error(fs, f"{bucket}/k")
    assert got == payload  # up to 64 MiB: checked whole at open, refetched before a read
    assert fs.cat(f"{bucket}/k") == payload
    stats = fs.stats()
    assert stats["verify_failures"] == 1 and stats["store_requests"]["GetObject"] == 2


@pytest.mark.parametrize(
    "mode, verify",
    [
        ("immutable", "first"),
        ("ttl", "first"),
        ("always", "first"),
        ("ttl", "reboot"),
        ("always", "reboot"),
    ],
)
def test_a_truncated_file_with_its_size_edited_is_never_served_short(
    make_fs: Any, s3_client: Any, bucket: str, mode: str, verify: str
) -> None:
    payload = os.urandom(256 * KiB)
    fs = make_fs(consistency=mode, ttl=0.0, **({} if verify == "first" else {"verify": verify}))
    data_path = _cache(fs, s3_client, bucket, payload)
    entry = fs.read_path.cached(bucket, "k")
    assert entry is not None
    os.truncate(data_path, 100 * KiB)
    fs.tier.replace_meta(entry, dataclasses.replace(entry.meta, size=100 * KiB))
    forget_checks(fs)
    assert fs.cat(f"{bucket}/k") == payload
    stats = fs.stats()
    if mode == "immutable":  # no HEAD: the digest tells
        assert stats["verify_failures"] == 1
    else:  # the HEAD's Content-Length differs from the entry's size
        assert stats["invalidations"] == 1 and stats["verify_failures"] == 0


_READER = """
import json, sys
from tiercache import CacheCorruptError, TierCacheFileSystem
args = json.loads(sys.argv[1])
fs = TierCacheFileSystem(skip_instance_cache=True, **args["options"])
out = bytearray()
try:
    with fs.open(args["path"], "rb") as f:
        while chunk := f.read(1 << 20):
            out += chunk
except CacheCorruptError as exc:
    print(json.dumps({"error": exc.errno}))
else:
    print(json.dumps({"size": len(out), "hex": bytes(out[-64:]).hex()}))
"""


def test_another_process_checks_an_entry_this_one_fetched(
    make_fs: Any, s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    payload = os.urandom(3 * MiB)
    fs = make_fs(consistency="immutable")
    flip_byte(_cache(fs, s3_client, bucket, payload), len(payload) - 10)
    options = {
        "local_dir": str(tmp_path / "tier"),
        "consistency": "immutable",
        "target_options": s3.target_options(),
    }
    args = json.dumps({"options": options, "path": f"{bucket}/k"})
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _READER, args], capture_output=True, check=True, text=True
            ).stdout
        )
        for _ in range(2)
    ]
    # The first reader is handed the bad tail never: right bytes (refetched) or EIO.
    first, second = runs
    assert first.get("error") == 5 or first["hex"] == payload[-64:].hex()
    assert second["size"] == len(payload) and second["hex"] == payload[-64:].hex()


@pytest.mark.parametrize("offset", [0, 1000, 64 * KiB - 1])
def test_a_first_read_of_an_object_up_to_64_mib_never_gets_a_flipped_byte(
    make_fs: Any, s3_client: Any, bucket: str, offset: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked whole at its first open in a process: the first read is already the store's
    bytes (a larger object's first bytes may go before its verdict: see ``verify``)."""
    payload = os.urandom(5 * MiB)
    fs = make_fs(consistency="immutable")
    flip_byte(_cache(fs, s3_client, bucket, payload), offset)
    forget_checks(fs)  # as in a new process,
    # whose hashing workers are still starting: none gets ahead of the first read.
    monkeypatch.setattr(fs.read_path.verifier, "start", lambda check: None)
    with fs.open(f"{bucket}/k", "rb") as f:
        assert f.read(64 * KiB) == payload[: 64 * KiB]
    stats = fs.stats()
    assert stats["verify_failures"] == 1 and stats["store_requests"]["GetObject"] == 2
