"""Uploads go with a condition on what the store held (fenced), and degrade where it cannot.

Against the server under test, through the counting proxy: a new key goes with
``If-None-Match: *``, an existing one with ``If-Match`` on its ETag; a store that answers 501
to the headers gets the write again without them, and is remembered as such; the probe that
``tiercache doctor --probe-writes`` runs leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from support.proxy import FaultProxy

from tiercache import TierCacheFileSystem
from tiercache.errors import StoreUnavailableError

pytestmark = pytest.mark.partition


@pytest.fixture
def fs(s3: Any, proxy: FaultProxy, tmp_path: Path) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options={**s3.target_options(), "endpoint_url": proxy.url},
        local_dir=str(tmp_path / "local"),
        retries=1,
        skip_instance_cache=True,
    )


def _puts(proxy: FaultProxy, key: str) -> list[dict[str, str]]:
    return [h for m, t, h in proxy.log if m == "PUT" and t.endswith(f"/{key}")]


def test_an_upload_goes_on_the_condition_of_what_the_store_held(
    fs: TierCacheFileSystem, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    for version in (b"one", b"two"):
        with fs.open(f"{bucket}/ckpt.pt", "wb") as f:
            f.write(version)
        fs.flush(timeout=60)
    assert s3_client.get_object(Bucket=bucket, Key="ckpt.pt")["Body"].read() == b"two"
    metadata = s3_client.head_object(Bucket=bucket, Key="ckpt.pt")["Metadata"]
    assert metadata["tiercache-generation"].isdigit()
    puts = _puts(proxy, "ckpt.pt")
    assert puts[0].get("if-none-match") == "*" and "if-match" not in puts[0]
    if not os.environ.get("TIERCACHE_TEST_S3_ENDPOINT"):
        assert fs.store.conditional_writes(bucket)  # SeaweedFS, the bundled server
    if fs.store.conditional_writes(bucket):
        _, second = puts
        assert second.get("if-match") == f'"{hashlib.md5(b"one").hexdigest()}"'  # one's ETag
    else:
        # A store that answered 412 to a condition that held (Ceph RGW 16 to If-Match on the
        # ETag it holds): that write went again without conditions, and so does every later.
        conditions = [(h.get("if-none-match"), h.get("if-match")) for h in puts]
        assert len(puts) == 3 and conditions[-1] == (None, None), conditions
        assert len(puts) == 3


def test_a_store_that_refuses_the_headers_gets_the_write_without_them(
    fs: TierCacheFileSystem, proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    proxy.fail_next(1, status=501, code="NotImplemented", method="PUT")
    with fs.open(f"{bucket}/a.bin", "wb") as f:
        f.write(b"a")
    fs.flush(timeout=60)
    assert s3_client.get_object(Bucket=bucket, Key="a.bin")["Body"].read() == b"a"
    refused, resent = _puts(proxy, "a.bin")
    assert refused.get("if-none-match") == "*" and "if-none-match" not in resent
    assert fs.store.conditional_writes(bucket) is False  # remembered for the bucket
    with fs.open(f"{bucket}/b.bin", "wb") as f:
        f.write(b"b")
    fs.flush(timeout=60)
    (plain,) = _puts(proxy, "b.bin")
    assert "if-none-match" not in plain and "if-match" not in plain


def test_the_probe_finds_the_servers_answer_and_leaves_nothing(
    fs: TierCacheFileSystem, bucket: str, s3_client: Any
) -> None:
    honoured = fs.store.probe_conditional_writes(bucket, "ckpt/step-1/model.pt")
    if not os.environ.get("TIERCACHE_TEST_S3_ENDPOINT"):
        assert honoured  # SeaweedFS, the bundled server, honours them
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_probe_that_cannot_reach_the_store_concludes_nothing(
    fs: TierCacheFileSystem, proxy: FaultProxy, bucket: str
) -> None:
    # The second request of the probe (a create that must be refused) loses its connection,
    # and the one attempt the filesystem allows is spent: not an answer about the headers.
    proxy.reset_next(1, method="PUT", path_contains=".tiercache-probe-", skip=1)
    with pytest.raises(StoreUnavailableError):
        fs.store.probe_conditional_writes(bucket, "ckpt/step-1/model.pt")
    assert fs.store.conditional_writes(bucket)  # still sent with conditions
    assert fs.store.probe_conditional_writes(bucket, "ckpt/step-1/model.pt") or os.environ.get(
        "TIERCACHE_TEST_S3_ENDPOINT"
    )
