"""Random 4 KiB reads of a 1 GiB object on the real S3 server fetch only the blocks they touch."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from support.proxy import FaultProxy

from tiercache import TierCacheFileSystem

MiB = 1024 * 1024
GiB = 1024 * MiB


def _write_pattern(path: Path) -> None:
    """1 GiB where every MiB differs (a random MiB, stamped with its index)."""
    seed = os.urandom(MiB)
    with open(path, "wb") as f:
        for i in range(GiB // MiB):
            f.write(i.to_bytes(8, "little") + seed[8:])


def test_random_reads_of_a_1_gib_object_fetch_under_5_percent(
    s3_client: Any, bucket: str, proxy: FaultProxy, s3: Any, tmp_path: Path
) -> None:
    source = tmp_path / "huge.bin"
    _write_pattern(source)
    s3_client.upload_file(str(source), bucket, "huge.bin")
    fs = TierCacheFileSystem(
        target_options={**s3.target_options(), "endpoint_url": proxy.url},
        local_dir=str(tmp_path / "tier"),
        block_size=MiB,
        consistency="immutable",
        skip_instance_cache=True,
    )
    rng = random.Random(11)
    with open(source, "rb") as expected, fs.open(f"{bucket}/huge.bin") as f:
        assert f.size == GiB
        for _ in range(40):
            offset = rng.randrange(0, GiB - 4096)
            f.seek(offset)
            expected.seek(offset)
            assert f.read(4096) == expected.read(4096)
    fetched = fs.stats()["bytes_fetched"]
    assert fetched < 0.05 * GiB, fetched
    # The store saw one GET per touched block and the first, abandoned, whole-object GET.
    assert proxy.count("GET", "/huge.bin") <= 40 * 2 + 1
    source.unlink()
