"""Range-first cold reads: where a reader's first reads land decides how much is fetched.

Against the real S3 server behind the remote-store emulator (``s3-region``: 25 MiB/s per
connection), whose byte counter is what the store sent, including bodies cut short.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import fsspec
import pytest
from support.remote_store import RemoteStore

from tiercache import TierCacheFileSystem

pytestmark = pytest.mark.integration

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture
def remote(s3: Any) -> Any:
    with RemoteStore(s3.endpoint, "s3-region") as store:
        yield store


def _fs(s3: Any, remote: RemoteStore, tmp_path: Any, **options: Any) -> TierCacheFileSystem:
    target = {**s3.target_options(), "endpoint_url": remote.url}
    options.setdefault("local_dir", str(tmp_path / "tier"))
    return TierCacheFileSystem(target_options=target, skip_instance_cache=True, **options)


def _put(s3_client: Any, bucket: str, key: str, size: int) -> bytes:
    data = os.urandom(size)
    s3_client.put_object(Bucket=bucket, Key=key, Body=data)
    return data


def test_cold_read_of_the_last_64k_of_256m_fetches_at_most_16m(
    s3: Any, s3_client: Any, bucket: str, remote: RemoteStore, tmp_path: Any
) -> None:
    data = _put(s3_client, bucket, "big.bin", 256 * MiB)
    fs = _fs(s3, remote, tmp_path)
    with fs.open(f"{bucket}/big.bin") as f:
        f.seek(-64 * KiB, os.SEEK_END)
        assert f.read() == data[-64 * KiB :]
        at_return = remote.bytes_down
        assert at_return <= 16 * MiB, at_return
        # More random reads move about what they read (a block each), not the object.
        for offset in (100 * MiB, 3 * MiB, 200 * MiB + 5):
            f.seek(offset)
            assert f.read(10 * KiB) == data[offset : offset + 10 * KiB]
        assert remote.bytes_down <= at_return + 3 * (fs.config.block_size + 64 * KiB)
    time.sleep(1.0)  # nothing fetches the whole object behind a random reader
    assert remote.bytes_down <= 32 * MiB, remote.bytes_down
    stats = fs.stats()
    assert stats["fetches"] == 0 and stats["fetch_errors"] == 0, stats
    # The blocks read are cached: the same reads again ask the store nothing.
    requests = remote.requests
    with fs.open(f"{bucket}/big.bin") as f:
        f.seek(-64 * KiB, os.SEEK_END)
        assert f.read() == data[-64 * KiB :]
        f.seek(100 * MiB)
        assert f.read(10 * KiB) == data[100 * MiB : 100 * MiB + 10 * KiB]
    assert remote.requests == requests


def test_a_sequential_cold_reader_fetches_the_object_whole_once(
    s3: Any, s3_client: Any, bucket: str, remote: RemoteStore, tmp_path: Any
) -> None:
    data = _put(s3_client, bucket, "seq.bin", 48 * MiB)
    fs = _fs(s3, remote, tmp_path)
    chunks = []
    with fs.open(f"{bucket}/seq.bin") as f:
        while chunk := f.read(1 * MiB):
            chunks.append(chunk)
    assert b"".join(chunks) == data
    stats = fs.stats()
    assert (stats["fetches"], stats["blocks_fetched"]) == (1, 0), stats
    assert remote.bytes_down <= len(data) + MiB
    assert fs.is_cached(f"{bucket}/seq.bin")


def test_a_reader_streaming_from_the_start_gets_the_rest_beside_the_first_part(
    s3: Any, s3_client: Any, bucket: str, remote: RemoteStore, tmp_path: Any
) -> None:
    """A first read of megabytes from the start decides at once: the other ranged GETs run
    while the first part still arrives, instead of after it (one connection's rate)."""
    data = _put(s3_client, bucket, "stream.bin", 32 * MiB)
    fs = _fs(s3, remote, tmp_path)
    first_part = fs.config.range_size  # the first ranged GET of a range-first fetch
    with fs.open(f"{bucket}/stream.bin") as f:
        assert f.read(first_part) == data[:first_part]
        # More than the first part had arrived by then: another stream ran beside it.
        assert remote.bytes_down > first_part + MiB, remote.bytes_down
        assert f.read() == data[first_part:]
    stats = fs.stats()
    assert (stats["fetches"], stats["blocks_fetched"]) == (1, 0), stats
    assert remote.bytes_down <= len(data) + MiB


def test_header_then_footer_then_everything(
    s3: Any, s3_client: Any, bucket: str, remote: RemoteStore, tmp_path: Any
) -> None:
    """A parquet-like reader: magic bytes, footer, then the columns (the whole file)."""
    data = _put(s3_client, bucket, "table.bin", 40 * MiB)
    fs = _fs(s3, remote, tmp_path)
    with fs.open(f"{bucket}/table.bin") as f:
        assert f.read(4) == data[:4]
        f.seek(-8, os.SEEK_END)
        assert f.read() == data[-8:]
        f.seek(0)
        assert f.read() == data
    assert fs.stats()["fetches"] == 0  # read by blocks once the footer was read
    fs.wait_fetches()  # the block entry, read through, is made whole in the background
    assert remote.bytes_down <= len(data) + 2 * fs.config.range_size
    before = remote.requests
    assert fs.cat_file(f"{bucket}/table.bin") == data
    assert remote.requests == before


def test_readers_that_disagree_get_the_right_bytes(
    s3: Any, s3_client: Any, bucket: str, remote: RemoteStore, tmp_path: Any
) -> None:
    """One reader of a cold object reads its footer while another reads it through."""
    data = _put(s3_client, bucket, "both.bin", 40 * MiB)
    fs = _fs(s3, remote, tmp_path)
    results: dict[str, bytes] = {}
    errors: list[BaseException] = []
    opened = threading.Barrier(2)

    def footer() -> None:
        with fs.open(f"{bucket}/both.bin") as f:
            opened.wait()
            f.seek(-1000, os.SEEK_END)
            results["footer"] = f.read()

    def through() -> None:
        with fs.open(f"{bucket}/both.bin") as f:
            opened.wait()
            results["through"] = f.read()

    def run(target: Any) -> None:
        try:
            target()
        except BaseException as exc:  # reported below
            errors.append(exc)
            opened.abort()

    threads = [threading.Thread(target=run, args=(t,)) for t in (footer, through)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert results == {"footer": data[-1000:], "through": data}


def test_range_first_off_fetches_whole(
    s3: Any, s3_client: Any, bucket: str, remote: RemoteStore, tmp_path: Any
) -> None:
    data = _put(s3_client, bucket, "off.bin", 24 * MiB)
    fs = _fs(s3, remote, tmp_path, range_first_above=None)
    with fs.open(f"{bucket}/off.bin") as f:
        f.seek(-10, os.SEEK_END)
        assert f.read() == data[-10:]
    fs.wait_fetches()
    stats = fs.stats()
    print({k: v for k, v in stats.items() if v})
    assert stats["fetches"] == 1
    assert fs.is_cached(f"{bucket}/off.bin")


def test_parquet_footer_by_url_string_reads_little(
    s3: Any, s3_client: Any, bucket: str, remote: RemoteStore, tmp_path: Any
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = 3_000_000
    table = pa.table({"a": pa.array(range(rows)), "b": pa.array([float(i) for i in range(rows)])})
    local = tmp_path / "t.parquet"
    pq.write_table(table, local, compression="none", row_group_size=rows // 4)
    size = local.stat().st_size
    assert size > 32 * MiB
    s3_client.upload_file(str(local), bucket, "t.parquet")
    url = f"tiercache::s3://{bucket}/t.parquet"
    options = {
        "tiercache": {"local_dir": str(tmp_path / "tier")},
        "s3": {**s3.target_options(), "endpoint_url": remote.url},
    }
    with fsspec.open(url, "rb", **options) as f:
        meta = pq.ParquetFile(f).metadata
    assert meta.num_rows == rows
    assert remote.bytes_down <= 16 * MiB, remote.bytes_down
