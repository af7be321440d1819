"""Shared fixtures: the real S3 server (SeaweedFS by default, any endpoint by env) and buckets.

Set ``TIERCACHE_TEST_S3_ENDPOINT`` (with ``TIERCACHE_TEST_S3_KEY``, ``TIERCACHE_TEST_S3_SECRET``
and optionally ``TIERCACHE_TEST_S3_REGION``) to run the integration tests against another
server (MinIO, Ceph RGW, AWS); otherwise ``scripts/s3server.py`` installs and starts SeaweedFS
on 127.0.0.1 for the session.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tiercache import TierCacheFileSystem

ROOT = Path(__file__).resolve().parent.parent
# Tests flush explicitly; an upload a test leaves pending must not hold the run at exit.
os.environ.setdefault("TIERCACHE_EXIT_FLUSH_TIMEOUT", "2")
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "faults"))  # the fault proxy, for every test folder

import s3server  # noqa: E402
from proxy import FaultProxy  # noqa: E402


@dataclass(frozen=True)
class S3Endpoint:
    endpoint: str
    key: str
    secret: str
    region: str

    def target_options(self) -> dict[str, Any]:
        """s3fs-style options, as a user passes them in ``s3={...}``."""
        return {
            "endpoint_url": self.endpoint,
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"region_name": self.region},
        }

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=self.region,
        )


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Endpoint]:
    external = os.environ.get("TIERCACHE_TEST_S3_ENDPOINT")
    if external:
        yield S3Endpoint(
            external,
            os.environ["TIERCACHE_TEST_S3_KEY"],
            os.environ["TIERCACHE_TEST_S3_SECRET"],
            os.environ.get("TIERCACHE_TEST_S3_REGION", "us-east-1"),
        )
        return
    with s3server.start_server() as server:
        yield S3Endpoint(server.endpoint, server.access_key, server.secret_key, server.region)


@pytest.fixture
def s3_client(s3: S3Endpoint) -> Any:
    return s3.client()


@pytest.fixture
def bucket(s3: S3Endpoint, s3_client: Any) -> Iterator[str]:
    """A fresh, uniquely named bucket, emptied and removed after the test."""
    name = f"tc-test-{secrets.token_hex(6)}"
    s3_client.create_bucket(Bucket=name)
    yield name
    paginator = s3_client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=name):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3_client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
    s3_client.delete_bucket(Bucket=name)


@pytest.fixture
def make_fs(s3: S3Endpoint, tmp_path: Path) -> Callable[..., TierCacheFileSystem]:
    """Build a tiercache filesystem on the test server with a private local tier."""

    def build(**options: Any) -> TierCacheFileSystem:
        options.setdefault("local_dir", str(tmp_path / "tier"))
        return TierCacheFileSystem(
            target_options=s3.target_options(), skip_instance_cache=True, **options
        )

    return build


@pytest.fixture
def small_tier(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs mounted for the test (needs root, as CI and development machines have)."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=700", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


@pytest.fixture
def proxy(s3: S3Endpoint) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's server (it also counts requests)."""
    with FaultProxy(s3.endpoint) as fault_proxy:
        yield fault_proxy
