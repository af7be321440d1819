"""What a prefetch names: an object, a prefix, a glob or a list, turned into (bucket, key, size)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tiercache.errors import ConfigError
from tiercache.prefetch.engine import Target

TIERS = ("local", "shared")
_GLOB_CHARS = "*?["


class Lister(Protocol):
    """The part of the filesystem that expanding a request needs."""

    def split_path(self, path: str) -> tuple[str, str]: ...

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]: ...

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any: ...

    def glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any: ...


def check_tier(tier: str, shared_available: bool = False) -> None:
    """Refuse a tier this cache cannot fill (``shared`` needs a configured shared tier).

    ``ConfigError`` is a ``ValueError``; the command line reports it without a traceback.
    """
    if tier not in TIERS:
        raise ConfigError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
    if tier == "shared" and not shared_available:
        raise ConfigError("tier='shared': this cache has no shared tier configured; use 'local'")


def expand(fs: Lister, paths: str | Sequence[str]) -> list[Target]:
    """Objects in listing order: a glob's matches, a prefix's objects, one object, or a list.

    A list is taken as given (sizes are learnt when a worker reaches each object), so that
    naming a million shards does not cost a million HEADs up front.
    """
    if not isinstance(paths, str):
        return [(*fs.split_path(p), None) for p in paths]
    if any(c in paths for c in _GLOB_CHARS):
        found = fs.glob(paths, detail=True)
        return _files(fs, found)
    info = fs.info(paths)
    if info["type"] == "file":
        return [(*fs.split_path(info["name"]), int(info["size"]))]
    return _files(fs, fs.find(paths, detail=True))


def _files(fs: Lister, found: dict[str, dict[str, Any]]) -> list[Target]:
    return [
        (*fs.split_path(name), int(row["size"]))
        for name, row in sorted(found.items())
        if row.get("type") == "file"
    ]
