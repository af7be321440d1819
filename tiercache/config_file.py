"""Settings from a TOML file: a ``[tiercache]`` table of cache options and an ``[s3]`` table.

The file is ``--config PATH``, else ``$TIERCACHE_CONFIG``, else
``$XDG_CONFIG_HOME/tiercache/config.toml`` (``~/.config/tiercache/config.toml``) when it exists.
Precedence, highest first: command-line flags (or keyword arguments), environment variables
(``TIERCACHE_*``; ``AWS_*`` for the store), this file, built-in defaults.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError
from tiercache.store.endpoint import redact_endpoint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib
    tomllib = None

# Store options the file may set, with the environment variables that override each (boto3
# reads those itself, so a file value is passed only when they are unset).
S3_KEYS: dict[str, tuple[str, ...]] = {
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "profile": ("AWS_PROFILE",),
    "key": ("AWS_ACCESS_KEY_ID",),
    "secret": ("AWS_SECRET_ACCESS_KEY",),
    "token": ("AWS_SESSION_TOKEN",),
    "addressing_style": (),
    "anon": (),
    "verify": (),
}
SECRET_KEYS = frozenset({"key", "secret", "token"})
TIERCACHE_KEYS = frozenset(f.name for f in dataclasses.fields(TierCacheConfig))


@dataclass(frozen=True)
class FileSettings:
    """The tables of one config file (empty when there is no file)."""

    path: str | None = None
    tiercache: Mapping[str, Any] = field(default_factory=dict)
    s3: Mapping[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """What may be shown: secrets replaced by ``"***"``."""
        s3 = {k: ("***" if k in SECRET_KEYS else v) for k, v in self.s3.items()}
        if isinstance(s3.get("endpoint_url"), str):  # refused when used, but never shown
            s3["endpoint_url"] = redact_endpoint(s3["endpoint_url"])
        return {"path": self.path, "tiercache": dict(self.tiercache), "s3": s3}


def default_path(environ: Mapping[str, str]) -> str:
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return str(Path(base) / "tiercache" / "config.toml")


def find_config(explicit: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The file to read and where its name came from (None: no file)."""
    if explicit:
        return explicit, "--config"
    if environ.get("TIERCACHE_CONFIG"):
        return environ["TIERCACHE_CONFIG"], "TIERCACHE_CONFIG"
    path = default_path(environ)
    return (path, "default") if os.path.exists(path) else (None, "default")


def load_config(
    explicit: str | None = None, environ: Mapping[str, str] | None = None
) -> FileSettings:
    """Read and check the config file; unknown tables or keys are a ``ConfigError``."""
    environ = os.environ if environ is None else environ
    path, origin = find_config(explicit, environ)
    if path is None:
        return FileSettings()
    if tomllib is None:
        raise ConfigError(f"config file {path}: reading TOML needs Python 3.11 or newer")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} (from {origin}) does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"tiercache", "s3"})
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown table or key {unknown[0]!r} (known: [tiercache], [s3])"
        )
    tiers = _table(data, "tiercache", path, TIERCACHE_KEYS)
    s3 = _table(data, "s3", path, frozenset(S3_KEYS))
    return FileSettings(path, tiers, s3)


def _table(data: Mapping[str, Any], name: str, path: str, known: frozenset[str]) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [{name}] must be a table")
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown key {unknown[0]!r} in [{name}] "
            f"(known: {', '.join(sorted(known))})"
        )
    return dict(table)


def tier_options(
    settings: FileSettings, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Options for ``TierCacheConfig.from_options``: flags, then file values the environment
    does not set (``from_options`` itself puts the environment above the defaults)."""
    environ = os.environ if environ is None else environ
    options = {
        key: value
        for key, value in settings.tiercache.items()
        if "TIERCACHE_" + key.upper() not in environ
    }
    options.update({k: v for k, v in flags.items() if v is not None})
    return options


def store_options(
    settings: FileSettings, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """s3 options: flags, then file values whose environment variables are unset."""
    environ = os.environ if environ is None else environ
    options = {
        key: value
        for key, value in settings.s3.items()
        if not any(environ.get(name) for name in S3_KEYS[key])
    }
    if ("key" in options) != ("secret" in options):
        options.pop("key", None)  # the other half comes from the environment: use the pair there
        options.pop("secret", None)
    options.update({k: v for k, v in flags.items() if v is not None})
    return options
