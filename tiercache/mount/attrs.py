"""File attributes for the kernel and a short-lived cache of them and of directory listings."""

from __future__ import annotations

import stat
import threading
import time
from dataclasses import dataclass
from typing import Any

# What the kernel is told about block sizes: big blocks make tools such as cp and dd use
# big reads and writes.
BLOCK_SIZE = 1 << 20


@dataclass(frozen=True)
class Attr:
    """What ``getattr`` reports for one path: a file (size, mtime, mode), a directory, or a
    symbolic link (``is_link``: its size is its target's length; see ``links``).

    ``mode`` holds the permission bits set through the mount (``chmod``); None reports the
    default.
    """

    is_dir: bool
    size: int = 0
    mtime_ns: int = 0
    mode: int | None = None
    is_link: bool = False

    def to_stat(self, uid: int, gid: int, writable: bool) -> dict[str, Any]:
        write_bits = 0o200 if writable else 0
        default = (0o555 if self.is_dir else 0o444) | write_bits
        bits = default if self.mode is None else self.mode & 0o7777
        bits = bits if writable else bits & ~0o222
        mode = (stat.S_IFDIR if self.is_dir else stat.S_IFREG) | bits
        if self.is_link:  # a link's own bits are never used: 0777, as Linux reports them
            mode = stat.S_IFLNK | 0o777
        nlink = 2 if self.is_dir else 1
        return {
            "st_mode": mode,
            "st_nlink": nlink,
            "st_size": self.size,
            "st_uid": uid,
            "st_gid": gid,
            "st_blksize": BLOCK_SIZE,
            "st_blocks": (self.size + 511) // 512,
            "st_mtime": self.mtime_ns,
            "st_ctime": self.mtime_ns,
            "st_atime": self.mtime_ns,
        }


DIRECTORY = Attr(is_dir=True, mtime_ns=time.time_ns())  # directories date from the mount


def attr_from_info(info: dict[str, Any]) -> Attr:
    """An ``Attr`` from an fsspec ``info``/``ls`` row."""
    if info.get("type") == "directory":
        return DIRECTORY
    mtime = info.get("mtime")
    mtime_ns = int(float(mtime) * 1e9) if mtime else time.time_ns()
    return Attr(False, int(info.get("size") or 0), mtime_ns)


class AttrCache:
    """Attributes and listings trusted for ``ttl`` seconds; None stands for "does not exist".

    The store answers a stat with a HEAD and a directory with a LIST; tools such as ``ls -l``
    and ``cp -r`` stat every name they list, so a listing fills the cache for its children.
    A child whose attributes a listing cannot tell in full (the metadata of a read-write
    mount's files) keeps its listing row instead, for ``getattr`` to complete.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._attrs: dict[str, tuple[float, Attr | None]] = {}
        self._listings: dict[str, tuple[float, list[str]]] = {}
        self._rows: dict[str, tuple[float, dict[str, Any]]] = {}

    def get(self, path: str) -> tuple[bool, Attr | None]:
        """``(known, attr)``: known is False when the cache has nothing fresh for ``path``."""
        with self._lock:
            hit = self._attrs.get(path)
        if hit is None or time.monotonic() - hit[0] > self.ttl:
            return False, None
        return True, hit[1]

    def put(self, path: str, attr: Attr | None) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            self._attrs[path] = (time.monotonic(), attr)
            self._rows.pop(path, None)

    def listing(self, path: str) -> list[str] | None:
        with self._lock:
            hit = self._listings.get(path)
        if hit is None or time.monotonic() - hit[0] > self.ttl:
            return None
        return hit[1]

    def listed(self, path: str) -> tuple[dict[str, Any] | None, bool]:
        """The row of ``path`` in the last listing of its directory, if that listing did not
        tell all its attributes and nothing forgot it since, and whether it was made less than
        ``ttl`` ago."""
        with self._lock:
            hit = self._rows.get(path)
        if hit is None:
            return None, False
        return hit[1], time.monotonic() - hit[0] <= self.ttl

    def settle(self, path: str, row: dict[str, Any], attr: Attr) -> None:
        """The attributes of a file listed as ``row``, unless forgotten or listed anew since."""
        with self._lock:
            hit = self._rows.get(path)
            if hit is not None and hit[1] is row:
                del self._rows[path]
                self._attrs[path] = (time.monotonic(), attr)

    def put_listing(
        self,
        path: str,
        names: list[str],
        children: dict[str, Attr],
        rows: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """A listing of ``path``: its names, its children's attributes, and the rows of
        children whose attributes it does not tell in full."""
        if self.ttl <= 0:
            return
        now = time.monotonic()
        with self._lock:
            self._listings[path] = (now, names)
            for child, attr in children.items():
                self._attrs[child] = (now, attr)
                self._rows.pop(child, None)
            for child, row in (rows or {}).items():
                self._rows[child] = (now, row)

    def forget(self, path: str) -> None:
        """Drop what is known about ``path`` and the listing of its parent (it changed)."""
        parent = path.rsplit("/", 1)[0] or "/"
        with self._lock:
            self._attrs.pop(path, None)
            self._rows.pop(path, None)
            self._listings.pop(path, None)
            self._listings.pop(parent, None)
