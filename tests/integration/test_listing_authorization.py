"""Listings kept in a group-shared tier are served only to users the store lets list them.

User A lists a bucket through a shared tier (``shared_file_mode=0o660``); user B, on another
host with the same ``shared_dir``, has credentials of its own (the bundled server's second
identity, which may read and list only ``tc-reader-*`` buckets). B's ``ls``, ``find``,
``exists`` and ``info`` of A's bucket are refused as the store refuses them, with none of A's
names; of a bucket B may list, they are served from A's listing for one request of B's own.
The same holds for a write of A's still waiting for its upload in the shared journal
(``write_tier="shared"``): its bytes, size and name.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.s3server import S3Endpoint, s3server

from tiercache import TierCacheFileSystem
from tiercache.errors import AccessDeniedError, CacheTimeoutError, StoreUnavailableError
from tiercache.store.s3 import S3Store
from tiercache.store.s3_options import S3Options

pytestmark = pytest.mark.partition

KEYS = ("data/a-7f3e.bin", "data/b-91c2.bin", "data/sub/c-05d4.bin")
NAMES = ("a-7f3e", "b-91c2", "c-05d4")  # none may reach a user the store refuses


@pytest.fixture
def reader(s3: S3Endpoint) -> S3Endpoint:
    """User B: the server's identity that may read and list only ``tc-reader-*`` buckets."""
    if os.environ.get("TIERCACHE_TEST_S3_ENDPOINT"):
        pytest.skip("needs the bundled server's second identity (scripts/s3server.py)")
    return S3Endpoint(s3.endpoint, s3server.READER_KEY, s3server.READER_SECRET, s3.region)


@pytest.fixture
def reader_bucket(s3_client: Any) -> Iterator[str]:
    """A bucket user B may list and read (made and filled by user A)."""
    name = f"{s3server.READER_BUCKETS}{secrets.token_hex(6)}"
    s3_client.create_bucket(Bucket=name)
    yield name
    for key in KEYS:
        s3_client.delete_object(Bucket=name, Key=key)
    s3_client.delete_bucket(Bucket=name)


def _user_fs(user: S3Endpoint, root: Path, host: int, **extra: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=user.target_options(),
        local_dir=str(root / f"host{host}-local"),
        shared_dir=str(root / "shared"),
        host_id=f"host{host}",
        shared_file_mode=0o660,
        consistency="ttl",
        ttl=600.0,
        skip_instance_cache=True,
        **extra,
    )


def _listed_by_a(s3: S3Endpoint, s3_client: Any, bucket: str, root: Path) -> None:
    for key in KEYS:
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x" * 100)
    owner = _user_fs(s3, root, 0)
    assert owner.config.shared_auth_mode == "store"
    assert len(owner.ls(f"{bucket}/data")) == 3  # two files, one directory
    assert len(owner.find(f"{bucket}/data")) == 3
    assert len(owner.find(bucket)) == 3
    assert owner.ls(bucket, detail=False) == [f"{bucket}/data"]


