"""fsspec's ``s3`` protocol: s3fs's class where it imports, else a stand-in that parses alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from tiercache.s3_protocol import S3UrlStandIn

URLS = [
    "s3://b/k",
    "s3://b/k/",
    "s3a://b/dir/x.parquet",
    "s3://b",
    "b/k",
    "s3://b/k?versionId=abc",
    "s3a://b//k",
    "s3::b/k",
]


def test_with_s3fs_installed_the_s3_protocols_are_its_class() -> None:
    s3fs = pytest.importorskip("s3fs")  # the dev environment has it; an install may not
    assert fsspec.get_filesystem_class("s3") is s3fs.S3FileSystem
    assert fsspec.get_filesystem_class("s3a") is s3fs.S3FileSystem


@pytest.mark.parametrize("url", URLS)
def test_the_stand_in_parses_urls_as_s3fs_does(url: str) -> None:
    s3fs = pytest.importorskip("s3fs")
    assert S3UrlStandIn._strip_protocol(url) == s3fs.S3FileSystem._strip_protocol(url)
    assert S3UrlStandIn._get_kwargs_from_urls(url) == s3fs.S3FileSystem._get_kwargs_from_urls(url)


WITHOUT_S3FS = """
import sys
sys.modules["s3fs"] = None  # as where s3fs is not installed
import fsspec
assert "tiercache" not in sys.modules
options = {"local_dir": sys.argv[1]}
fs, path = fsspec.core.url_to_fs("tiercache::s3://bucket/dir/key", tiercache=options)
assert type(fs).__name__ == "TierCacheFileSystem" and path == "bucket/dir/key", (fs, path)
from tiercache.s3_protocol import S3UrlStandIn
assert fsspec.get_filesystem_class("s3") is S3UrlStandIn
try:
    fsspec.filesystem("s3")
except ImportError as error:
    assert str(error).startswith("Install s3fs to access S3"), error
else:
    raise AssertionError("the stand-in must refuse I/O")
"""


def test_without_s3fs_a_chained_url_resolves_and_plain_s3_asks_for_s3fs(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-c", WITHOUT_S3FS, str(tmp_path)], check=True)
