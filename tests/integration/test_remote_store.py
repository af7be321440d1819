"""The remote-store emulator relays S3 traffic byte-exact and adds the latency, rates and errors
its profile asks for (scripts/remote_store.py, in front of the session's server)."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import botocore.config
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from support.remote_store import PROFILES, RemoteStore, parse_rate, spawn

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
FAST = 4 * 1024 * MiB  # a cap no test reaches: the proxy is inserted, nothing is paced


def client_for(s3: Any, url: str, **config: Any) -> Any:
    config.setdefault("max_pool_connections", 8)
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=s3.key,
        aws_secret_access_key=s3.secret,
        region_name=s3.region,
        config=botocore.config.Config(**config),
    )


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def read(client: Any, bucket: str, key: str) -> bytes:
    data: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return data


def parallel_gets(client: Any, bucket: str, keys: list[str]) -> float:
    """Seconds for one GET of each key, all at once (one connection each)."""

    def get(key: str) -> int:
        return len(client.get_object(Bucket=bucket, Key=key)["Body"].read())

    with ThreadPoolExecutor(len(keys)) as pool:
        start = time.perf_counter()
        sizes = list(pool.map(get, keys))
        return time.perf_counter() - start if all(sizes) else 0.0


def test_loopback_profile_is_not_a_proxy(s3: Any) -> None:
    with RemoteStore(s3.endpoint, "loopback") as rs:
        assert rs.url == s3.endpoint.rstrip("/")
    with spawn(s3.endpoint, "loopback") as spawned:
        assert spawned.url == s3.endpoint.rstrip("/") and spawned.pid is None


def test_profiles_and_rates() -> None:
    assert PROFILES["s3-region"].conn_bps < PROFILES["s3-region"].total_bps
    assert parse_rate("25MiB") == 25 * MiB == parse_rate("26214400")
    with pytest.raises(ValueError, match="error_rate"):
        RemoteStore("http://127.0.0.1:1", error_rate=2.0)


def test_relays_every_operation_byte_exact(s3: Any, bucket: str) -> None:
    data = os.urandom(5 * MiB + 7)
    big = os.urandom(12 * MiB + 17)
    with RemoteStore(s3.endpoint, "loopback", conn_bps=FAST) as rs:
        assert rs.url != s3.endpoint
        client = client_for(s3, rs.url)
        client.put_object(Bucket=bucket, Key="a", Body=data)
        assert client.get_object(Bucket=bucket, Key="a")["Body"].read() == data
        ranged = client.get_object(Bucket=bucket, Key="a", Range="bytes=1000-2000999")
        assert ranged["Body"].read() == data[1000:2001000]
        assert client.head_object(Bucket=bucket, Key="a")["ContentLength"] == len(data)
        tc = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
        client.upload_fileobj(io.BytesIO(big), bucket, "big", Config=tc)
        # A multipart upload went through the proxy: S3 gives such an object the ETag
        # "<digest>-<parts>" (Ceph RGW 16 answers no PartsCount to a HEAD with partNumber).
        etag = client.head_object(Bucket=bucket, Key="big")["ETag"]
        assert etag.strip('"').endswith("-3"), etag
        out = io.BytesIO()
        client.download_fileobj(bucket, "big", out, Config=tc)
        assert out.getvalue() == big
        listed = client.list_objects_v2(Bucket=bucket)["Contents"]
        assert sorted(o["Key"] for o in listed) == ["a", "big"]
        client.delete_object(Bucket=bucket, Key="a")
        assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == ["big"]
        assert rs.bytes_up >= len(data) + len(big)
        assert rs.bytes_down >= len(data) + len(big) + 2_000_000
        assert rs.errors == 0
        assert rs.continues > 0  # boto3's Expect: 100-continue PUTs were relayed


def test_latency_is_added_to_every_request(s3: Any, bucket: str) -> None:
    direct = client_for(s3, s3.endpoint)
    direct.put_object(Bucket=bucket, Key="k", Body=b"x")
    with RemoteStore(s3.endpoint, "loopback", latency_s=0.1) as rs:
        client = client_for(s3, rs.url)
        client.head_object(Bucket=bucket, Key="k")  # connect outside the timer
        for _ in range(3):
            seconds = timed(lambda: read(client, bucket, "k"))
            assert 0.1 <= seconds < 2.1
        assert rs.requests == 4


def test_per_connection_and_aggregate_caps(s3: Any, bucket: str) -> None:
    direct = client_for(s3, s3.endpoint)
    size, keys = 8 * MiB, [f"obj-{i}" for i in range(4)]
    for key in keys:
        direct.put_object(Bucket=bucket, Key=key, Body=os.urandom(size))
    conn_bps = 16 * MiB
    with RemoteStore(s3.endpoint, "loopback", conn_bps=conn_bps, total_bps=FAST) as rs:
        client = client_for(s3, rs.url)
        parallel_gets(client, bucket, keys)  # open the four connections
        one = size / parallel_gets(client, bucket, keys[:1])
        four = 4 * size / parallel_gets(client, bucket, keys)
        body = b"u" * size
        paced_put_s = timed(lambda: client.put_object(Bucket=bucket, Key="p", Body=body))
    # The server's own time to store a PUT (RGW writes it to its OSDs after the last byte)
    # adds to the paced time; it is measured, not guessed, so a busy server is not taken
    # for slow pacing.
    server_put_s = max(
        timed(lambda: direct.put_object(Bucket=bucket, Key="p", Body=body)) for _ in range(2)
    )
    assert 0.85 * conn_bps <= one <= 1.1 * conn_bps
    # Request bodies are paced too: never faster than the cap, and no slower than the cap
    # plus what the server itself takes.
    assert size / (1.1 * conn_bps) <= paced_put_s <= size / (0.85 * conn_bps) + server_put_s
    assert 3.4 <= four / one <= 4.4  # four connections, four times the rate
    total_bps = 32 * MiB  # now the aggregate is the limit
    with RemoteStore(s3.endpoint, "loopback", conn_bps=conn_bps, total_bps=total_bps) as rs:
        client = client_for(s3, rs.url)
        parallel_gets(client, bucket, keys)
        four = 4 * size / parallel_gets(client, bucket, keys)
    assert 0.85 * total_bps <= four <= 1.1 * total_bps


def test_error_rate_one_answers_slowdown_that_boto3_retries(s3: Any, bucket: str) -> None:
    direct = client_for(s3, s3.endpoint)
    direct.put_object(Bucket=bucket, Key="k", Body=b"payload")
    retries = {"total_max_attempts": 2, "mode": "standard"}
    with RemoteStore(s3.endpoint, "loopback", error_rate=1.0) as rs:
        client = client_for(s3, rs.url, retries=retries)
        with pytest.raises(ClientError) as err:
            client.get_object(Bucket=bucket, Key="k")
        assert err.value.response["Error"]["Code"] == "SlowDown"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        with pytest.raises(ClientError, match="SlowDown"):
            client.put_object(Bucket=bucket, Key="k2", Body=os.urandom(2 * MiB))
        assert rs.requests == rs.errors == 4  # two attempts each
    with RemoteStore(s3.endpoint, "loopback", error_rate=0.5, seed=7) as rs:
        client = client_for(s3, rs.url, retries={"total_max_attempts": 10, "mode": "standard"})
        for _ in range(3):
            assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"payload"
        assert rs.errors > 0 and rs.requests == rs.errors + 3


def test_command_runs_the_proxy_in_its_own_process(s3: Any, bucket: str) -> None:
    with spawn(s3.endpoint, "s3-region", latency_s=0.05) as spawned:
        assert spawned.pid is not None and spawned.url.startswith("http://127.0.0.1:")
        client = client_for(s3, spawned.url)
        client.put_object(Bucket=bucket, Key="k", Body=b"through the command")
        seconds = timed(lambda: read(client, bucket, "k"))
        assert seconds >= 0.05
