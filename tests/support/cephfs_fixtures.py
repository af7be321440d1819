"""Fixtures of the CephFS cluster (two ceph-fuse clients as two hosts), started once per test
session by the first test that asks for it (``tests/conftest.py`` registers them)."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cephfs_hosts import CephFS, Hosts, session_lock, why_not_here
from support.proxy import FaultProxy


@pytest.fixture(scope="session")
def cephfs() -> Iterator[CephFS]:
    reason = why_not_here()
    if reason is not None:
        pytest.skip(f"shared tier on CephFS not tested here: {reason}")
    base = Path(os.environ.get("TIERCACHE_TEST_CEPHFS_DIR", "/tmp/tiercache-cephfs"))
    with session_lock(timeout=600) as held:
        if not held:
            pytest.skip("shared tier on CephFS not tested: another test session kept its cluster")
        cluster = CephFS(base)
        cluster.start()  # a failure to start here is a failure, not a skip
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def cephfs_dir(cephfs: CephFS) -> Iterator[str]:
    """A fresh directory name on the CephFS, the same on both hosts' mounts."""
    name = f"t-{secrets.token_hex(4)}"
    yield name
    for host in ("hostA", "hostB"):  # through a live mount (a test may have crashed one)
        path = cephfs.mount(host) / name
        try:
            shutil.rmtree(path)
            break
        except FileNotFoundError:
            break
        except OSError:
            continue


@pytest.fixture
def hosts(
    cephfs: CephFS, cephfs_dir: str, tmp_path: Path, s3: Any, proxy: FaultProxy
) -> Iterator[Hosts]:
    """Hosts whose store requests all go through the counting proxy."""
    group = Hosts(cephfs, cephfs_dir, tmp_path, {**s3.target_options(), "endpoint_url": proxy.url})
    try:
        yield group
    finally:
        group.close()
