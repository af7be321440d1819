"""Options: defaults, sizes, environment variables, and errors that name the option."""

from __future__ import annotations

import pytest

from tiercache import ConfigError, S3Options, TierCacheConfig
from tiercache.config import parse_size
from tiercache.extents import Extents


@pytest.mark.parametrize(
    ("text", "size"),
    [("1024", 1024), ("1KiB", 1024), ("1.5GiB", 3 * 2**29), ("10MB", 10**7), ("2g", 2**31)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "ten", "1XB", "-5", True, None, 1.5])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"(?i)local_max_bytes"):
        TierCacheConfig.from_options(
            {"local_max_bytes": bad} if bad is not None else {},
            environ={"TIERCACHE_LOCAL_MAX_BYTES": "x"},
        )


def test_kwargs_beat_environment_which_beats_defaults() -> None:
    env = {"TIERCACHE_TTL": "7", "TIERCACHE_CONSISTENCY": "always", "TIERCACHE_FILE_MODE": "640"}
    config = TierCacheConfig.from_options({"ttl": 3}, environ=env)
    assert (config.ttl, config.consistency, config.file_mode) == (3, "always", 0o640)
    assert config.dir_mode == 0o750
    assert TierCacheConfig.from_options({}, environ={}).consistency == "ttl"


def test_config_is_frozen() -> None:
    config = TierCacheConfig(local_dir="/tmp/x")
    with pytest.raises(AttributeError):
        config.ttl = 5  # type: ignore[misc]


def test_file_mode_must_keep_owner_access() -> None:
    with pytest.raises(ConfigError, match="file_mode"):
        TierCacheConfig(local_dir="/tmp/x", file_mode=0o444)


def test_s3_options_accept_s3fs_names_and_hide_secrets() -> None:
    options = S3Options.from_storage_options(
        {
            "key": "AKIAEXAMPLE",
            "secret": "s3cr3t",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-1"},
            "config_kwargs": {"s3": {"addressing_style": "path"}},
        }
    )
    assert options.endpoint_url == "http://127.0.0.1:9000"
    assert (options.region, options.addressing_style) == ("eu-1", "path")
    assert "s3cr3t" not in repr(options) and "AKIAEXAMPLE" not in repr(options)
    with pytest.raises(ConfigError, match="addressing_style"):
        S3Options(addressing_style="sideways")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="read_timeout"):
        S3Options.from_storage_options({"config_kwargs": {"read_timeout": 3}})


def test_extents_merge_and_cover() -> None:
    extents = Extents()
    extents.add(10, 20)
    extents.add(30, 40)
    assert extents.prefix_end() == 0 and not extents.covers(10, 35)
    extents.add(0, 10)
    extents.add(20, 30)
    assert extents.prefix_end() == 40 and extents.covers(0, 40) and extents.total() == 40
    extents.add(50, 60)
    extents.add(35, 55)
    assert extents.covers(0, 60) and not extents.covers(0, 61)
