"""Prefetch: a worker pool that fills the local tier ahead of readers, and read-ahead orders."""

from tiercache.prefetch.engine import Budget, PrefetchEngine, Target
from tiercache.prefetch.handle import PrefetchHandle, PrefetchProgress
from tiercache.prefetch.readahead import ReadAhead

__all__ = ["Budget", "PrefetchEngine", "PrefetchHandle", "PrefetchProgress", "ReadAhead", "Target"]
