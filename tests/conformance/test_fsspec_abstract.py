"""fsspec's own abstract test suites (copy, get, put, open, pipe) run on tiercache over real S3."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsspec.tests import abstract

from tiercache import TierCacheFileSystem

# SeaweedFS keeps listing a prefix as a directory after its last object is deleted (its
# "empty folder cleanup" had not run 30 s later), unlike S3. These tests delete a tree and then
# assert it is gone from the listing. They are expected to fail on the bundled server only;
# strict, so they turn into failures (to be unmarked) once the server behaves like S3.
_EMPTIED_PREFIX_LISTED = pytest.mark.xfail(
    condition=not os.environ.get("TIERCACHE_TEST_S3_ENDPOINT"),
    reason="SeaweedFS lists an emptied prefix as a directory",
    raises=AssertionError,
    strict=True,
)


def _on_bundled_server(cls: type, names: list[str]) -> type:
    for name in names:
        setattr(cls, name, _EMPTIED_PREFIX_LISTED(getattr(cls, name)))
    return cls


class TierCacheFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, s3: Any, tmp_path: Path) -> Iterator[TierCacheFileSystem]:
        fs = TierCacheFileSystem(
            target_options=s3.target_options(),
            local_dir=str(tmp_path / "tier"),
            consistency="always",
            skip_instance_cache=True,
        )
        yield fs
        fs.flush(timeout=60)  # writes are behind by default: land them before the bucket goes

    @pytest.fixture
    def fs_join(self) -> Any:
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def fs_path(self, bucket: str) -> Iterator[str]:
        yield f"{bucket}/root-{secrets.token_hex(3)}"

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False  # object stores have no empty directories


class TestTierCacheCopy(abstract.AbstractCopyTests, TierCacheFixtures):
    pass


_on_bundled_server(
    TestTierCacheCopy,
    [
        "test_copy_directory_to_existing_directory",
        "test_copy_directory_to_new_directory",
        "test_copy_glob_to_existing_directory",
        "test_copy_glob_to_new_directory",
        "test_copy_directory_without_files_with_same_name_prefix",
    ],
)


class TestTierCacheGet(abstract.AbstractGetTests, TierCacheFixtures):
    pass


class TestTierCachePut(abstract.AbstractPutTests, TierCacheFixtures):
    pass


_on_bundled_server(
    TestTierCachePut,
    [
        "test_put_directory_to_existing_directory",
        "test_put_directory_to_new_directory",
        "test_put_glob_to_existing_directory",
        "test_put_glob_to_new_directory",
        "test_put_directory_recursive",
        "test_put_directory_without_files_with_same_name_prefix",
    ],
)


class TestTierCacheOpen(abstract.AbstractOpenTests, TierCacheFixtures):
    pass


class TestTierCachePipe(abstract.AbstractPipeTests, TierCacheFixtures):
    pass
