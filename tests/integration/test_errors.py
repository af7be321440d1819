"""Bad input and failures give clear errors, bounded in time, with no credential in them."""

from __future__ import annotations

import json
import logging
import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tiercache import AccessDeniedError, ConfigError, StoreUnavailableError, TierCacheFileSystem

if TYPE_CHECKING:  # the fixture's class; imported for annotations only
    from support.servers_under_test import OwnServer


SECRET = "very-secret-value-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_wrong_credentials_raise_permission_error(
    s3: Any, s3_client: Any, bucket: str, tmp_path: Path, caplog: Any
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"x")
    options = {**s3.target_options(), "secret": SECRET}
    fs = TierCacheFileSystem(
        target_options=options, local_dir=str(tmp_path), skip_instance_cache=True
    )
    caplog.set_level(logging.DEBUG)
    with pytest.raises(PermissionError) as err:
        fs.cat(f"{bucket}/k")
    assert isinstance(err.value, AccessDeniedError)
    assert SECRET not in str(err.value) and SECRET not in repr(err.value)
    assert SECRET not in caplog.text
    assert SECRET not in repr(fs) and SECRET not in repr(fs.store)
    assert SECRET not in json.dumps(fs.stats())  # nor in the metrics


def test_unreachable_store_fails_fast_with_bounded_retries(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}"
    fs = TierCacheFileSystem(
        target_options={"endpoint_url": endpoint, "key": "k", "secret": SECRET},
        local_dir=str(tmp_path),
        retries=3,
        connect_timeout=1,
        skip_instance_cache=True,
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as err:
        fs.cat("bucket/key")
    assert isinstance(err.value, ConnectionError)
    assert "after 3 attempts" in str(err.value) and endpoint in str(err.value)
    assert SECRET not in str(err.value)
    assert time.monotonic() - started < 30  # bounded, never a hang (generous for slow CI)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"consistency": "sometimes"}, "consistency"),
        ({"local_max_bytes": -1}, "local_max_bytes"),
        ({"local_max_bytes": "lots"}, "local_max_bytes"),
        ({"ttl": "soon"}, "ttl"),
        ({"fetch_concurrency": 0}, "fetch_concurrency"),
        ({"part_size": 1024}, "part_size"),
        ({"target_protocol": "gcs"}, "target_protocol"),
        ({"target_options": {"endpoint_url": "localhost:9000"}}, "endpoint_url"),
        ({"target_options": {"key": "only-a-key"}}, "key and secret"),
    ],
)
def test_bad_options_raise_value_error_naming_them(
    tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named) as err:
        TierCacheFileSystem(local_dir=str(tmp_path), skip_instance_cache=True, **options)
    assert isinstance(err.value, ConfigError)


def test_environment_variables_configure_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERCACHE_LOCAL_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("TIERCACHE_LOCAL_MAX_BYTES", "2GiB")
    monkeypatch.setenv("TIERCACHE_CONSISTENCY", "always")
    fs = TierCacheFileSystem(skip_instance_cache=True, ttl=5)
    assert fs.config.local_dir == str(tmp_path / "from-env")
    assert fs.config.local_max_bytes == 2 * 1024**3
    assert fs.config.consistency == "always"
    monkeypatch.setenv("TIERCACHE_TTL", "never")
    with pytest.raises(ValueError, match="TIERCACHE_TTL"):
        TierCacheFileSystem(skip_instance_cache=True)


def test_bad_paths(make_fs: Any, bucket: str) -> None:
    fs = make_fs()
    with pytest.raises(ValueError, match="NUL"):
        fs.cat(f"{bucket}/a\x00b")
    with pytest.raises(IsADirectoryError):
        fs.open(bucket)
    with pytest.raises(ValueError, match="mode"):
        fs.open(f"{bucket}/k", "ab")


def test_store_that_stops_answering_fails_within_bounded_time(
    own_server: OwnServer, tmp_path: Path
) -> None:
    """A store that accepts connections but never answers is a bounded failure.

    Freezing a server (SIGSTOP) takes one the test owns: this checks tiercache's timeouts and
    retries, on ``own_server``, not the server under test.
    """
    writer, fs = (
        TierCacheFileSystem(
            target_options=own_server.endpoint.target_options(),
            local_dir=str(tmp_path / name),
            retries=2,
            connect_timeout=1,
            read_timeout=1,
            skip_instance_cache=True,
        )
        for name in ("writer", "reader")
    )
    bucket = f"tc-frozen-{secrets.token_hex(5)}"
    writer.mkdir(bucket)
    writer.pipe_file(f"{bucket}/k", b"value")  # in the writer's tier: the reader must GET it
    own_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="after 2 attempts"):
            fs.cat(f"{bucket}/k")
        assert time.monotonic() - started < 30
    finally:
        own_server.resume()
    assert fs.cat(f"{bucket}/k") == b"value"  # and it recovers once the server answers
