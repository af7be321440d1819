"""Store faults injected by a proxy: reads and uploads retry to correct bytes, or fail cleanly."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import xxhash
from support.proxy import FaultProxy

from tiercache import (
    AccessDeniedError,
    CacheTimeoutError,
    ObjectNotFoundError,
    StoreUnavailableError,
    TierCacheFileSystem,
)

MiB = 1024 * 1024
PART = 5 * MiB
LAYOUTS: dict[str, dict[str, Any]] = {
    # one GetObject for the whole object
    "single": {"size": 3 * MiB + 17, "gets": 1, "options": {"fetch_concurrency": 1}},
    # three ranged GETs of 5 MiB, two at a time
    "parts": {
        "size": 2 * PART + 12345,
        "gets": 3,
        "options": {"fetch_concurrency": 2, "range_size": PART},
    },
}
TRUNCATE_AT = MiB + 4321  # not a multiple of tiercache's 1 MiB read chunk

Build = Callable[..., TierCacheFileSystem]


@pytest.fixture
def faulty_fs(s3: Any, proxy: FaultProxy, tmp_path: Path) -> Build:
    """A filesystem whose store endpoint is the proxy, with small retry budgets and timeouts."""

    def build(**options: Any) -> TierCacheFileSystem:
        options = {
            "local_dir": str(tmp_path / "tier"),
            "retries": 4,
            "connect_timeout": 2,
            "read_timeout": 5,
            **options,
        }
        return TierCacheFileSystem(
            target_options={**s3.target_options(), "endpoint_url": proxy.url},
            skip_instance_cache=True,
            **options,
        )

    return build


def _seed(s3_client: Any, bucket: str, key: str, size: int) -> bytes:
    data = os.urandom(size)
    s3_client.put_object(Bucket=bucket, Key=key, Body=data)
    return data


def _part_files(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "tier").rglob("*.part"))


def _stored(s3_client: Any, bucket: str, key: str) -> tuple[bytes, dict[str, str]]:
    resp = s3_client.get_object(Bucket=bucket, Key=key)
    return bytes(resp["Body"].read()), resp["Metadata"]


# -- reads ---------------------------------------------------------------------------------

READ_FAULTS: dict[str, tuple[Callable[[FaultProxy, int], None], int, dict[str, Any]]] = {
    # fault programmed on the proxy (given which GET to spare), extra GETs, filesystem options
    "503-slowdown": (lambda p, _: p.fail_next(2, 503, "SlowDown", method="GET"), 2, {}),
    "500-internal": (lambda p, _: p.fail_next(2, 500, "InternalError", method="GET"), 2, {}),
    "reset": (lambda p, _: p.reset_next(2, method="GET"), 2, {}),
    # single: the only GET breaks; parts: a later part (the first passes) breaks
    "truncated": (
        lambda p, skip: p.truncate_next(1, after_bytes=TRUNCATE_AT, method="GET", skip=skip),
        1,
        {},
    ),
    # the body stops without the connection closing: read_timeout must notice
    "stalled-body": (
        lambda p, skip: p.truncate_next(
            1, after_bytes=TRUNCATE_AT, hold=30, method="GET", skip=skip
        ),
        1,
        {"read_timeout": 1},
    ),
}
# The reader's read size: the download reads chunks of it, to hand them over whole.
READ_SIZE = 777_777
# How many bytes before the break the broken range may resume, at most: none for a body cut
# short (the last byte received); for a stalled one the chunk being read, which the timed-out
# read returns nothing of (one reader-sized chunk, or 1 MiB before the reader asked).
RESUME_LOSS = {"truncated": 0, "stalled-body": max(READ_SIZE, MiB) - 1}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fault", list(READ_FAULTS))
def test_read_retries_transient_faults_to_the_exact_bytes(
    faulty_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str, layout: str, fault: str
) -> None:
    shape = LAYOUTS[layout]
    data = _seed(s3_client, bucket, "obj", shape["size"])
    inject, extra, options = READ_FAULTS[fault]
    fs = faulty_fs(**shape["options"], **options)
    spare = 0 if layout == "single" else 1
    inject(proxy, spare)

    with fs.open(f"{bucket}/obj", "rb") as f:  # a progressive reader, fed while it arrives
        chunks = iter(lambda: f.read(READ_SIZE), b"")
        assert b"".join(chunks) == data
    fs.wait_fetches()
    assert fs.is_cached(f"{bucket}/obj")
    assert proxy.count("GET") == shape["gets"] + extra
    if fault in RESUME_LOSS:  # the broken range resumed near where it broke, not from scratch
        gets = [headers for method, _, headers in proxy.log if method == "GET"]
        broken = gets[spare].get("range", "bytes=0-")
        first, last = (int(n) if n else len(data) - 1 for n in broken[6:].split("-"))
        last = min(last, len(data) - 1)  # a first range may ask past the end of the object
        starts = [
            int(r[6:].split("-")[0])
            for r in (h.get("range", "") for h in gets)
            if r.endswith(f"-{last}") and int(r[6:].split("-")[0]) > first
        ]
        broke_at = first + TRUNCATE_AT
        assert len(starts) == 1, (broken, gets)
        assert broke_at - RESUME_LOSS[fault] <= starts[0] <= broke_at, (broken, gets)
    assert fs.cat_file(f"{bucket}/obj") == data  # now from the tier: no more GETs
    assert proxy.count("GET") == shape["gets"] + extra
    entry = fs.read_path.cached(bucket, "obj")
    assert entry is not None and entry.meta.digest == xxhash.xxh3_64(data).hexdigest()


PERSISTENT_FAULTS: dict[str, tuple[str, dict[str, Any], Callable[[FaultProxy], None]]] = {
    "503-slowdown": ("single", {}, lambda p: p.fail_next(10**6, 503, "SlowDown", method="GET")),
    "500-internal": ("parts", {}, lambda p: p.fail_next(10**6, 500, method="GET", skip=1)),
    "reset": ("single", {}, lambda p: p.reset_next(10**6, method="GET")),
    "truncated": (
        "parts",
        {},
        lambda p: p.truncate_next(10**6, after_bytes=64 * 1024, method="GET", skip=1),
    ),
    "stalled-head": ("single", {"read_timeout": 0.5}, lambda p: p.delay(2.0)),
    "stalled-body": (
        "parts",
        {"read_timeout": 0.5},
        lambda p: p.truncate_next(10**6, after_bytes=64 * 1024, hold=30, method="GET", skip=1),
    ),
}


@pytest.mark.parametrize("fault", list(PERSISTENT_FAULTS))
def test_persistent_faults_raise_store_unavailable_and_publish_nothing(
    faulty_fs: Build,
    proxy: FaultProxy,
    s3_client: Any,
    bucket: str,
    tmp_path: Path,
    fault: str,
) -> None:
    layout, options, inject = PERSISTENT_FAULTS[fault]
    shape = LAYOUTS[layout]
    data = _seed(s3_client, bucket, "obj", shape["size"])
    retries = 3
    fs = faulty_fs(retries=retries, **shape["options"], **options)
    inject(proxy)

    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as err:
        fs.cat_file(f"{bucket}/obj")
    elapsed = time.monotonic() - started
    assert isinstance(err.value, ConnectionError)
    assert f"s3://{bucket}/obj" in str(err.value) and "attempts" in str(err.value)
    assert elapsed < 30, elapsed
    fs.wait_fetches()
    assert not fs.is_cached(f"{bucket}/obj")
    assert _part_files(tmp_path) == []
    # Bounded: `retries` attempts per range (the first range of "parts" passes).
    if layout == "single":
        assert proxy.count("GET") == retries
    else:
        assert proxy.count("GET") <= 1 + (shape["gets"] - 1) * retries

    proxy.clear()
    assert fs.cat_file(f"{bucket}/obj") == data
    fs.wait_fetches()
    assert fs.is_cached(f"{bucket}/obj")


@pytest.mark.parametrize(
    ("status", "builtin", "error"),
    [(403, PermissionError, AccessDeniedError), (404, FileNotFoundError, ObjectNotFoundError)],
)
def test_client_errors_are_not_retried(
    faulty_fs: Build,
    proxy: FaultProxy,
    s3_client: Any,
    bucket: str,
    status: int,
    builtin: type[Exception],
    error: type[Exception],
) -> None:
    data = _seed(s3_client, bucket, "obj", 1000)
    fs = faulty_fs()
    proxy.fail_next(5, status, method="GET")
    with pytest.raises(builtin) as err:
        fs.cat_file(f"{bucket}/obj")
    assert isinstance(err.value, error)
    assert proxy.count("GET") == 1
    assert not fs.is_cached(f"{bucket}/obj")
    proxy.clear()
    if status == 404:  # an absence is remembered for ttl seconds, until told otherwise
        with pytest.raises(FileNotFoundError):
            fs.cat_file(f"{bucket}/obj")
        assert proxy.count("GET") == 1
        fs.invalidate_cache(f"{bucket}/obj")
    assert fs.cat_file(f"{bucket}/obj") == data


@pytest.mark.parametrize(
    "inject",
    [
        pytest.param(lambda p: p.fail_next(10**6, 503, method="GET"), id="503"),
        pytest.param(lambda p: p.reset_next(10**6, method="GET"), id="reset"),
        pytest.param(
            lambda p: p.truncate_next(10**6, after_bytes=1000, method="GET"),
            id="truncated",
        ),
        pytest.param(
            lambda p: p.fail_next(1, 403, method="GET"),
            id="403",
        ),
        pytest.param(
            lambda p: p.fail_next(1, 404, method="GET"),
            id="404",
        ),
    ],
)
def test_error_messages_name_operation_object_and_endpoint(
    faulty_fs: Build,
    proxy: FaultProxy,
    s3_client: Any,
    bucket: str,
    inject: Callable[[FaultProxy], None],
) -> None:
    _seed(s3_client, bucket, "obj", 4096)
    fs = faulty_fs(retries=2, fetch_concurrency=1)
    inject(proxy)
    with pytest.raises(OSError) as err:
        fs.cat_file(f"{bucket}/obj")
    message = str(err.value)
    assert "GetObject" in message and f"s3://{bucket}/obj" in message
    assert proxy.url in message, message


# -- uploads -------------------------------------------------------------------------------

SMALL, LARGE = MiB + 3, 2 * PART + 777  # PutObject; multipart: 3 parts
UPLOAD_FAULTS: dict[str, tuple[int, Callable[[FaultProxy], None], str, int]] = {
    # size, fault, what the PUT count matches, extra PUTs
    "put-503": (SMALL, lambda p: p.fail_next(2, 503, method="PUT"), "", 2),
    "put-reset": (SMALL, lambda p: p.reset_next(2, method="PUT"), "", 2),
    "put-answer-lost": (SMALL, lambda p: p.reset_next(1, method="PUT", forward=True), "", 1),
    "part-503": (
        LARGE,
        lambda p: p.fail_next(2, 503, method="PUT", path_contains="partNumber="),
        "partNumber=",
        2,
    ),
    "part-reset": (
        LARGE,
        lambda p: p.reset_next(2, method="PUT", path_contains="partNumber="),
        "partNumber=",
        2,
    ),
    "complete-500": (
        LARGE,
        lambda p: p.fail_next(1, 500, method="POST", path_contains="uploadId="),
        "partNumber=",
        0,
    ),
    "complete-200-error": (  # S3's 200 OK with an <Error> body
        LARGE,
        lambda p: p.fail_next(1, 200, "InternalError", method="POST", path_contains="uploadId="),
        "partNumber=",
        0,
    ),
    "complete-answer-lost": (
        LARGE,
        lambda p: p.reset_next(1, method="POST", path_contains="uploadId=", forward=True),
        "partNumber=",
        0,
    ),
}


@pytest.mark.parametrize("fault", list(UPLOAD_FAULTS))
def test_write_through_retries_upload_faults(
    faulty_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str, fault: str
) -> None:
    size, inject, puts_matching, extra = UPLOAD_FAULTS[fault]
    fs = faulty_fs(write_mode="through", part_size=PART, upload_concurrency=2)
    data = os.urandom(size)
    inject(proxy)
    with fs.open(f"{bucket}/ckpt.pt", "wb") as f:
        f.write(data)
    stored, metadata = _stored(s3_client, bucket, "ckpt.pt")
    assert stored == data
    assert metadata["tiercache-xxh3"] == xxhash.xxh3_64(data).hexdigest()
    parts = 1 if size <= PART else -(-size // PART)
    assert proxy.count("PUT", puts_matching or None) == parts + extra
    assert fs.cat_file(f"{bucket}/ckpt.pt") == data


@pytest.mark.parametrize(
    ("size", "inject", "abort"),
    [
        (SMALL, lambda p: p.fail_next(10**6, 503, method="PUT"), 0),
        (LARGE, lambda p: p.reset_next(10**6, method="PUT", path_contains="partNumber="), 1),
    ],
    ids=["put-503", "part-reset"],
)
def test_write_through_persistent_faults_fail_cleanly(
    faulty_fs: Build,
    proxy: FaultProxy,
    s3_client: Any,
    bucket: str,
    tmp_path: Path,
    size: int,
    inject: Callable[[FaultProxy], None],
    abort: int,
) -> None:
    retries = 3
    fs = faulty_fs(write_mode="through", retries=retries, part_size=PART, upload_concurrency=2)
    data = os.urandom(size)
    inject(proxy)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as err, fs.open(f"{bucket}/ckpt.pt", "wb") as f:
        f.write(data)
    assert isinstance(err.value, ConnectionError) and "attempts" in str(err.value)
    assert time.monotonic() - started < 30
    assert not fs.is_cached(f"{bucket}/ckpt.pt")
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert proxy.count("DELETE", "uploadId=") == abort  # a failed multipart upload is aborted
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert list((tmp_path / "tier" / "staging").iterdir()) == []

    proxy.clear()
    with fs.open(f"{bucket}/ckpt.pt", "wb") as f:
        f.write(data)
    assert _stored(s3_client, bucket, "ckpt.pt")[0] == data


@pytest.mark.parametrize(
    ("size", "inject"),
    [
        (SMALL, lambda p: p.fail_next(3, 503, method="PUT")),
        (LARGE, lambda p: p.reset_next(3, method="PUT", path_contains="partNumber=")),
    ],
    ids=["put-503", "part-reset"],
)
def test_write_behind_uploader_retries_until_the_upload_succeeds(
    faulty_fs: Build,
    proxy: FaultProxy,
    s3_client: Any,
    bucket: str,
    size: int,
    inject: Callable[[FaultProxy], None],
) -> None:
    # 3 faults with 2 attempts per request: the first upload fails, a later one succeeds.
    # (Parts sent while writing would absorb the faults: test_part_streamer.py has those.)
    fs = faulty_fs(retries=2, part_size=PART, upload_concurrency=2, upload_while_writing="off")
    data = os.urandom(size)
    inject(proxy)
    with fs.open(f"{bucket}/ckpt/rank0.pt", "wb") as f:
        f.write(data)
    assert fs.cat_file(f"{bucket}/ckpt/rank0.pt") == data  # read-your-writes meanwhile
    fs.flush(timeout=60)
    assert fs.pending() == []
    assert fs.stats()["upload_errors"] >= 1
    stored, metadata = _stored(s3_client, bucket, "ckpt/rank0.pt")
    assert stored == data
    assert metadata["tiercache-xxh3"] == xxhash.xxh3_64(data).hexdigest()
    entry = fs.read_path.cached(bucket, "ckpt/rank0.pt")
    assert entry is not None and entry.meta.state == "clean"


# -- latency -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reads_and_writes_are_correct_under_latency(
    faulty_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str, layout: str
) -> None:
    shape = LAYOUTS[layout]
    data = _seed(s3_client, bucket, "obj", shape["size"])
    fs = faulty_fs(write_mode="through", **shape["options"])
    proxy.delay(0.05)
    started = time.monotonic()
    assert fs.cat_file(f"{bucket}/obj") == data
    assert time.monotonic() - started >= 0.05
    assert proxy.count("GET") == shape["gets"]
    written = os.urandom(shape["size"])
    fs.pipe_file(f"{bucket}/written", written)
    assert _stored(s3_client, bucket, "written")[0] == written


def test_write_behind_outlasts_an_outage_longer_than_the_retry_budget(
    faulty_fs: Build, proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    fs = faulty_fs(retries=2)
    data = os.urandom(SMALL)
    proxy.fail_next(10**6, 503, method="PUT")
    started = time.monotonic()
    with fs.open(f"{bucket}/ckpt/rank0.pt", "wb") as f:
        f.write(data)
    assert time.monotonic() - started < 5  # close() does not wait for the store
    deadline = time.monotonic() + 20
    while (rows := fs.pending()) and rows[0]["attempts"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows and rows[0]["attempts"] >= 2 and "SlowDown" in rows[0]["last_error"], rows
    with pytest.raises(CacheTimeoutError, match="SlowDown"):
        fs.flush(timeout=0.5)
    assert fs.stats()["upload_errors"] >= 2

    proxy.clear()
    fs.flush(timeout=60)
    assert fs.pending() == []
    assert _stored(s3_client, bucket, "ckpt/rank0.pt")[0] == data
