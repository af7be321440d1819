"""Write-behind while the store is frozen, killed and restarted: nothing is lost.

Every test here freezes (SIGSTOP), stops or restarts its store, which a test can only do to a
server it owns: they run on ``own_server``, a SeaweedFS of this module's own, whatever the
server under test is. What they check is tiercache's side: uploads held back, resumed, retried.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import xxhash

from tiercache import TierCacheFileSystem

if TYPE_CHECKING:  # the fixture's class; imported for annotations only
    from support.servers_under_test import OwnServer


MiB = 1024 * 1024


@pytest.fixture
def pbucket(own_server: OwnServer) -> str:
    name = f"tc-wb-{secrets.token_hex(5)}"
    own_server.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def wb_fs(own_server: OwnServer, tmp_path: Path) -> Callable[..., TierCacheFileSystem]:
    def build(**options: Any) -> TierCacheFileSystem:
        options.setdefault("local_dir", str(tmp_path / "tier"))
        return TierCacheFileSystem(
            target_options=own_server.endpoint.target_options(),
            skip_instance_cache=True,
            retries=2,
            connect_timeout=1,
            read_timeout=2,
            **options,
        )

    return build


def _stored(own_server: OwnServer, bucket: str, key: str) -> bytes | None:
    try:
        return bytes(own_server.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    except own_server.client().exceptions.NoSuchKey:
        return None


def test_close_returns_while_the_store_is_frozen(
    own_server: OwnServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs()
    data = os.urandom(6 * MiB)
    own_server.pause()
    try:
        with fs.open(f"{pbucket}/ckpt/rank0.pt", "wb") as f:
            f.write(data)
        # Read-your-writes from the tier while the store cannot answer at all.
        assert fs.cat_file(f"{pbucket}/ckpt/rank0.pt") == data
        assert fs.info(f"{pbucket}/ckpt/rank0.pt")["size"] == len(data)
        assert [p["name"] for p in fs.pending()] == [f"{pbucket}/ckpt/rank0.pt"]
        assert fs.evict(0).kept_busy >= 1 and fs.is_cached(f"{pbucket}/ckpt/rank0.pt")
    finally:
        own_server.resume()
    fs.flush(timeout=120)
    assert _stored(own_server, pbucket, "ckpt/rank0.pt") == data
    head = own_server.client().head_object(Bucket=pbucket, Key="ckpt/rank0.pt")
    assert head["Metadata"]["tiercache-xxh3"] == xxhash.xxh3_64(data).hexdigest()
    entry = fs.read_path.cached(pbucket, "ckpt/rank0.pt")
    assert entry is not None and entry.meta.state == "clean" and entry.meta.etag == head["ETag"]
    assert fs.pending() == []


def _child_fs(options: dict[str, Any], local_dir: str) -> TierCacheFileSystem:
    """The filesystem a spawned process builds: short timeouts, the test's cache."""
    return TierCacheFileSystem(
        target_options=options,
        local_dir=local_dir,
        retries=2,
        connect_timeout=1,
        read_timeout=2,
        skip_instance_cache=True,
    )


def _write_then_wait(
    options: dict[str, Any], local_dir: str, path: str, data: bytes, closed: Any
) -> None:
    fs = _child_fs(options, local_dir)
    with fs.open(path, "wb") as f:
        f.write(data)
    closed.set()
    time.sleep(600)  # killed before it can upload


def _kill_writer_after_close(own_server: OwnServer, local_dir: str, path: str, data: bytes) -> None:
    """A separate process writes ``path``; once its close() returned it gets SIGKILL.

    The server is frozen meanwhile, so no upload can have finished before the kill.
    """
    ctx = multiprocessing.get_context("spawn")
    closed = ctx.Event()
    own_server.pause()
    try:
        writer = ctx.Process(
            target=_write_then_wait,
            args=(own_server.endpoint.target_options(), local_dir, path, data, closed),
        )
        writer.start()
        assert closed.wait(60)
        os.kill(writer.pid or 0, signal.SIGKILL)
        writer.join(30)
        assert writer.exitcode == -signal.SIGKILL
    finally:
        own_server.resume()


def test_sigkill_after_close_loses_nothing(
    own_server: OwnServer, pbucket: str, tmp_path: Path
) -> None:
    data = os.urandom(9 * MiB)
    local_dir = str(tmp_path / "tier")
    _kill_writer_after_close(own_server, local_dir, f"{pbucket}/ckpt/model.bin", data)
    assert _stored(own_server, pbucket, "ckpt/model.bin") is None
    survivor = TierCacheFileSystem(
        target_options=own_server.endpoint.target_options(),
        local_dir=local_dir,
        skip_instance_cache=True,
    )
    survivor.flush(timeout=120)
    assert _stored(own_server, pbucket, "ckpt/model.bin") == data


