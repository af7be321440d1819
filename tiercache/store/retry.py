"""Bounded retries with exponential backoff and full jitter, shared by every store call."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tiercache.errors import StoreUnavailableError

T = TypeVar("T")


class RetryableError(Exception):
    """A failure worth retrying (throttling, 5xx, connection reset, truncated body).

    Raised by store implementations; callers never see it: once the attempts are spent it
    becomes ``StoreUnavailableError``.
    """


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry one request."""

    attempts: int = 5
    base_delay: float = 0.05
    max_delay: float = 5.0

    def delay(self, attempt: int) -> float:
        """Full-jitter backoff before retry number ``attempt`` (1-based)."""
        return random.uniform(0.0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))

    def run(self, operation: Callable[[], T], describe: str) -> T:
        """Call ``operation`` until it succeeds or the attempts are spent."""
        for attempt in range(1, self.attempts + 1):
            try:
                return operation()
            except RetryableError as exc:
                if attempt == self.attempts:
                    raise StoreUnavailableError(
                        f"{describe} failed after {self.attempts} attempts: {exc}"
                    ) from exc
                time.sleep(self.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover
