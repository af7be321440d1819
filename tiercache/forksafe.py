"""Fork safety: objects that hold locks, clients or threads reset themselves in a forked child.

PyTorch's DataLoader forks workers. A lock held by another thread at the moment of ``fork``
stays locked forever in the child, and a boto3 client must not be shared across processes,
so every such object registers here and gets ``after_fork()`` called in the child.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class ForkAware(Protocol):
    def after_fork(self) -> None:
        """Drop per-process state (locks, clients, in-flight tables) in a forked child."""
        ...


_objects: weakref.WeakSet[ForkAware] = weakref.WeakSet()
_registry_lock = threading.Lock()


def register(obj: ForkAware) -> None:
    """Call ``obj.after_fork()`` in every child forked from now on."""
    with _registry_lock:
        _objects.add(obj)


class LazyPool:
    """A thread pool made on first use; a forked child makes its own (the parent's threads do
    not exist there, so the parent's pool would take work and never run it)."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers = workers
        self._name = name
        self.after_fork()
        register(self)

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., T], /, *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on the pool (RuntimeError once the interpreter is shutting down)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix=self._name)
            pool = self._pool
        return pool.submit(fn, *args)


def _reset_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for obj in list(_objects):
        obj.after_fork()


os.register_at_fork(after_in_child=_reset_in_child)
