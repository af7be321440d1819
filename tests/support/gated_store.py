"""``GatedStore``: an in-memory store whose uploads wait for a gate, so writes stay pending."""

from __future__ import annotations

import threading
from typing import Any

from tiercache.store.memory import MemoryStore


class GatedStore(MemoryStore):
    """Uploads (whole, single-part or multipart) wait until ``gate`` is set, at most
    ``at_most`` seconds (None: for ever); the writes stay pending in the journal meanwhile."""

    def __init__(self, at_most: float | None = 30.0) -> None:
        super().__init__(buckets=("b",))
        self.gate = threading.Event()
        self._at_most = at_most

    def upload_file(self, *args: Any, **kwargs: Any) -> Any:
        self.gate.wait(self._at_most)
        return super().upload_file(*args, **kwargs)

    def put_bytes(self, *args: Any, **kwargs: Any) -> Any:
        self.gate.wait(self._at_most)
        return super().put_bytes(*args, **kwargs)

    def create_multipart(self, *args: Any, **kwargs: Any) -> Any:
        self.gate.wait(self._at_most)
        return super().create_multipart(*args, **kwargs)
