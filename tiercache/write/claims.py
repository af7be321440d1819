"""Upload claims: the one process, on any host, that may change an object in the store now.

A journal on the local tier is used by this host's processes alone: its claims are ``flock``
locks, released by the kernel when their holder dies. A journal on the shared tier is used by
every host that mounts it: its claims are leases (``tiers/lease.py``), kept alive by their
holder's heartbeat and taken over by another host once ``lease_stale_after`` passed without
one, so that a pending write of a host that was lost is uploaded by another.
"""

from __future__ import annotations

import os
import socket
from typing import Protocol

from tiercache.tiers.lease import LeaseLock, LeaseOwner
from tiercache.tiers.local import LocalTier, remove_file
from tiercache.tiers.locks import is_shared_locked, lock, try_lock, unlock
from tiercache.tiers.shared import SharedTier


class Claims(Protocol):
    """Take and give back the claim file of one object's upload."""

    def try_take(self, path: str) -> object | None: ...

    def take(self, path: str, timeout: float) -> object: ...

    def give_back(self, path: str, claim: object) -> None: ...

    def still_held(self, path: str, claim: object) -> bool: ...

    def holder(self, path: str) -> str | None: ...


class HostClaims:
    """Claims among the processes of one host: ``flock`` on the claim file."""

    def __init__(self, mode: int) -> None:
        self._mode = mode

    def try_take(self, path: str) -> object | None:
        return try_lock(path, self._mode)

    def take(self, path: str, timeout: float) -> object:
        return lock(path, self._mode, timeout, "uploading it")

    def give_back(self, path: str, claim: object) -> None:
        """The claim file goes (waiters notice the new inode and retry), then the lock."""
        assert isinstance(claim, int)
        remove_file(path)
        unlock(claim)

    def still_held(self, path: str, claim: object) -> bool:
        return True  # a flock is held until its holder lets it go or dies

    def holder(self, path: str) -> str | None:
        return socket.gethostname() if is_shared_locked(path) else None


class LeaseClaims:
    """Claims among the hosts that mount a shared tier: leases, broken once their holder died."""

    def __init__(self, leases: LeaseLock) -> None:
        self._leases = leases

    def try_take(self, path: str) -> object | None:
        self._leases.break_if_stale(path)
        return self._leases.try_acquire(path)

    def take(self, path: str, timeout: float) -> object:
        return self._leases.acquire(path, timeout, "uploading it")

    def give_back(self, path: str, claim: object) -> None:
        assert isinstance(claim, str)
        self._leases.release(path, claim)

    def still_held(self, path: str, claim: object) -> bool:
        """True while the lease is ours: another host takes it over only once it went stale."""
        owner = LeaseOwner.read(path)
        return owner is not None and owner.token == claim

    def holder(self, path: str) -> str | None:
        if not os.path.exists(path):
            return None
        owner = LeaseOwner.read(path)
        return owner.host if owner is not None else None


def claims_for(tier: LocalTier) -> HostClaims | LeaseClaims:
    """The claims a journal on ``tier`` needs."""
    if isinstance(tier, SharedTier):
        return LeaseClaims(tier.leases)
    return HostClaims(tier.file_mode)
