"""Shared by the client tests: options through the counting proxy, and a warm re-read's requests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fsspec
import fsspec.core

from tiercache import TierCacheFileSystem

# The consistency modes a warm re-read is checked in; the ttl is longer than any test.
CONSISTENCY: dict[str, dict[str, Any]] = {
    "immutable": {"consistency": "immutable"},
    "ttl": {"consistency": "ttl", "ttl": 600.0},
}


def store_options(s3: Any, proxy: Any) -> dict[str, Any]:
    """The store's s3fs-style options, with the endpoint moved to the counting proxy."""
    return {**s3.target_options(), "endpoint_url": proxy.url}


def chained_options(s3: Any, proxy: Any, tier: Path, **cache: Any) -> dict[str, Any]:
    """``storage_options`` of a ``tiercache::s3://`` URL (README, "As a chained URL")."""
    return {"s3": store_options(s3, proxy), "tiercache": {"local_dir": str(tier), **cache}}


def filesystem(s3: Any, proxy: Any, tier: Path, **cache: Any) -> TierCacheFileSystem:
    """A tiercache filesystem object through the proxy (README, "As a filesystem")."""
    fs = fsspec.filesystem(
        "tiercache", local_dir=str(tier), target_options=store_options(s3, proxy), **cache
    )
    assert isinstance(fs, TierCacheFileSystem)
    return fs


def writer_options(s3: Any, tier: Path) -> dict[str, Any]:
    """Chained-URL options of a writer that puts its objects straight in the store."""
    return {
        "s3": s3.target_options(),
        "tiercache": {"local_dir": str(tier), "write_mode": "through"},
    }


def settle(url: str, options: dict[str, Any]) -> None:
    """Wait for the fetches of the filesystem a library built from ``url`` (fsspec's instance)."""
    fs, _ = fsspec.core.url_to_fs(url, **options)
    fs.wait_fetches()


def _kind(method: str, target: str) -> str:
    """GET of an object, LIST (a GET on the bucket), HEAD, PUT…"""
    parts = urlsplit(target)
    if method == "GET" and (parts.path.strip("/").count("/") == 0 or "list-type" in parts.query):
        return "LIST"
    return method


@dataclass(frozen=True)
class Requests:
    """Store requests the proxy saw, in order, as (kind, target)."""

    seen: Sequence[tuple[str, str]]

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.seen if k == kind)

    def __str__(self) -> str:
        counts = {k: self.count(k) for k in sorted({k for k, _ in self.seen})}
        listed = "; ".join(f"{k} {t}" for k, t in self.seen)
        return f"{counts or 'none'} [{listed}]"


def requests_during(proxy: Any, action: Callable[[], Any]) -> tuple[Any, Requests]:
    """Run ``action``; return its result and the store requests it made."""
    start = len(proxy.log)
    result = action()
    seen = [(_kind(m, t), t) for m, t, _ in list(proxy.log)[start:]]
    return result, Requests(seen)


def assert_warm(requests: Requests, consistency: str) -> None:
    """A warm re-read: no GET and no HEAD when immutable; within the ttl, no request at all."""
    if consistency == "immutable":
        sent = requests.count("GET") + requests.count("HEAD")
        assert sent == 0, f"warm re-read (immutable) sent GET/HEAD: {requests}"
    else:
        assert not requests.seen, f"warm re-read within the ttl sent requests: {requests}"
