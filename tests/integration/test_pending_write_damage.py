"""A pending write whose tier files are damaged is never dropped nor replaced by the store's
older version: against the real server, with the tier's files damaged behind tiercache's back.

Readers get the bytes restored from the journal's copy (or ``CacheCorruptError``), ``fsck``
restores and reports the damage, and ``flush`` of a new process never says done while such a
write is not in the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.proxy import FaultProxy
from support.servers_under_test import S3Endpoint

from tiercache import TierCacheFileSystem, UploadFailedError

OLD = b"the store's older version"
NEW = b"the pending version, acknowledged by close()"

_FRESH_PROCESS = """
import json, sys
from tiercache import TierCacheFileSystem
args = json.loads(sys.argv[1])
fs = TierCacheFileSystem(skip_instance_cache=True, **args["options"])
try:
    if args["do"] == "read":
        print(json.dumps({"read": fs.cat_file(args["path"]).decode()}))
    else:
        fs.flush(args["path"], timeout=60)
        print(json.dumps({"flushed": True}))
except OSError as exc:
    print(json.dumps({"error": type(exc).__name__, "errno": exc.errno, "message": str(exc)}))
"""


def _in_new_process(options: dict[str, Any], do: str, path: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _FRESH_PROCESS,
            json.dumps({"options": options, "do": do, "path": path}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(done.stdout.splitlines()[-1]))


def _stored(s3_client: Any, bucket: str, key: str) -> bytes:
    return bytes(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())


def _cli(s3: S3Endpoint, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID=s3.key, AWS_SECRET_ACCESS_KEY=s3.secret, AWS_DEFAULT_REGION=s3.region
    )
    return subprocess.run(
        [sys.executable, "-m", "tiercache.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


_WRITER = """
import json, os, signal, sys
from tiercache import TierCacheFileSystem
args = json.loads(sys.argv[1])
fs = TierCacheFileSystem(skip_instance_cache=True, **args["options"])
with fs.open(args["path"], "wb") as f:
    f.write(args["data"].encode())
