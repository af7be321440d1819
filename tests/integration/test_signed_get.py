"""GETs signed by tiercache itself: served by the server (never a silent fallback), one request
each, awkward keys intact, errors mapped as boto3's are, and connections kept and renewed."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import boto3
import pytest

from tiercache.errors import ObjectChangedError
from tiercache.filesystem import TierCacheFileSystem
from tiercache.store.s3 import S3Store
from tiercache.store.signed_get import SignedGet

pytestmark = pytest.mark.integration

KEYS = [
    "plain",
    "a/b/c",
    "unicode/\u00e9\u00e8\u2603/\U0001f600.bin",
    "spaces and ?&=%+#;,@$!'()*[]",
    "tilde~and-under_score.dot",
    "dotted/.hidden",
    "double//slash",
]


def _store(fs: Any) -> S3Store:
    store = fs.store
    assert isinstance(store, S3Store)
    return store


def _served_signed(store: S3Store, bucket: str) -> bool:
    signed = store._signed_get
    return signed is not None and signed.serves(bucket)


def test_awkward_keys_are_signed_right(make_fs: Any, s3_client: Any, bucket: str) -> None:
    for i, key in enumerate(KEYS):
        s3_client.put_object(Bucket=bucket, Key=key, Body=f"{i}:{key}".encode() * 100)
    fs = make_fs(consistency="immutable")
    store = _store(fs)
    before = store.request_counts().get("GetObject", 0)
    for i, key in enumerate(KEYS):
        assert fs.cat_file(f"{bucket}/{key}") == f"{i}:{key}".encode() * 100
        # Ranged reads of a cold object sign a Range header as well.
        assert fs.cat_file(f"{bucket}/{key}", start=3, end=9) == (f"{i}:{key}".encode() * 100)[3:9]
    fs.wait_fetches()
    # A request this process signed wrongly would be answered 400/403 and asked again
    # through boto3 (and the bucket dropped from the signed path): none was.
    assert _served_signed(store, bucket)
    assert store.request_counts().get("GetObject", 0) - before == len(KEYS)


def test_missing_key_is_not_found_in_one_request(make_fs: Any, bucket: str) -> None:
    fs = make_fs(consistency="always")
    store = _store(fs)
    store.client()  # the signed path is built with the client
    assert _served_signed(store, bucket)
    before = store.request_counts().get("GetObject", 0)
    with pytest.raises(FileNotFoundError):
        store.open_range(bucket, "no/such/key", 0, None)
    assert store.request_counts().get("GetObject", 0) - before == 1
    assert _served_signed(store, bucket)


def test_if_match_mismatch_is_a_changed_object(make_fs: Any, s3_client: Any, bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"x" * 1000)
    fs = make_fs()
    store = _store(fs)
    stream = store.open_range(bucket, "k", 0, 10)
    assert stream.read(10) == b"x" * 10
    stream.close()
    with pytest.raises(ObjectChangedError):
        store.open_range(bucket, "k", 10, 20, if_match='"0123456789abcdef0123456789abcdef"')
    assert _served_signed(store, bucket)


def test_empty_object(make_fs: Any, s3_client: Any, bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="empty", Body=b"")
    fs = make_fs(consistency="always")
    assert fs.cat_file(f"{bucket}/empty") == b""


def test_wrong_secret_is_access_denied(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"data")
    options = s3.target_options()
    secret_name = next(name for name in options if "secret" in name)
    options[secret_name] = "not-the-secret"
    fs = TierCacheFileSystem(
        target_options=options, local_dir=str(tmp_path / "tier"), skip_instance_cache=True
    )
    with pytest.raises(PermissionError) as caught:
        fs.cat_file(f"{bucket}/k")
    assert "not-the-secret" not in str(caught.value)


def test_a_proxy_leaves_gets_to_boto3(monkeypatch: pytest.MonkeyPatch) -> None:
    client = boto3.client(
        "s3",
        endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="a",
        aws_secret_access_key="b",
        region_name="us-east-1",
    )
    assert SignedGet.for_client(client, anonymous=False) is not None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert SignedGet.for_client(client, anonymous=False) is None


def test_gets_reuse_their_connection_and_replace_one_found_closed(
    make_fs: Any, s3_client: Any, bucket: str
) -> None:
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"pool/{i}", Body=f"object {i}".encode() * 50)
    fs = make_fs(consistency="always")
    store = _store(fs)
    store.client()
    signed = store._signed_get
    assert signed is not None and signed.serves(bucket)
    for i in range(2):
        stream = store.open_range(bucket, f"pool/{i}", 0, None)
        assert stream.read(1 << 20) == f"object {i}".encode() * 50
        stream.close()
    origins = list(signed._origins.values())
    assert len(origins) == 1 and origins[0].idle_count() == 1  # one connection, used twice
    # The idle connection ends (as when the server closes it after its keep-alive time):
    # the next GET notices before sending and takes a new connection instead of failing.
    origins[0]._idle[0].sock.shutdown(socket.SHUT_RDWR)
    stream = store.open_range(bucket, "pool/2", 0, None)
    assert stream.read(1 << 20) == b"object 2" * 50
    stream.close()
    assert origins[0].idle_count() == 1
    assert _served_signed(store, bucket)