def test_store_down_during_uploads_then_back(
    own_server: OwnServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs()
    written = {f"{pbucket}/run/step-{i}.bin": os.urandom(2 * MiB + i) for i in range(6)}
    items = list(written.items())
    for path, data in items[:3]:
        with fs.open(path, "wb") as f:
            f.write(data)
    own_server.stop()  # the server process is gone, not just slow
    try:
        for path, data in items[3:]:
            with fs.open(path, "wb") as f:  # the writer keeps going while the store is down
                f.write(data)
        time.sleep(1.5)  # uploads fail and are retried meanwhile
        assert len(fs.pending()) >= 3
    finally:
        own_server.restart()
    fs.flush(timeout=180)
    for path, data in written.items():
        assert _stored(own_server, pbucket, path.split("/", 1)[1]) == data
    assert fs.stats()["upload_errors"] >= 1


def test_commit_marker_is_never_visible_before_the_rest(
    own_server: OwnServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs(upload_workers=4)
    files = {f"ckpt/step-7/__{i}_0.distcp": os.urandom(3 * MiB) for i in range(5)}
    own_server.pause()  # everything queues up, then 4 uploaders race for it at once
    try:
        for key, data in files.items():
            with fs.open(f"{pbucket}/{key}", "wb") as f:
                f.write(data)
        with fs.open(f"{pbucket}/ckpt/step-7/.metadata", "wb") as f:
            f.write(b"written last, as DCP does")
    finally:
        own_server.resume()
    client = own_server.client()
    violations: list[list[str]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            listed = client.list_objects_v2(Bucket=pbucket, Prefix="ckpt/step-7/")
            keys = {o["Key"] for o in listed.get("Contents", [])}
            if "ckpt/step-7/.metadata" in keys and not set(files) <= keys:
                violations.append(sorted(keys))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        fs.flush(timeout=120)
    finally:
        done.set()
        watcher.join()
    assert violations == []
    assert _stored(own_server, pbucket, "ckpt/step-7/.metadata") == b"written last, as DCP does"


def test_overwrite_uploads_only_the_newest_and_rm_cancels(
    own_server: OwnServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs()
    own_server.pause()
    try:
        for version in (b"v1", b"v2", b"v3"):
            with fs.open(f"{pbucket}/latest.pt", "wb") as f:
                f.write(version * MiB)
        with fs.open(f"{pbucket}/scratch.pt", "wb") as f:
            f.write(b"temporary")
        assert len(fs.pending()) == 2
    finally:
        own_server.resume()
    fs.rm(f"{pbucket}/scratch.pt")
    fs.flush(timeout=120)
    assert _stored(own_server, pbucket, "latest.pt") == b"v3" * MiB
    assert _stored(own_server, pbucket, "scratch.pt") is None
    assert not fs.exists(f"{pbucket}/scratch.pt")


def test_back_pressure_blocks_then_releases(
    own_server: OwnServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs(dirty_max_bytes=3 * MiB)
    own_server.pause()
    second_closed = threading.Event()

    def second_writer() -> None:
        with fs.open(f"{pbucket}/b.bin", "wb") as f:
            f.write(os.urandom(2 * MiB))
        second_closed.set()

    try:
        with fs.open(f"{pbucket}/a.bin", "wb") as f:
            f.write(os.urandom(2 * MiB))
        thread = threading.Thread(target=second_writer)
        thread.start()
        assert not second_closed.wait(1.0)  # 2 + 2 MiB > 3 MiB: blocked, not failed
    finally:
        own_server.resume()
    assert second_closed.wait(120)
    thread.join()
    fs.flush(timeout=120)
    assert fs.stats()["writes_throttled"] == 1


def test_status_and_flush_commands_finish_a_dead_writers_uploads(
    own_server: OwnServer, pbucket: str, tmp_path: Path
) -> None:
    import json
    import subprocess
    import sys

    local_dir = str(tmp_path / "tier")
    data = os.urandom(3 * MiB)
    _kill_writer_after_close(own_server, local_dir, f"{pbucket}/job/out.bin", data)
    env = {**os.environ, **own_server.env(), "TIERCACHE_LOCAL_DIR": local_dir}
    cli = [sys.executable, "-m", "tiercache.cli"]
    status = subprocess.run(
        [*cli, "status", "--json"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(status.stdout)
    assert report["pending"][0]["name"] == f"{pbucket}/job/out.bin"
    assert report["pending_bytes"] == len(data)
    assert own_server.endpoint.secret not in status.stdout + status.stderr
    flushed = subprocess.run(
        [*cli, "flush", "--timeout", "120"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert flushed.returncode == 0, flushed.stderr
    assert "uploaded 1 object(s)" in flushed.stdout
    assert _stored(own_server, pbucket, "job/out.bin") == data
    after = subprocess.run(
        [*cli, "status", "--json"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(after.stdout)["pending_uploads"] == 0


def _drain(options: dict[str, Any], local_dir: str, start: Any, out: Any) -> None:
    fs = _child_fs(options, local_dir)
    start.wait()
    fs.flush(timeout=120)
    out.put(fs.stats()["uploads"])


def test_processes_sharing_a_cache_upload_each_file_once(
    own_server: OwnServer,
    pbucket: str,
    wb_fs: Callable[..., TierCacheFileSystem],
    tmp_path: Path,
) -> None:
    fs = wb_fs(upload_workers=3)
    files = {f"{pbucket}/shared/{i}.bin": os.urandom(MiB + i) for i in range(8)}
    own_server.pause()
    try:
        for path, data in files.items():
            with fs.open(path, "wb") as f:
                f.write(data)
        ctx = multiprocessing.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        drainers = [
            ctx.Process(
                target=_drain,
                args=(own_server.endpoint.target_options(), str(tmp_path / "tier"), start, out),
            )
            for _ in range(3)
        ]
        for p in drainers:
            p.start()
        start.set()
        time.sleep(1.0)  # everybody is now trying to claim the same records
    finally:
        own_server.resume()
    fs.flush(timeout=120)
    uploads = [out.get(timeout=120) for _ in drainers] + [fs.stats()["uploads"]]
    for p in drainers:
        p.join(60)
    assert sum(uploads) == len(files)  # each file uploaded by exactly one of the 4 processes
    for path, data in files.items():
        assert _stored(own_server, pbucket, path.split("/", 1)[1]) == data
