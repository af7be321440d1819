"""Write-behind against a real server that is paused, killed and restarted: nothing is lost."""

from __future__ import annotations

import multiprocessing
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import s3server
import xxhash

from tiercache import TierCacheFileSystem

MiB = 1024 * 1024


class PrivateServer:
    """A server of its own for these tests: pausing it must not disturb the shared one."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.server = s3server.start_server(data_dir=str(data_dir))
        self.port = self.server.port

    def options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.server.endpoint,
            "key": self.server.access_key,
            "secret": self.server.secret_key,
        }

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.server.endpoint,
            aws_access_key_id=self.server.access_key,
            aws_secret_access_key=self.server.secret_key,
            region_name=self.server.region,
        )

    def restart(self) -> None:
        self.server.stop()
        self.server = s3server.start_server(port=self.port, data_dir=str(self.data_dir))


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateServer]:
    server = PrivateServer(tmp_path_factory.mktemp("private-s3"))
    yield server
    server.server.stop()


@pytest.fixture
def pbucket(private: PrivateServer) -> str:
    name = f"tc-wb-{secrets.token_hex(5)}"
    private.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def wb_fs(private: PrivateServer, tmp_path: Path) -> Callable[..., TierCacheFileSystem]:
    def build(**options: Any) -> TierCacheFileSystem:
        options.setdefault("local_dir", str(tmp_path / "tier"))
        return TierCacheFileSystem(
            target_options=private.options(),
            skip_instance_cache=True,
            retries=2,
            connect_timeout=1,
            read_timeout=2,
            **options,
        )

    return build


def _stored(private: PrivateServer, bucket: str, key: str) -> bytes | None:
    try:
        return bytes(private.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    except private.client().exceptions.NoSuchKey:
        return None


def test_close_returns_while_the_store_is_frozen(
    private: PrivateServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs()
    data = os.urandom(6 * MiB)
    private.server.pause()
    try:
        with fs.open(f"{pbucket}/ckpt/rank0.pt", "wb") as f:
            f.write(data)
        # Read-your-writes from the tier while the store cannot answer at all.
        assert fs.cat_file(f"{pbucket}/ckpt/rank0.pt") == data
        assert fs.info(f"{pbucket}/ckpt/rank0.pt")["size"] == len(data)
        assert [p["name"] for p in fs.pending()] == [f"{pbucket}/ckpt/rank0.pt"]
        assert fs.evict(0).kept_busy >= 1 and fs.is_cached(f"{pbucket}/ckpt/rank0.pt")
    finally:
        private.server.resume()
    fs.flush(timeout=120)
    assert _stored(private, pbucket, "ckpt/rank0.pt") == data
    head = private.client().head_object(Bucket=pbucket, Key="ckpt/rank0.pt")
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


def _kill_writer_after_close(
    private: PrivateServer, local_dir: str, path: str, data: bytes
) -> None:
    """A separate process writes ``path``; once its close() returned it gets SIGKILL.

    The server is frozen meanwhile, so no upload can have finished before the kill.
    """
    ctx = multiprocessing.get_context("spawn")
    closed = ctx.Event()
    private.server.pause()
    try:
        writer = ctx.Process(
            target=_write_then_wait, args=(private.options(), local_dir, path, data, closed)
        )
        writer.start()
        assert closed.wait(60)
        os.kill(writer.pid or 0, signal.SIGKILL)
        writer.join(30)
        assert writer.exitcode == -signal.SIGKILL
    finally:
        private.server.resume()


def test_sigkill_after_close_loses_nothing(
    private: PrivateServer, pbucket: str, tmp_path: Path
) -> None:
    data = os.urandom(9 * MiB)
    local_dir = str(tmp_path / "tier")
    _kill_writer_after_close(private, local_dir, f"{pbucket}/ckpt/model.bin", data)
    assert _stored(private, pbucket, "ckpt/model.bin") is None
    survivor = TierCacheFileSystem(
        target_options=private.options(), local_dir=local_dir, skip_instance_cache=True
    )
    survivor.flush(timeout=120)
    assert _stored(private, pbucket, "ckpt/model.bin") == data


def test_store_down_during_uploads_then_back(
    private: PrivateServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs()
    written = {f"{pbucket}/run/step-{i}.bin": os.urandom(2 * MiB + i) for i in range(6)}
    items = list(written.items())
    for path, data in items[:3]:
        with fs.open(path, "wb") as f:
            f.write(data)
    private.server.stop()  # the server process is gone, not just slow
    try:
        for path, data in items[3:]:
            with fs.open(path, "wb") as f:  # the writer keeps going while the store is down
                f.write(data)
        time.sleep(1.5)  # uploads fail and are retried meanwhile
        assert len(fs.pending()) >= 3
    finally:
        private.restart()
    fs.flush(timeout=180)
    for path, data in written.items():
        assert _stored(private, pbucket, path.split("/", 1)[1]) == data
    assert fs.stats()["upload_errors"] >= 1


def test_commit_marker_is_never_visible_before_the_rest(
    private: PrivateServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs(upload_workers=4)
    files = {f"ckpt/step-7/__{i}_0.distcp": os.urandom(3 * MiB) for i in range(5)}
    private.server.pause()  # everything queues up, then 4 uploaders race for it at once
    try:
        for key, data in files.items():
            with fs.open(f"{pbucket}/{key}", "wb") as f:
                f.write(data)
        with fs.open(f"{pbucket}/ckpt/step-7/.metadata", "wb") as f:
            f.write(b"written last, as DCP does")
    finally:
        private.server.resume()
    client = private.client()
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
    assert _stored(private, pbucket, "ckpt/step-7/.metadata") == b"written last, as DCP does"


def test_overwrite_uploads_only_the_newest_and_rm_cancels(
    private: PrivateServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs()
    private.server.pause()
    try:
        for version in (b"v1", b"v2", b"v3"):
            with fs.open(f"{pbucket}/latest.pt", "wb") as f:
                f.write(version * MiB)
        with fs.open(f"{pbucket}/scratch.pt", "wb") as f:
            f.write(b"temporary")
        assert len(fs.pending()) == 2
    finally:
        private.server.resume()
    fs.rm(f"{pbucket}/scratch.pt")
    fs.flush(timeout=120)
    assert _stored(private, pbucket, "latest.pt") == b"v3" * MiB
    assert _stored(private, pbucket, "scratch.pt") is None
    assert not fs.exists(f"{pbucket}/scratch.pt")


def test_back_pressure_blocks_then_releases(
    private: PrivateServer, pbucket: str, wb_fs: Callable[..., TierCacheFileSystem]
) -> None:
    fs = wb_fs(dirty_max_bytes=3 * MiB)
    private.server.pause()
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
        private.server.resume()
    assert second_closed.wait(120)
    thread.join()
    fs.flush(timeout=120)
    assert fs.stats()["writes_throttled"] == 1


def test_status_and_flush_commands_finish_a_dead_writers_uploads(
    private: PrivateServer, pbucket: str, tmp_path: Path
) -> None:
    import json
    import subprocess
    import sys

    local_dir = str(tmp_path / "tier")
    data = os.urandom(3 * MiB)
    _kill_writer_after_close(private, local_dir, f"{pbucket}/job/out.bin", data)
    env = {**os.environ, **private.server.env(), "TIERCACHE_LOCAL_DIR": local_dir}
    cli = [sys.executable, "-m", "tiercache.cli"]
    status = subprocess.run(
        [*cli, "status", "--json"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(status.stdout)
    assert report["pending"][0]["name"] == f"{pbucket}/job/out.bin"
    assert report["pending_bytes"] == len(data)
    assert private.server.secret_key not in status.stdout + status.stderr
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
    assert _stored(private, pbucket, "job/out.bin") == data
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
    private: PrivateServer,
    pbucket: str,
    wb_fs: Callable[..., TierCacheFileSystem],
    tmp_path: Path,
) -> None:
    fs = wb_fs(upload_workers=3)
    files = {f"{pbucket}/shared/{i}.bin": os.urandom(MiB + i) for i in range(8)}
    private.server.pause()
    try:
        for path, data in files.items():
            with fs.open(path, "wb") as f:
                f.write(data)
        ctx = multiprocessing.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        drainers = [
            ctx.Process(target=_drain, args=(private.options(), str(tmp_path / "tier"), start, out))
            for _ in range(3)
        ]
        for p in drainers:
            p.start()
        start.set()
        time.sleep(1.0)  # everybody is now trying to claim the same records
    finally:
        private.server.resume()
    fs.flush(timeout=120)
    uploads = [out.get(timeout=120) for _ in drainers] + [fs.stats()["uploads"]]
    for p in drainers:
        p.join(60)
    assert sum(uploads) == len(files)  # each file uploaded by exactly one of the 4 processes
    for path, data in files.items():
        assert _stored(private, pbucket, path.split("/", 1)[1]) == data
