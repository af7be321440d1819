"""Every option of ``TierCacheConfig`` parses from the environment, the config file and its flag."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from tiercache import config as config_module
from tiercache.cli import COMMANDS, common
from tiercache.config import GiB, MiB, TierCacheConfig
from tiercache.config_file import load_config, tier_options
from tiercache.errors import ConfigError

FIELDS = [f.name for f in dataclasses.fields(TierCacheConfig)]

# A valid value of each option spelled as a string, and the value it must become. Values are
# chosen inside every option's range with the other options at their defaults.
VALID: dict[str, tuple[str, Any]] = {
    "local_dir": ("/tmp/tiercache-fields/local", "/tmp/tiercache-fields/local"),
    "local_max_bytes": ("50GiB", 50 * GiB),
    "consistency": ("always", "always"),
    "ttl": ("7.5", 7.5),
    "fetch_concurrency": ("3", 3),
    "upload_concurrency": ("3", 3),
    "upload_while_writing": ("off", "off"),
    "part_size": ("32MiB", 32 * MiB),
    "range_size": ("4MiB", 4 * MiB),
    "lock_timeout": ("12", 12.0),
    "retries": ("7", 7),
    "connect_timeout": ("2.5", 2.5),
    "read_timeout": ("30", 30.0),
    "file_mode": ("640", 0o640),
    "write_mode": ("through", "through"),
    "write_tier": ("local", "local"),  # "shared" needs shared_dir, at its default None
    "dirty_max_bytes": ("512MB", 512 * 10**6),
    "upload_workers": ("5", 5),
    "upload_deadline": ("3600", 3600.0),
    "commit_marker": ("_COMMITTED", "_COMMITTED"),
    "exit_flush_timeout": ("5", 5.0),
    "keep_checkpoints": ("0", 0),
    "verify": ("always", "always"),
    "shared_dir": ("/tmp/tiercache-fields/shared", "/tmp/tiercache-fields/shared"),
    "shared_max_bytes": ("50GiB", 50 * GiB),
    "shared_policy": ("serve", "serve"),
    "shared_auth": ("trust", "trust"),
    "shared_file_mode": ("0o660", 0o660),
    "host_id": ("node-7", "node-7"),
    "lease_stale_after": ("45", 45.0),
    "high_watermark": ("0.97", 0.97),  # above low_watermark's default (0.95)
    "low_watermark": ("0.5", 0.5),
    "min_free_bytes": ("20GiB", 20 * GiB),
    "block_threshold": ("2GiB", 2 * GiB),
    "block_size": ("8MiB", 8 * MiB),
    "range_first_above": ("32MiB", 32 * MiB),
    "whole_object_after": ("0.25", 0.25),
    "readahead_blocks": ("16", 16),
    "prefetch_workers": ("8", 8),
    "readahead": ("10", 10),
    "prefetch_window_bytes": ("1GiB", GiB),
}

# A value each option must refuse, spelled as a string.
INVALID: dict[str, str] = {
    "local_dir": "",
    "local_max_bytes": "lots",
    "consistency": "sometimes",
    "ttl": "soon",
    "fetch_concurrency": "three",
    "upload_concurrency": "three",
    "upload_while_writing": "sometimes",
    "part_size": "1KiB",  # below S3's 5 MiB minimum part
    "range_size": "1KiB",
    "lock_timeout": "forever",
    "retries": "2.5",
    "connect_timeout": "fast",
    "read_timeout": "-1",
    "file_mode": "rw-r-----",
    "write_mode": "sideways",
    "write_tier": "nvme",
    "dirty_max_bytes": "12 parsecs",
    "upload_workers": "many",
    "upload_deadline": "tomorrow",
    "commit_marker": "dir/.metadata",
    "exit_flush_timeout": "later",
    "keep_checkpoints": "two",
    "verify": "never",
    "shared_dir": "",
    "shared_max_bytes": "-5GiB",
    "shared_policy": "hoard",
    "shared_auth": "nobody",
    "shared_file_mode": "0o999",
    "host_id": "",
    "lease_stale_after": "stale",
    "high_watermark": "high",
    "low_watermark": "low",
    "min_free_bytes": "some",
    "block_threshold": "1.5.0GiB",
    "block_size": "big",
    "range_first_above": "lots",
    "whole_object_after": "half",
    "readahead_blocks": "4 blocks",
    "prefetch_workers": "0x8",
    "readahead": "ahead",
    "prefetch_window_bytes": "a window",
}

SIZE_FIELDS = [name for name in FIELDS if config_module.OPTION_KINDS[name] == "size"]


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ``TIERCACHE_*`` variable or user config file of the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("TIERCACHE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))


def _from_environment(name: str, text: str) -> TierCacheConfig:
    return TierCacheConfig.from_options({}, environ={"TIERCACHE_" + name.upper(): text})


def _from_file(tmp_path: Path, name: str, text: str) -> TierCacheConfig:
    path = tmp_path / "config.toml"
    path.write_text(f"[tiercache]\n{name} = {json.dumps(text)}\n")  # a JSON string is TOML too
    settings = load_config(str(path), environ={})
    assert settings.tiercache == {name: text}
    return TierCacheConfig.from_options(tier_options(settings, {}, environ={}), environ={})


def _command_flags() -> dict[str, tuple[argparse.ArgumentParser, str, list[str]]]:
    """Each option some subcommand has a flag for: a parser that has it, the flag, and
    placeholders for the parser's required positional arguments."""
    found: dict[str, tuple[argparse.ArgumentParser, str, list[str]]] = {}
    for command in COMMANDS:
        parser = argparse.ArgumentParser(prog=command.NAME)
        command.add_arguments(parser)
        actions = parser._actions  # argparse offers no public list of a parser's arguments
        positionals = ["s3://bucket/x" for a in actions if not a.option_strings and a.nargs is None]
        for action in actions:
            if action.dest in FIELDS and action.option_strings:
                found.setdefault(action.dest, (parser, action.option_strings[-1], positionals))
    return found