bucket, key = args["path"].split("/", 1)
entry = fs.read_path.cached(bucket, key)
assert entry is not None and entry.meta.state == "dirty"
print(json.dumps({"id": entry.entry_id, "data": entry.paths.data, "meta": entry.paths.meta,
                  "root": fs.tier.root}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no uploader left to repair or upload behind the test
"""


class Pending:
    """``bucket/x.bin``: OLD in the store, NEW written behind by a process killed once its
    ``close()`` returned; the proxy refuses every PUT until ``release``."""

    def __init__(self, s3: S3Endpoint, s3_client: Any, bucket: str, proxy: FaultProxy, tier: Path):
        s3_client.put_object(Bucket=bucket, Key="x.bin", Body=OLD)
        self.path = f"{bucket}/x.bin"
        self.proxy = proxy
        self.options: dict[str, Any] = {
            "local_dir": str(tier),
            "target_options": dict(s3.target_options(), endpoint_url=proxy.url),
            "retries": 1,
        }
        proxy.fail_next(10**6, status=503, method="PUT")
        args = {"options": self.options, "path": self.path, "data": NEW.decode()}
        done = subprocess.run(
            [sys.executable, "-c", _WRITER, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == -9, done.stdout + done.stderr
        written = json.loads(done.stdout.splitlines()[-1])
        self.data, self.meta = Path(written["data"]), Path(written["meta"])
        self.journal = Path(written["root"]) / "journal"
        self.record = self.journal / f"{written['id']}.json"
        (self.bytes,) = self.journal.glob(f"{written['id']}.*.bytes")

    def damage(self, how: str) -> None:
        data, meta = self.data, self.meta
        if how == "garbled_meta":
            meta.write_bytes(b'{"source": "s3://' + os.urandom(16))
        elif how == "missing_meta":
            meta.unlink()
        elif how == "empty_meta":  # a commit does not fsync it: a power loss can leave this
            meta.write_bytes(b"")
        elif how == "truncated_data":  # a shorter file in its place: the journal's is intact
            data.unlink()
            data.write_bytes(NEW[:7])
        elif how == "missing_data":
            data.unlink()
        elif how == "truncated_in_place":  # one inode with the journal's copy: both damaged
            os.truncate(data, 7)
        else:
            raise ValueError(how)

    def release(self) -> None:
        self.proxy.clear()


DAMAGE = ["garbled_meta", "missing_meta", "empty_meta", "truncated_data", "missing_data"]


@pytest.fixture
def pending(
    s3: S3Endpoint, s3_client: Any, bucket: str, proxy: FaultProxy, tmp_path: Path
) -> Pending:
    return Pending(s3, s3_client, bucket, proxy, tmp_path / "tier")


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_reader_gets_the_pending_bytes_from_the_journal_copy(
    pending: Pending, s3_client: Any, bucket: str, damage: str
) -> None:
    pending.damage(damage)
    for _ in range(2):  # the first restores the entry; the second finds it restored
        assert _in_new_process(pending.options, "read", pending.path) == {"read": NEW.decode()}
    fs = TierCacheFileSystem(skip_instance_cache=True, **pending.options)
    entry = fs.read_path.cached(bucket, "x.bin")
    assert entry is not None and entry.meta.state == "dirty"  # not the store's clean copy
    assert Path(entry.paths.data).read_bytes() == NEW
    pending.release()
    fs.flush(timeout=60)
    assert _stored(s3_client, bucket, "x.bin") == NEW


def test_a_reader_gets_an_error_when_no_copy_of_the_pending_bytes_is_left(
    pending: Pending, s3: S3Endpoint
) -> None:
    pending.damage("truncated_in_place")
    got = _in_new_process(pending.options, "read", pending.path)
    assert got["error"] == "CacheCorruptError" and got["errno"] == 5, got
    assert "older version" in got["message"] and pending.path in got["message"]
    done = _cli(
        s3, "fsck", "--local-dir", pending.options["local_dir"], "--endpoint-url", pending.proxy.url
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"LOST: {pending.path}" in done.stderr
    assert "retry-failed" not in done.stderr  # retrying cannot bring lost bytes back


@pytest.mark.parametrize("damage", DAMAGE)
def test_fsck_restores_a_damaged_pending_entry_and_says_so(
    pending: Pending, s3: S3Endpoint, s3_client: Any, bucket: str, damage: str
) -> None:
    pending.damage(damage)
    fsck = [
        "fsck",
        "--local-dir",
        pending.options["local_dir"],
        "--endpoint-url",
        pending.proxy.url,
    ]
    done = _cli(s3, *fsck)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"DAMAGED: {pending.path}" in done.stderr and "LOST" not in done.stderr
    assert pending.data.read_bytes() == NEW
    again = _cli(s3, *fsck)
    assert again.returncode == 0, again.stdout + again.stderr  # repaired: nothing left to say
    pending.release()
    flush = _cli(
        s3,
        "flush",
        "--local-dir",
        pending.options["local_dir"],
        "--endpoint-url",
        pending.proxy.url,
    )
    assert flush.returncode == 0, flush.stdout + flush.stderr
    assert _stored(s3_client, bucket, "x.bin") == NEW


@pytest.mark.parametrize("path", ["all", "object"])
def test_flush_in_a_new_process_uploads_a_pending_write_whose_record_was_removed(
    pending: Pending, s3_client: Any, bucket: str, path: str
) -> None:
    pending.record.unlink()
    pending.release()
    got = _in_new_process(pending.options, "flush", "" if path == "all" else pending.path)
    assert got == {"flushed": True}
    assert _stored(s3_client, bucket, "x.bin") == NEW


@pytest.mark.parametrize("path", ["all", "object"])
def test_flush_never_says_done_over_a_torn_record_whose_entry_is_damaged(
    pending: Pending, s3_client: Any, bucket: str, path: str
) -> None:
    pending.record.write_bytes(pending.record.read_bytes()[:20])
    pending.damage("garbled_meta")
    pending.release()
    got = _in_new_process(pending.options, "flush", "" if path == "all" else pending.path)
    assert got["error"] == "UploadFailedError", got
    assert "lost" in got["message"] and "retry_failed" not in got["message"]
    assert pending.bytes.read_bytes() == NEW  # kept, named by the LOST record
    reader = _in_new_process(pending.options, "read", pending.path)
    assert reader["error"] == "CacheCorruptError", reader  # never the store's older version
    assert _stored(s3_client, bucket, "x.bin") == OLD


def test_upload_failed_error_suggests_retry_only_for_refused_writes(
    pending: Pending, bucket: str
) -> None:
    pending.damage("truncated_in_place")
    pending.release()
    fs = TierCacheFileSystem(skip_instance_cache=True, **pending.options)
    with pytest.raises(UploadFailedError) as raised:
        fs.flush(timeout=60)
    assert raised.value.names == [pending.path]
    assert "retry_failed" not in str(raised.value) and "discard" in str(raised.value)


def test_a_write_an_earlier_fsck_made_lost_is_uploaded_when_its_journal_copy_is_intact(
    pending: Pending, s3: S3Endpoint, s3_client: Any, bucket: str
) -> None:
    """What ``fsck`` once did to a pending write whose data file was gone: LOST, although the
    journal's copy of its bytes was intact. The next ``tiercache flush`` uploads it."""
    pending.damage("missing_data")
    record = json.loads(pending.record.read_bytes())
    record.update(state="lost", error="its cached bytes no longer match their digest")
    pending.record.write_text(json.dumps(record))
    pending.release()
    local = ["--local-dir", pending.options["local_dir"], "--endpoint-url", pending.proxy.url]
    done = _cli(s3, "flush", *local)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _stored(s3_client, bucket, "x.bin") == NEW
