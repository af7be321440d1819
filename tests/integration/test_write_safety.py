"""Write safety against the real server: an acknowledged write is never lost or misreported.

Each test here is one way the promise broke: writers racing on one key, an overwrite whose
close() fails, a flush under another spelling of the endpoint, keys the store refuses for
ever, torn journal records, what killed processes leave behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.proxy import FaultProxy
from support.servers_under_test import S3Endpoint

from tiercache import TierCacheFileSystem, UploadFailedError
from tiercache.errors import CacheTimeoutError, TierFullError

MiB = 1024 * 1024


@pytest.fixture
def fs_at(s3: S3Endpoint, tmp_path: Path) -> Callable[..., TierCacheFileSystem]:
    """A write-behind filesystem on ``endpoint`` (default: the server) and the test's tier."""

    def build(endpoint: str | None = None, **options: Any) -> TierCacheFileSystem:
        target = dict(s3.target_options(), endpoint_url=endpoint or s3.endpoint)
        options.setdefault("local_dir", str(tmp_path / "tier"))
        options.setdefault("retries", 2)
        return TierCacheFileSystem(target_options=target, skip_instance_cache=True, **options)

    return build


def _stored(s3_client: Any, bucket: str, key: str) -> bytes | None:
    try:
        return bytes(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3_client.exceptions.NoSuchKey:
        return None


def _race(fs: TierCacheFileSystem, path: str, round_: int, writers: int = 4) -> bytes:
    """``writers`` threads overwrite ``path`` at once; the bytes whose close() returned last."""
    returned: list[tuple[float, bytes]] = []
    lock = threading.Lock()
    start = threading.Barrier(writers)

    def write(i: int) -> None:
        data = f"round {round_} writer {i} ".encode() * (1000 + 37 * i)
        start.wait()
        with fs.open(path, "wb") as f:
            f.write(data)
        with lock:
            returned.append((time.monotonic(), data))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(returned)[1]


def test_threads_overwriting_one_key_end_with_the_last_close(
    fs_at: Callable[..., TierCacheFileSystem], bucket: str, s3_client: Any
) -> None:
    fs = fs_at()
    path = f"{bucket}/ckpt/latest.pt"
    for round_ in range(15):
        last = _race(fs, path, round_)
        fs.flush(path, timeout=60)
        assert _stored(s3_client, bucket, "ckpt/latest.pt") == last, f"round {round_}"
        assert fs.cat_file(path) == last
        assert fs.pending() == []
    journal = Path(fs.tier.root) / "journal"
    deadline = time.monotonic() + 5  # an uploader gives its claim back just after the flush
    while list(journal.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in journal.iterdir()) == []  # no record, bytes or claim left


def test_an_overwrite_that_fails_keeps_the_acknowledged_version(
    fs_at: Callable[..., TierCacheFileSystem], bucket: str, s3_client: Any, proxy: Any
) -> None:
    fs = fs_at(proxy.url, lock_timeout=0.5)
    path = f"{bucket}/ckpt/model.pt"
    proxy.fail_next(10**6, status=503, method="PUT")  # version 1 stays pending
    with fs.open(path, "wb") as f:
        f.write(b"version 1, acknowledged")
    entry_id = fs.read_path.entry_id(bucket, "ckpt/model.pt")
    lock_path = fs.tier.paths(entry_id).lock
    held = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another process holds the entry: the commit times out
    try:
        with pytest.raises(CacheTimeoutError), fs.open(path, "wb") as f:
            f.write(b"version 2, never acknowledged")
    finally:
        os.close(held)
    assert fs.cat_file(path) == b"version 1, acknowledged"
    proxy.clear()
    fs.flush(timeout=60)
    assert _stored(s3_client, bucket, "ckpt/model.pt") == b"version 1, acknowledged"


def test_a_commit_that_runs_out_of_space_keeps_the_previous_version(
    fs_at: Callable[..., TierCacheFileSystem],
    bucket: str,
    s3_client: Any,
    proxy: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fs = fs_at(proxy.url)
    path = f"{bucket}/ckpt/opt.pt"
    proxy.fail_next(10**6, status=503, method="PUT")
    with fs.open(path, "wb") as f:
        f.write(b"version 1")
    original = fs.tier.publish

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fs.tier, "publish", full)
    with pytest.raises(TierFullError), fs.open(path, "wb") as f:
        f.write(b"version 2")
    monkeypatch.setattr(fs.tier, "publish", original)
    assert fs.cat_file(path) == b"version 1"
    assert [p["state"] for p in fs.pending()] == ["dirty"]
    proxy.clear()
    fs.flush(timeout=60)
    assert _stored(s3_client, bucket, "ckpt/opt.pt") == b"version 1"


def test_a_key_the_store_refuses_fails_for_good_and_blocks_nothing(
    fs_at: Callable[..., TierCacheFileSystem], bucket: str, s3_client: Any, proxy: Any
) -> None:
    fs = fs_at(proxy.url, dirty_max_bytes=2 * MiB)
    proxy.fail_next(10**6, status=400, code="KeyTooLongError", path_contains="refused/")
    with fs.open(f"{bucket}/refused/a.bin", "wb") as f:
        f.write(os.urandom(int(1.5 * MiB)))
    deadline = time.monotonic() + 30
    while [p["state"] for p in fs.pending()] != ["failed"]:
        assert time.monotonic() < deadline, fs.pending()
        time.sleep(0.05)
    started = time.monotonic()
    with fs.open(f"{bucket}/ok/b.bin", "wb") as f:  # not held back by the refused bytes
        f.write(os.urandom(int(1.5 * MiB)))
    assert time.monotonic() - started < 10
    with pytest.raises(UploadFailedError) as raised:
        fs.flush(timeout=60)
    assert raised.value.names == [f"{bucket}/refused/a.bin"]
    assert "KeyTooLongError" in str(raised.value)
    assert _stored(s3_client, bucket, "ok/b.bin") is not None
    assert fs.pending()[0]["last_error"]
    assert fs.discard(f"{bucket}/refused/") == [f"{bucket}/refused/a.bin"]
    fs.flush(timeout=60)
    assert fs.pending() == []


def test_flush_retry_failed_sends_a_refused_upload_again(
    fs_at: Callable[..., TierCacheFileSystem], bucket: str, s3_client: Any, proxy: Any
) -> None:
    fs = fs_at(proxy.url)
    proxy.fail_next(1, status=403, method="PUT")
    with fs.open(f"{bucket}/k.bin", "wb") as f:
        f.write(b"denied once")
    with pytest.raises(UploadFailedError):
        fs.flush(timeout=60)
    assert fs.pending()[0]["state"] == "failed"
    fs.flush(timeout=60, retry_failed=True)
    assert _stored(s3_client, bucket, "k.bin") == b"denied once"


def test_keys_no_store_accepts_are_refused_at_open(
    fs_at: Callable[..., TierCacheFileSystem], bucket: str
) -> None:
    fs = fs_at()
    with pytest.raises(ValueError, match="1024"):
        fs.open(f"{bucket}/" + "k" * 1100, "wb")
    with pytest.raises(ValueError, match="UTF-8"):
        fs.open(f"{bucket}/bad-\udcff", "wb")
    with pytest.raises(IsADirectoryError):
        fs.open(f"{bucket}/dir/", "wb")
    assert fs.pending() == []


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiercache.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _writer_killed_after_close(endpoint: str, s3: S3Endpoint, local_dir: str, path: str) -> None:
    """A process writes ``path`` behind and dies (SIGKILL) before its upload starts (uploads
    wait for 0.3 s of quiet after a write)."""
    script = f"""
import os, signal
from tiercache import TierCacheFileSystem
fs = TierCacheFileSystem(target_options={{"endpoint_url": {endpoint!r}, "key": {s3.key!r},
    "secret": {s3.secret!r}}}, local_dir={local_dir!r}, skip_instance_cache=True)
with fs.open({path!r}, "wb") as f:
    f.write(b"pending bytes")
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=60, check=False)
    assert done.returncode == -9


@pytest.fixture
def cli_env(s3: S3Endpoint) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID=s3.key, AWS_SECRET_ACCESS_KEY=s3.secret, AWS_DEFAULT_REGION=s3.region
    )
    return env


def _loopback_port(s3: S3Endpoint) -> str:
    if not s3.endpoint.startswith("http://127.0.0.1:"):
        pytest.skip("respells the bundled server's 127.0.0.1 address")
    return s3.endpoint.rsplit(":", 1)[1].rstrip("/")


def test_flush_under_another_spelling_of_the_endpoint_uploads(
    s3: S3Endpoint, bucket: str, s3_client: Any, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    port = _loopback_port(s3)
    local_dir = str(tmp_path / "tier")
    writer = f"http://LocalHost:{port}"
    _writer_killed_after_close(writer, s3, local_dir, f"{bucket}/ckpt/a.bin")
    assert _stored(s3_client, bucket, "ckpt/a.bin") is None
    flush = ["flush", "--local-dir", local_dir, "--endpoint-url", f"http://127.0.0.1:{port}/"]
    done = _cli(*flush, env=cli_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _stored(s3_client, bucket, "ckpt/a.bin") == b"pending bytes"


def test_flush_of_another_endpoint_names_what_it_did_not_upload(
    s3: S3Endpoint, bucket: str, s3_client: Any, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    local_dir = str(tmp_path / "tier")
    with FaultProxy(s3.endpoint) as other:  # a second endpoint for the same bucket
        _writer_killed_after_close(other.url, s3, local_dir, f"{bucket}/ckpt/b.bin")
    flush = ["flush", "--local-dir", local_dir, "--endpoint-url", s3.endpoint]
    done = _cli(*flush, env=cli_env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "another endpoint" in done.stderr and f"{bucket}/ckpt/b.bin" in done.stderr
    assert _stored(s3_client, bucket, "ckpt/b.bin") is None


def test_a_torn_record_of_a_pending_write_is_rebuilt_from_its_bytes(
    fs_at: Callable[..., TierCacheFileSystem], bucket: str, s3_client: Any, proxy: Any
) -> None:
    fs = fs_at(proxy.url)
    proxy.fail_next(10**6, status=503, method="PUT")
    with fs.open(f"{bucket}/x.bin", "wb") as f:
        f.write(b"acknowledged bytes")
    entry_id = fs.read_path.entry_id(bucket, "x.bin")
    record = Path(fs.tier.root) / "journal" / f"{entry_id}.json"
    record.write_bytes(record.read_bytes()[:20])  # torn
    proxy.clear()
    fs.flush(timeout=60)
    assert _stored(s3_client, bucket, "x.bin") == b"acknowledged bytes"


def test_fsck_removes_what_killed_writers_left(
    fs_at: Callable[..., TierCacheFileSystem], bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    fs = fs_at()
    staging = Path(fs.tier.root) / "staging"
    orphan = staging / ("0" * 64 + ".1.1")
    orphan.write_bytes(b"x" * 100_000)
    os.utime(orphan, (time.time() - 60, time.time() - 60))
    assert fs.tier.usage(fresh=True) >= 100_000  # counted while it is there
    upload = s3_client.create_multipart_upload(Bucket=bucket, Key="big.bin")
    entry_id = fs.read_path.entry_id(bucket, "big.bin")
    journal = Path(fs.tier.root) / "journal"
    (journal / f"{entry_id}.mpu").write_text(
        json.dumps({"bucket": bucket, "key": "big.bin", "upload_id": upload["UploadId"]})
    )
    (journal / f"{entry_id}.upload").write_bytes(b"")  # a dead uploader's claim
    (journal / f"{entry_id}.json.999.dead.tmp").write_bytes(b"{")  # a dead commit's
    report = fs.fsck()
    assert report["leftovers_removed"] >= 1 and report["multipart_aborted"] == 1
    assert not orphan.exists()
    assert sorted(p.name for p in journal.iterdir()) == []
    left = s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["UploadId"] for u in left] == []


def test_a_write_that_does_not_fit_raises_tier_full(
    s3: S3Endpoint, bucket: str, small_tier: Path
) -> None:
    fs = TierCacheFileSystem(
        target_options=s3.target_options(), local_dir=str(small_tier), skip_instance_cache=True
    )
    with pytest.raises(TierFullError), fs.open(f"{bucket}/big.bin", "wb") as f:
        f.write(os.urandom(12 * MiB))
    assert fs.pending() == []


@pytest.mark.parametrize("older_pending", [False, True], ids=["first-version", "over-pending"])
def test_a_commit_killed_after_publishing_is_in_the_next_flush(
    s3: S3Endpoint, bucket: str, s3_client: Any, tmp_path: Path, older_pending: bool
) -> None:
    """The writer dies between publishing its dirty entry and installing its record: a fresh
    process's flush must not return while the tier shows a version the store lacks."""
    local_dir = str(tmp_path / "tier")
    older = "v1 acknowledged" if older_pending else None
    script = f"""
import os
import tiercache.write.state as state
from tiercache import TierCacheFileSystem
fs = TierCacheFileSystem(target_options={s3.target_options()!r}, local_dir={local_dir!r},
    skip_instance_cache=True)
if {older!r} is not None:
    with fs.open({bucket + "/k.bin"!r}, "wb") as f:  # pending: uploads wait for quiet
        f.write({older!r}.encode())
real_install = state.install
def die_before_the_record(tmp, path):
    if path.endswith(".json"):
        os._exit(9)
    return real_install(tmp, path)
state.install = die_before_the_record
with fs.open({bucket + "/k.bin"!r}, "wb") as f:
    f.write(b"v2 published, never acknowledged")
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=60, check=False)
    assert done.returncode == 9
    fs = TierCacheFileSystem(
        target_options=s3.target_options(), local_dir=local_dir, skip_instance_cache=True
    )
    assert fs.cat_file(f"{bucket}/k.bin") == b"v2 published, never acknowledged"
    fs.flush(timeout=60)
    assert _stored(s3_client, bucket, "k.bin") == b"v2 published, never acknowledged"
    assert fs.pending() == []
    journal = Path(local_dir) / "journal"
    assert [p.name for p in journal.iterdir() if p.name.endswith(".tmp")] == []
