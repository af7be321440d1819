"""Fork safety: objects that hold locks, clients or threads reset themselves in a forked child.

PyTorch's DataLoader forks workers. A lock held by another thread at the moment of ``fork``
stays locked forever in the child, and a boto3 client must not be shared across processes,
so every such object registers here and gets ``after_fork()`` called in the child.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Protocol


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


def _reset_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for obj in list(_objects):
        obj.after_fork()


os.register_at_fork(after_in_child=_reset_in_child)
