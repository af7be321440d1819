"""A tiercache process on one CephFS "host": builds its filesystem, then runs JSON commands."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import sys
import time
from typing import Any

from tiercache import TierCacheFileSystem

# Replies go to the real stdout, marked, so nothing else printed there is taken for one.
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
sys.stdout = sys.stderr
MARK = "@@reply "


def _reply(message: dict[str, Any]) -> None:
    _OUT.write(MARK + json.dumps(message, default=str) + "\n")


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__]}


class Host:
    """The commands the tests send; each returns a JSON-able dict."""

    def __init__(self, fs: TierCacheFileSystem) -> None:
        self.fs = fs
        self.files: dict[str, Any] = {}

    def cat(self, paths: list[str]) -> dict[str, Any]:
        """Read whole objects; reply once this process's fetches have published."""
        digests = {p: hashlib.sha256(self.fs.cat_file(p)).hexdigest() for p in paths}
        self.fs.wait_fetches()
        return {"sha256": digests}

    def find(self, path: str) -> dict[str, Any]:
        """List every object under a prefix; how many there are."""
        return {"count": len(self.fs.find(path))}

    def write(self, path: str, data: str) -> dict[str, Any]:
        """Write an object and wait until it is in the store."""
        with self.fs.open(path, "wb") as f:
            f.write(data.encode())
        self.fs.flush(path)
        return {}

    def write_behind(self, sizes: dict[str, int]) -> dict[str, Any]:
        """Write random objects behind (no flush); reply once every close() returned."""
        digests = {}
        for path, size in sizes.items():
            sha = hashlib.sha256()
            with self.fs.open(path, "wb") as f:
                left = size
                while left:
                    chunk = os.urandom(min(left, 8 << 20))
                    f.write(chunk)
                    sha.update(chunk)
                    left -= len(chunk)
            digests[path] = sha.hexdigest()
        return {"sha256": digests}

    def flush(self, seconds: float) -> dict[str, Any]:
        self.fs.flush(timeout=seconds)
        return {}

    def pending(self) -> dict[str, Any]:
        return {"rows": self.fs.pending()}

    def open(self, path: str) -> dict[str, Any]:
        self.files[path] = self.fs.open(path, "rb")
        return {}

    def read(self, path: str, size: int) -> dict[str, Any]:
        data = self.files[path].read(size)
        return {"n": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def close(self, path: str) -> dict[str, Any]:
        self.files.pop(path).close()
        return {}

    def read_loop(self, expected: dict[str, str], rounds: int) -> dict[str, Any]:
        """Read every object ``rounds`` times in random orders; count what went wrong."""
        bad, errors, reads = [], [], 0
        order = list(expected)
        for _ in range(rounds):
            random.shuffle(order)
            for path in order:
                try:
                    with self.fs.open(path, "rb") as f:
                        digest = hashlib.sha256(f.read()).hexdigest()
                except Exception as exc:
                    errors.append(f"{path}: {type(exc).__name__}: {exc}")
                    continue
                reads += 1
                if digest != expected[path]:
                    bad.append(path)
        return {"reads": reads, "bad": bad, "errors": errors}

    def evict(self, tier: str, target: int) -> dict[str, Any]:
        report = self.fs.evict(target, tier=tier)
        return {"removed": report.removed, "kept_busy": report.kept_busy}

    def evict_loop(self, tier: str, count: int, pause: float) -> dict[str, Any]:
        removed = 0
        for _ in range(count):
            removed += len(self.fs.evict(0, tier=tier).removed)
            time.sleep(pause)
        return {"removed": removed}

    def is_cached(self, path: str, tier: str) -> dict[str, Any]:
        return {"cached": self.fs.is_cached(path, tier=tier)}

    def stats(self) -> dict[str, Any]:
        self.fs.wait_fetches()
        stats = self.fs.stats()
        return {**stats, "gets": stats["store_requests"].get("GetObject", 0)}


def main() -> None:
    options = json.loads(sys.stdin.readline())
    fs = TierCacheFileSystem(skip_instance_cache=True, **options)
    host = Host(fs)
    _reply({"host": socket.gethostname(), "pid": os.getpid()})
    for line in sys.stdin:
        command = json.loads(line)
        try:
            result = getattr(host, command.pop("op"))(**command)
        except Exception as exc:
            result = _error(exc)
        _reply(result)


if __name__ == "__main__":
    main()
