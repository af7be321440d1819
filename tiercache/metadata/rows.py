"""Listing rows (fsspec ``info``/``ls`` dicts): store objects merged with pending writes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from tiercache.store.base import ListEntry, ObjectInfo, ObjectStore


def directory_row(name: str) -> dict[str, Any]:
    """The row of a bucket or a directory (a prefix with keys below it)."""
    return {"name": name, "type": "directory", "size": 0}


def file_row(info: ObjectInfo, cached: bool) -> dict[str, Any]:
    """The row of one object the store (or a tier) described."""
    return {
        "name": f"{info.bucket}/{info.key}",
        "type": "file",
        "size": info.size,
        "ETag": info.etag,
        "mtime": info.last_modified,
        "cached": cached,
    }


def entry_row(entry: ListEntry) -> dict[str, Any]:
    """The row of one entry of a store listing (an object or a common prefix)."""
    if entry.type == "directory":
        return directory_row(f"{entry.bucket}/{entry.key}")
    return {
        "name": f"{entry.bucket}/{entry.key}",
        "type": "file",
        "size": entry.size,
        "ETag": entry.etag,
        "mtime": entry.last_modified,
    }


def store_rows(
    store: ObjectStore, bucket: str, prefix: str, recursive: bool
) -> list[dict[str, Any]]:
    """The store's rows under ``prefix``: the level below it (``ls``: objects and common
    prefixes, without the prefix's own marker object), or every object (``find``: without the
    zero-byte "directory marker" objects)."""
    if recursive:
        entries = store.list_objects(bucket, prefix, None)
        return [entry_row(e) for e in entries if not e.key.endswith("/")]
    return [entry_row(e) for e in store.list_objects(bucket, prefix, "/") if e.key != prefix]


def merge_rows(listed: list[dict[str, Any]], pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Store rows plus pending writes; a pending file replaces the stored one of its name."""
    merged = {(r["name"], r["type"]): r for r in listed}
    for row in pending:
        merged[(row["name"], row["type"])] = row
    return list(merged.values())


def add_parent_dirs(found: dict[str, dict[str, Any]], root: str, name: str) -> None:
    """Add the directories between ``root`` and ``name`` to ``found`` (``find(withdirs)``)."""
    parent = name.rsplit("/", 1)[0]
    while len(parent) > len(root) and parent not in found:
        found[parent] = {"name": parent, "type": "directory", "size": 0}
        parent = parent.rsplit("/", 1)[0]


class PendingWrite(Protocol):
    """A write not yet in the store, as a listing shows it (``write/state.Record``)."""

    @property
    def key(self) -> str: ...

    @property
    def size(self) -> int: ...


def pending_rows(
    records: Iterable[PendingWrite], bucket: str, prefix: str, nested: bool
) -> list[dict[str, Any]]:
    """Rows for pending writes under ``prefix``: files, or (not ``nested``) their directories."""
    rows = []
    for record in records:
        rest = record.key[len(prefix) :]
        if not nested and "/" in rest:
            name = f"{bucket}/{prefix}{rest.split('/', 1)[0]}"
            rows.append({"name": name, "type": "directory", "size": 0})
        else:
            rows.append(
                {
                    "name": f"{bucket}/{record.key}",
                    "type": "file",
                    "size": record.size,
                    "pending": True,
                }
            )
    return rows
