"""The shared tier on a real NFS mount (a loopback export of a local directory), where possible.

It needs a kernel with the NFS client and server, and nfs-kernel-server's tools. Where the
machine lacks any of these the test is skipped and its reason says which; every other
shared-tier test runs on the local filesystem.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tiercache import TierCacheFileSystem

MiB = 1024 * 1024


def _kernel_filesystems() -> set[str]:
    with open("/proc/filesystems", encoding="ascii") as f:
        return {line.split()[-1] for line in f if line.strip()}


def _why_no_nfs() -> str | None:
    if os.geteuid() != 0:
        return "mounting NFS needs root"
    kernel = _kernel_filesystems()
    if not {"nfs", "nfs4"} & kernel:
        return "this kernel has no NFS client (no nfs or nfs4 in /proc/filesystems)"
    if "nfsd" not in kernel:
        return "this kernel has no NFS server (no nfsd in /proc/filesystems)"
    for tool in ("exportfs", "rpc.nfsd", "mount.nfs"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (Debian package nfs-kernel-server)"
    return None


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def nfs_dir(tmp_path: Path) -> Iterator[Path]:
    reason = _why_no_nfs()
    if reason is not None:
        pytest.skip(f"shared tier on NFS not tested here: {reason}")
    export, mount = tmp_path / "export", tmp_path / "mnt"
    export.mkdir()
    mount.mkdir()
    try:
        _run("rpc.nfsd", "8")
        _run("exportfs", "-o", "rw,sync,no_root_squash,insecure", f"127.0.0.1:{export}")
        _run("mount", "-t", "nfs", "-o", "vers=4.2", f"127.0.0.1:{export}", str(mount))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        stderr = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"shared tier on NFS not tested here: NFS set-up failed: {stderr!r}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=60)
        subprocess.run(["exportfs", "-u", f"127.0.0.1:{export}"], check=False, timeout=60)


def test_two_hosts_share_objects_through_nfs(
    nfs_dir: Path, s3: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    data = {f"k{i}": os.urandom(MiB) for i in range(4)}
    for key, blob in data.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=blob)

    def host(name: str) -> TierCacheFileSystem:
        return TierCacheFileSystem(
            target_options=s3.target_options(),
            local_dir=str(tmp_path / f"local-{name}"),
            shared_dir=str(nfs_dir / "tier"),
            host_id=name,
            consistency="immutable",
            skip_instance_cache=True,
        )

    first, second = host("a"), host("b")
    for key, blob in data.items():
        assert first.cat_file(f"{bucket}/{key}") == blob
    first.wait_fetches()
    for key, blob in data.items():
        assert second.cat_file(f"{bucket}/{key}") == blob
    assert first.stats()["fetches"] == len(data)
    assert second.stats()["fetches"] == 0
    assert second.stats()["promotions"] == len(data)