CLI_FLAGS = _command_flags()


def _from_flag(name: str, text: str) -> TierCacheConfig:
    parser, flag, positionals = CLI_FLAGS[name]
    args = parser.parse_args([*positionals, f"{flag}={text}"])  # "=": text may start with "-"
    return common.config_from_args(args)


def test_every_option_has_a_kind_and_test_values() -> None:
    assert set(config_module.OPTION_KINDS) == set(FIELDS)
    assert set(VALID) == set(FIELDS)
    assert set(INVALID) == set(FIELDS)


def test_an_option_without_a_kind_fails_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = dict(config_module.OPTION_KINDS)
    del kinds["shared_max_bytes"]
    monkeypatch.setattr(config_module, "OPTION_KINDS", MappingProxyType(kinds))
    with pytest.raises(TypeError, match="shared_max_bytes"):
        config_module._check_option_kinds()


@pytest.mark.parametrize("name", FIELDS)
def test_valid_value_from_the_environment(name: str) -> None:
    text, expected = VALID[name]
    assert getattr(_from_environment(name, text), name) == expected


@pytest.mark.parametrize("name", FIELDS)
def test_invalid_value_from_the_environment_names_the_option(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        _from_environment(name, INVALID[name])


@pytest.mark.parametrize("name", FIELDS)
def test_valid_value_from_the_config_file(tmp_path: Path, name: str) -> None:
    text, expected = VALID[name]
    assert getattr(_from_file(tmp_path, name, text), name) == expected


@pytest.mark.parametrize("name", FIELDS)
def test_invalid_value_from_the_config_file_names_the_option(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        _from_file(tmp_path, name, INVALID[name])


def test_the_command_line_has_the_expected_option_flags() -> None:
    expected = {"local_dir", "local_max_bytes", "shared_dir", "shared_max_bytes", "consistency"}
    assert expected <= set(CLI_FLAGS)
    for name, (_, flag, _) in CLI_FLAGS.items():
        # common.tier_options forwards flags by dest: the dest must be the option it sets.
        assert flag == "--" + name.replace("_", "-")


@pytest.mark.parametrize("name", sorted(CLI_FLAGS))
def test_valid_value_from_the_command_line(name: str) -> None:
    text, expected = VALID[name]
    assert getattr(_from_flag(name, text), name) == expected


@pytest.mark.parametrize("name", sorted(CLI_FLAGS))
def test_invalid_value_from_the_command_line_is_refused(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = CLI_FLAGS[name][1]
    try:
        _from_flag(name, INVALID[name])
    except ConfigError as exc:
        assert name in str(exc)
    except SystemExit as exc:  # argparse refuses a flag with fixed choices itself
        assert exc.code == 2 and flag in capsys.readouterr().err
    else:
        pytest.fail(f"{flag} {INVALID[name]!r} was accepted")


@pytest.mark.parametrize("name", SIZE_FIELDS)
@pytest.mark.parametrize(
    ("text", "size"), [("512MB", 512 * 10**6), ("512MiB", 512 * MiB), ("536870912", 512 * MiB)]
)
def test_size_options_take_units_and_plain_integers(
    tmp_path: Path, name: str, text: str, size: int
) -> None:
    assert getattr(_from_environment(name, text), name) == size
    assert getattr(_from_file(tmp_path, name, text), name) == size
    if name in CLI_FLAGS:
        assert getattr(_from_flag(name, text), name) == size


def test_sizes_beyond_float_precision_stay_exact() -> None:
    config = _from_environment("shared_max_bytes", "9007199254740993")
    assert config.shared_max_bytes == 2**53 + 1


def test_environment_errors_name_the_variable_too() -> None:
    with pytest.raises(ConfigError, match=r"shared_max_bytes \(TIERCACHE_SHARED_MAX_BYTES\)"):
        _from_environment("shared_max_bytes", "lots")


@pytest.mark.parametrize("name", sorted(config_module.OFF_WITH_NONE))
def test_none_turns_off_what_defaults_to_on(name: str) -> None:
    assert getattr(TierCacheConfig.from_options({}, environ={}), name) is not None
    assert getattr(TierCacheConfig.from_options({name: None}, environ={}), name) is None
    for text in ("none", "Off"):
        env = {"TIERCACHE_" + name.upper(): text}
        assert getattr(TierCacheConfig.from_options({}, environ=env), name) is None
