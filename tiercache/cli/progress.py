"""A one-line progress bar on stderr: items, bytes, rate and ETA; silent when not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tiercache.cli.common import human_bytes

_REDRAW_SECONDS = 0.2


class ProgressBar:
    """Progress of work measured in items and bytes (either total may be unknown: 0)."""

    def __init__(
        self,
        label: str,
        total_items: int = 0,
        total_bytes: int = 0,
        stream: TextIO | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.label = label
        self.total_items = total_items
        self.total_bytes = total_bytes
        self.items = 0
        self.bytes = 0
        self._stream = stream or sys.stderr
        self._enabled = self._stream.isatty() if enabled is None else enabled
        self._started = time.monotonic()
        self._drawn = 0.0
        self._width = 0

    def set_totals(self, items: int, nbytes: int) -> None:
        self.total_items, self.total_bytes = items, nbytes
        self._draw(force=True)

    def update(self, items: int = 0, nbytes: int = 0) -> None:
        """Add finished items and bytes."""
        self.items += items
        self.bytes += nbytes
        self._draw()

    def set(self, items: int, nbytes: int) -> None:
        """Set the absolute progress."""
        self.items, self.bytes = items, nbytes
        self._draw()

    def close(self) -> None:
        self._draw(force=True)
        if self._enabled:
            self._stream.write("\n")
            self._stream.flush()

    def line(self) -> str:
        """The text of the bar as it stands."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self.bytes / elapsed
        parts = [self.label]
        if self.total_bytes:
            done = min(1.0, self.bytes / self.total_bytes)
            filled = int(done * 20)
            parts.append(f"[{'#' * filled}{'.' * (20 - filled)}] {done:4.0%}")
        items = f"{self.items}/{self.total_items}" if self.total_items else f"{self.items}"
        parts.append(f"{items} objects")
        sizes = human_bytes(self.bytes)
        if self.total_bytes:
            sizes += f" of {human_bytes(self.total_bytes)}"
        parts.append(sizes)
        parts.append(f"{human_bytes(rate)}/s")
        if self.total_bytes and rate > 0 and self.bytes < self.total_bytes:
            parts.append(f"ETA {(self.total_bytes - self.bytes) / rate:,.0f} s")
        return "  ".join(parts)

    def _draw(self, force: bool = False) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if not force and now - self._drawn < _REDRAW_SECONDS:
            return
        self._drawn = now
        text = self.line()
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        self._stream.write(f"\r{text}{pad}")
        self._stream.flush()
