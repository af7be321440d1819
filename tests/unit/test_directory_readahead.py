"""The mount's directory read-ahead (``DirectoryReadAhead``): one listing per directory."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tiercache.mount.readahead import DirectoryReadAhead


class FakeOrder:
    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.opened_paths: list[str] = []
        self.closed = False

    def opened(self, path: str) -> None:
        self.opened_paths.append(path)

    def close(self) -> None:
        self.closed = True


class FakeFs:
    """``ls`` that takes a while (a LIST 30 ms away) and counts its calls."""

    def __init__(self, names: list[str], delay: float) -> None:
        self.names = names
        self.delay = delay
        self.listings = 0
        self.lock = threading.Lock()
        self.orders: list[FakeOrder] = []

    def ls(self, path: str, detail: bool = True) -> list[dict[str, Any]]:
        with self.lock:
            self.listings += 1
        time.sleep(self.delay)
        return [{"name": f"{path}/{n}", "type": "file"} for n in self.names]

    def read_ahead(self, files: list[str], k: int) -> FakeOrder:
        order = FakeOrder(files)
        self.orders.append(order)
        return order


def test_readers_opening_one_directory_together_make_one_listing() -> None:
    names = [f"{i:05d}" for i in range(64)]
    fs = FakeFs(names, delay=0.2)
    readahead = DirectoryReadAhead(fs, "bucket/data", k=4)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: readahead.opened(f"/{n}", 1), names[:16]))
    assert fs.listings == 1
    assert len(fs.orders) == 1
    # Later opens go to that order.
    readahead.opened(f"/{names[20]}", 1)
    assert fs.listings == 1
    assert fs.orders[0].opened_paths[-1] == f"bucket/data/{names[20]}"
    readahead.close()
    assert fs.orders[0].closed


def test_a_failed_listing_is_tried_again_at_the_next_open() -> None:
    class Refusing(FakeFs):
        def ls(self, path: str, detail: bool = True) -> list[dict[str, Any]]:
            if self.listings == 0:
                self.listings += 1
                raise OSError(5, "refused")
            return super().ls(path, detail)

    fs = Refusing(["a", "b"], delay=0.0)
    readahead = DirectoryReadAhead(fs, "bucket", k=2)
    readahead.opened("/a", 1)
    assert not fs.orders
    readahead.opened("/b", 1)
    assert fs.listings == 2
    assert len(fs.orders) == 1
