"""Shared fixtures: the S3 server under test (SeaweedFS by default, any endpoint by env), buckets.

Set ``TIERCACHE_TEST_S3_ENDPOINT`` (with ``TIERCACHE_TEST_S3_KEY``, ``TIERCACHE_TEST_S3_SECRET``
and optionally ``TIERCACHE_TEST_S3_REGION``) to run the integration tests against another
server (MinIO, Ceph RGW, AWS); otherwise ``scripts/s3server.py`` installs and starts SeaweedFS
on 127.0.0.1 for the session. Tests that freeze, stop or restart their store cannot do that to
the server under test: they use ``own_server`` (a SeaweedFS of their own, whatever the variable
says) and carry the ``own_server`` marker; tests that talk to the server under test carry
``server_under_test`` (``scripts/test-rgw.sh`` runs those).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tiercache
from tiercache import TierCacheFileSystem

ROOT = Path(__file__).resolve().parent.parent
if os.environ.get("TIERCACHE_TEST_INSTALLED") and ROOT in Path(tiercache.__file__).parents:
    # scripts/test-installed.sh runs the tests against the installed wheel, never the checkout.
    raise RuntimeError(f"tiercache was imported from the checkout ({tiercache.__file__})")
# Tests flush explicitly; an upload a test leaves pending must not hold the run at exit.
os.environ.setdefault("TIERCACHE_EXIT_FLUSH_TIMEOUT", "2")

# ``support`` (tests/support) is importable because pytest puts this file's directory on the
# import path; nothing else is added to it.
from support.cephfs_fixtures import cephfs, cephfs_dir, hosts  # noqa: E402, F401
from support.proxy import FaultProxy  # noqa: E402
from support.s3server import s3server  # noqa: E402
from support.servers_under_test import OwnServer, S3Endpoint  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "server_under_test: talks to the S3 server under test; added to every test that takes"
        " the s3 fixture (directly or through bucket, make_fs, proxy...)",
    )
    config.addinivalue_line(
        "markers",
        "own_server: uses a SeaweedFS of its own (to freeze, stop or restart it), not the server"
        " under test; added to every test that takes the own_server fixture",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers from the fixtures a test uses, so that they cannot drift from what it does:
    every test on a real S3 server (the server under test or its own) is ``integration``, and
    ``-m "not integration"`` runs only tests that need no server."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "s3" in fixtures:
            item.add_marker(pytest.mark.server_under_test)
            item.add_marker(pytest.mark.integration)
        if "own_server" in fixtures:
            item.add_marker(pytest.mark.own_server)
            item.add_marker(pytest.mark.integration)


def pytest_report_header() -> str:
    endpoint = os.environ.get("TIERCACHE_TEST_S3_ENDPOINT")
    where = f"{endpoint} (TIERCACHE_TEST_S3_ENDPOINT)" if endpoint else "the bundled SeaweedFS"
    return f"S3 server under test: {where}; own_server tests start a SeaweedFS of their own"


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
        yield server.s3


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


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnServer]:
    """The module's own SeaweedFS (see ``OwnServer``); its tests get the ``own_server`` marker."""
    server = OwnServer(tmp_path_factory.mktemp("own-s3"))
    try:
        yield server
    finally:
        with contextlib.suppress(RuntimeError):  # a test left it frozen; or it is gone already
            server.resume()
        server.stop()


@pytest.fixture
def proxy(s3: S3Endpoint) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's server (it also counts requests)."""
    with FaultProxy(s3.endpoint) as fault_proxy:
        yield fault_proxy
