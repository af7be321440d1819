"""The TOML config file: where it is found, what it may hold, and its place in the precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache.config import TierCacheConfig
from tiercache.config_file import load_config, store_options, tier_options
from tiercache.errors import ConfigError


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_precedence_flags_environment_file_defaults(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "c.toml",
        '[tiercache]\nlocal_dir = "/from/file"\nttl = 5\nconsistency = "always"\n',
    )
    settings = load_config(path, environ={})
    environ = {"TIERCACHE_TTL": "7"}
    options = tier_options(settings, {"consistency": "immutable"}, environ)
    config = TierCacheConfig.from_options(options, environ)
    assert config.local_dir == "/from/file"  # file over default
    assert config.ttl == 7.0  # environment over file
    assert config.consistency == "immutable"  # flag over both
    assert config.retries == TierCacheConfig().retries  # default


def test_found_through_the_environment_or_the_default_location(tmp_path: Path) -> None:
    named = _write(tmp_path / "named.toml", "[tiercache]\nretries = 3\n")
    assert load_config(None, {"TIERCACHE_CONFIG": named}).tiercache == {"retries": 3}
    home = tmp_path / "xdg" / "tiercache"
    home.mkdir(parents=True)
    _write(home / "config.toml", "[tiercache]\nretries = 4\n")
    found = load_config(None, {"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert found.tiercache == {"retries": 4} and found.path == str(home / "config.toml")
    assert load_config(None, {"XDG_CONFIG_HOME": str(tmp_path / "none")}).path is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[tiercache]\nlocal_dri = "x"\n', "'local_dri'"),
        ('[s3]\npassword = "x"\n', "'password'"),
        ('[cache]\nlocal_dir = "x"\n', "'cache'"),
        ("[tiercache\n", "not valid TOML"),
    ],
)
def test_unknown_keys_and_bad_files_name_the_key_and_file(
    tmp_path: Path, text: str, named: str
) -> None:
    path = _write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert named in str(caught.value) and path in str(caught.value)


def test_store_table_yields_to_aws_variables_and_hides_secrets(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "s.toml",
        '[s3]\nendpoint_url = "http://file:9000"\nkey = "AKFILE"\nsecret = "file-secret"\n',
    )
    settings = load_config(path, environ={})
    assert store_options(settings, {}, {}) == {
        "endpoint_url": "http://file:9000",
        "key": "AKFILE",
        "secret": "file-secret",
    }
    # The environment's credentials win as a pair; its endpoint wins over the file's.
    environ = {"AWS_ACCESS_KEY_ID": "AKENV", "AWS_ENDPOINT_URL": "http://env:9000"}
    assert store_options(settings, {}, environ) == {}
    assert store_options(settings, {"endpoint_url": "http://flag:1"}, environ) == {
        "endpoint_url": "http://flag:1"
    }
    shown = repr(settings.public())
    assert "file-secret" not in shown and "AKFILE" not in shown