def _kept_names(root: Path) -> list[str]:
    """Names of A's objects in any file under ``root``."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            body = (Path(folder) / name).read_bytes()
            found += [f"{name}: {n}" for n in NAMES if n.encode() in body]
    return found


ASKS: dict[str, Callable[[TierCacheFileSystem, str], object]] = {
    "ls": lambda fs, b: fs.ls(f"{b}/data"),
    "ls bucket": lambda fs, b: fs.ls(b, detail=False),
    "find": lambda fs, b: fs.find(f"{b}/data", detail=True),
    "find bucket": lambda fs, b: fs.find(b),
    "exists": lambda fs, b: fs.exists(f"{b}/data/a-7f3e.bin"),
    "info": lambda fs, b: fs.info(f"{b}/data/a-7f3e.bin"),
    "info directory": lambda fs, b: fs.info(f"{b}/data/sub"),
}


def test_a_user_the_store_refuses_gets_none_of_the_listing_another_user_shared(
    s3: S3Endpoint, s3_client: Any, bucket: str, reader: S3Endpoint, tmp_path: Path
) -> None:
    _listed_by_a(s3, s3_client, bucket, tmp_path)
    assert _kept_names(tmp_path / "shared")  # A's listings are in the shared tier
    # Each question from a new process of B's (nothing it asked before helps), then all of
    # them in one process, in the order the issue gave: ls, find, exists, info.
    for host, (what, ask) in enumerate(ASKS.items(), start=1):
        fs = _user_fs(reader, tmp_path, host)
        with pytest.raises(PermissionError) as refused:
            got = ask(fs, bucket)
            pytest.fail(f"{what} was served to user B: {got!r}")
        assert isinstance(refused.value, AccessDeniedError), what
    together = _user_fs(reader, tmp_path, len(ASKS) + 1)
    for what, ask in ASKS.items():
        with pytest.raises(PermissionError):
            got = ask(together, bucket)
            pytest.fail(f"{what} was served to user B after its other questions: {got!r}")
    for host in range(1, len(ASKS) + 2):  # nor kept where a later question would find it
        assert _kept_names(tmp_path / f"host{host}-local") == []
    # The documented cost of shared_auth="trust": anyone who can read the directory.
    trusting = _user_fs(reader, tmp_path, len(ASKS) + 2, shared_auth="trust")
    assert trusting.ls(f"{bucket}/data", detail=False) == [
        f"{bucket}/data/a-7f3e.bin",
        f"{bucket}/data/b-91c2.bin",
        f"{bucket}/data/sub",
    ]


def test_a_user_the_store_lets_list_is_served_the_shared_listing_for_one_request(
    s3: S3Endpoint, s3_client: Any, reader_bucket: str, reader: S3Endpoint, tmp_path: Path
) -> None:
    bucket = reader_bucket
    _listed_by_a(s3, s3_client, bucket, tmp_path)
    expected = _user_fs(s3, tmp_path, 0).ls(f"{bucket}/data")
    fs = _user_fs(reader, tmp_path, 1)
    assert fs.ls(f"{bucket}/data") == expected
    # Served from A's listing after one request of B's own: the first page of a LIST of the
    # prefix, which answers for ls and find of it for the ttl (and info and exists of the
    # keys it lists, kept in B's local tier).
    assert fs.store.request_counts() == {"ListObjectsV2": 1}
    assert fs.find(f"{bucket}/data") == [f"{bucket}/{k}" for k in sorted(KEYS)]
    assert fs.exists(f"{bucket}/data/a-7f3e.bin")
    assert fs.info(f"{bucket}/data/b-91c2.bin")["size"] == 100
    assert fs.ls(f"{bucket}/data", detail=False) == [r["name"] for r in expected]
    assert fs.store.request_counts() == {"ListObjectsV2": 1}
    # Another prefix is another request: what B may list is asked prefix by prefix.
    assert fs.find(bucket) == [f"{bucket}/{k}" for k in sorted(KEYS)]
    assert fs.store.request_counts() == {"ListObjectsV2": 2}


PENDING = "data/new-5e1a.bin"  # written by A, its upload refused: pending in the shared tier


class HeldUploads(S3Store):
    """User A's store: its uploads wait, then fail (the write stays pending, and never lands
    in a bucket the test removes after)."""

    def __init__(self, options: S3Options, released: threading.Event) -> None:
        super().__init__(options)
        self._released = released
        self.uploading = threading.Event()  # A's uploader holds the upload's claim

    def upload_file(self, *args: Any, **kwargs: Any) -> Any:
        self.uploading.set()
        self._released.wait(120)
        raise StoreUnavailableError("held by the test")


@pytest.fixture
def released() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _pending_write_of_a(
    s3: S3Endpoint, bucket: str, root: Path, released: threading.Event
) -> bytes:
    options = S3Options(endpoint_url=s3.endpoint, key=s3.key, secret=s3.secret, region=s3.region)
    store = HeldUploads(options, released)
    owner = TierCacheFileSystem(
        store=store,
        local_dir=str(root / "host0-local"),
        shared_dir=str(root / "shared"),
        host_id="host0",
        shared_file_mode=0o660,
        write_tier="shared",
        skip_instance_cache=True,
    )
    body = b"new-5e1a" * 64
    with owner.open(f"{bucket}/{PENDING}", "wb") as f:
        f.write(body)
    assert [row["name"] for row in owner.pending()] == [f"{bucket}/{PENDING}"]
    assert store.uploading.wait(30)  # so no other host's uploader takes it
    return body


PENDING_ASKS: dict[str, Callable[[TierCacheFileSystem, str], object]] = {
    "cat": lambda fs, b: fs.cat_file(f"{b}/{PENDING}"),
    "open": lambda fs, b: fs.open(f"{b}/{PENDING}", "rb").read(),
    "info": lambda fs, b: fs.info(f"{b}/{PENDING}"),
    "exists": lambda fs, b: fs.exists(f"{b}/{PENDING}"),
    "ls": lambda fs, b: fs.ls(f"{b}/data"),
    "find": lambda fs, b: fs.find(b),
}


def test_a_user_the_store_refuses_gets_nothing_of_another_users_pending_write(
    s3: S3Endpoint,
    bucket: str,
    reader: S3Endpoint,
    tmp_path: Path,
    released: threading.Event,
) -> None:
    _pending_write_of_a(s3, bucket, tmp_path, released)
    for host, (what, ask) in enumerate(PENDING_ASKS.items(), start=1):
        fs = _user_fs(reader, tmp_path, host, write_tier="shared")
        with pytest.raises(PermissionError):
            got = ask(fs, bucket)
            pytest.fail(f"{what} of A's pending write was served to user B: {got!r}")


def test_a_user_the_store_lets_read_gets_another_users_pending_write(
    s3: S3Endpoint,
    reader_bucket: str,
    reader: S3Endpoint,
    tmp_path: Path,
    released: threading.Event,
) -> None:
    bucket = reader_bucket
    body = _pending_write_of_a(s3, bucket, tmp_path, released)
    fs = _user_fs(reader, tmp_path, 1, write_tier="shared")
    assert fs.cat_file(f"{bucket}/{PENDING}") == body  # the store answered B's HEAD: 404
    assert fs.info(f"{bucket}/{PENDING}")["size"] == len(body)
    assert fs.store.request_counts() == {"HeadObject": 1}  # once per ttl per object
    assert fs.ls(f"{bucket}/data", detail=False) == [f"{bucket}/{PENDING}"]


def test_another_users_pending_write_is_left_to_that_user(
    s3: S3Endpoint,
    reader_bucket: str,
    reader: S3Endpoint,
    tmp_path: Path,
    released: threading.Event,
) -> None:
    # A's write waits in the shared journal, its record owned by another uid than this
    # process's (chown: what a write by another OS user leaves). B's uploader, with B's
    # credentials (no write to the bucket), must neither upload it nor record it as failed.
    bucket = reader_bucket
    _pending_write_of_a(s3, bucket, tmp_path, released)
    record = next((tmp_path / "shared" / "journal").glob("*.json"))
    os.chown(record, 65534, -1)
    released.set()  # A's held upload fails; its uploader leaves the record alone now
    fs = _user_fs(reader, tmp_path, 1, write_tier="shared")
    with pytest.raises(CacheTimeoutError):
        fs.flush(timeout=3)
    assert "PutObject" not in fs.store.request_counts()
    assert [row["state"] for row in fs.pending()] == ["dirty"]  # left to its own user
