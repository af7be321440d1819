"""Any S3 key is storable in the tier, and nothing ever lands outside the tier root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiercache import MemoryStore, TierCacheFileSystem

EDGE_KEYS = [
    "a",
    "a/b",
    "a/b/",
    "..",
    "../../etc/passwd",
    "/absolute/looking",
    "a//b",
    "a/./b",
    "x/../../../../../../tmp/escape",
    "\u00e9\u2603\U0001f600",
    "k" * 1000,
    "/".join(["d" * 255] * 3) + "/" + "e" * 300,
    " leading and trailing ",
    "new\nline",
    "back\\slash",
]


def test_every_key_round_trips_and_stays_inside(tmp_path: Path) -> None:
    store = MemoryStore(["bkt"])
    for i, key in enumerate(EDGE_KEYS):
        store.put_bytes("bkt", key, f"{i}".encode() * (i + 1))
    root = tmp_path / "tier"
    fs = TierCacheFileSystem(store=store, local_dir=str(root), skip_instance_cache=True)
    for i, key in enumerate(EDGE_KEYS):
        bucket, parsed = "bkt", key
        opened = fs.read_path.open(bucket, parsed)
        os.close(opened.fd)
        fs.wait_fetches()
        entry = fs.read_path.cached(bucket, parsed)
        assert entry is not None, key
        assert Path(entry.paths.data).read_bytes() == f"{i}".encode() * (i + 1)
    real_root = os.path.realpath(root) + os.sep
    for dirpath, dirnames, files in os.walk(root):
        for name in dirnames + files:
            assert (os.path.realpath(os.path.join(dirpath, name)) + os.sep).startswith(real_root)
            assert len(name) <= 80
    assert not (tmp_path / "etc").exists() and not Path("/tmp/escape").exists()


def test_distinct_keys_get_distinct_entries(tmp_path: Path) -> None:
    store = MemoryStore(["bkt"])
    fs = TierCacheFileSystem(store=store, local_dir=str(tmp_path), skip_instance_cache=True)
    ids = {fs.read_path.entry_id("bkt", key) for key in EDGE_KEYS}
    assert len(ids) == len(EDGE_KEYS)
    assert fs.read_path.entry_id("a", "b/c") != fs.read_path.entry_id("a/b", "c")


def test_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    store = MemoryStore(["bkt"])
    store.put_bytes("bkt", "k", b"real")
    fs = TierCacheFileSystem(store=store, local_dir=str(tmp_path / "t"), skip_instance_cache=True)
    assert fs.cat("bkt/k") == b"real"
    fs.wait_fetches()
    entry = fs.read_path.cached("bkt", "k")
    assert entry is not None
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    os.unlink(entry.paths.data)
    os.symlink(outside, entry.paths.data)
    # The planted link is refused (O_NOFOLLOW) and the object fetched again, not the secret.
    assert fs.cat("bkt/k") == b"real"
    assert outside.read_bytes() == b"secret"


def test_symlinked_shard_directory_is_refused(tmp_path: Path) -> None:
    store = MemoryStore(["bkt"])
    store.put_bytes("bkt", "k", b"data")
    root = tmp_path / "t"
    fs = TierCacheFileSystem(store=store, local_dir=str(root), skip_instance_cache=True)
    entry_id = fs.read_path.entry_id("bkt", "k")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "objects" / entry_id[:2])
    with pytest.raises(PermissionError):
        fs.cat("bkt/k")
    assert list(elsewhere.iterdir()) == []


def test_shard_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    store = MemoryStore(["bkt"])
    store.put_bytes("bkt", "k", b"data")
    root = tmp_path / "t"
    fs = TierCacheFileSystem(store=store, local_dir=str(root), skip_instance_cache=True)
    shard = root / "objects" / fs.read_path.entry_id("bkt", "k")[:2]
    shard.write_bytes(b"not a directory")
    with pytest.raises(PermissionError):
        fs.cat("bkt/k")
    with pytest.raises(PermissionError), fs.open("bkt/k", "wb") as f:
        f.write(b"new")
    assert shard.read_bytes() == b"not a directory"


def test_tier_files_are_private(tmp_path: Path) -> None:
    store = MemoryStore(["bkt"])
    store.put_bytes("bkt", "k", b"data")
    root = tmp_path / "t"
    fs = TierCacheFileSystem(store=store, local_dir=str(root), skip_instance_cache=True)
    fs.cat("bkt/k")
    fs.wait_fetches()
    entry = fs.read_path.cached("bkt", "k")
    assert entry is not None
    walked = [
        os.path.join(dirpath, name)
        for dirpath, dirnames, files in os.walk(root)
        for name in [*dirnames, *files]
    ]
    # The walk found the entry's data file and the directories above it, up to the root.
    data = Path(entry.paths.data)
    assert str(data) in walked
    assert {str(d) for d in data.parents if root in d.parents} <= set(walked)
    not_private = [p for p in walked if os.stat(p).st_mode & 0o077]
    assert not_private == []
    assert os.stat(root).st_mode & 0o077 == 0
