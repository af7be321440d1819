"""``SharedTier``: a tier on a filesystem many hosts mount (GPFS, Lustre, NFS, CephFS).

Same layout and entry format as ``LocalTier`` (per-entry files named by hash, no index file
everybody rewrites, publish by temp + rename), with what many hosts need on top:

- entry locks are leases (``tiers/lease.py``): a lock file naming owner host and pid, kept
  alive by a heartbeat, broken by the others when its owner died;
- each fetch writes its own part file (``<id>.part.<token>``), so a fetch that lost its lease
  to a taker-over never writes into the new owner's file, and a part is never served to
  another process: only a published entry is;
- entries are published durably (data, meta and directory fsynced): another host cannot tell
  that the publisher lost power, so the boot-id check of the local tier does not apply;
- the budget is kept per host: a host's processes count each other's fetches in flight
  through a ledger on node-local disk (``tiers/ledger.py``; its shared memory and ``flock``
  are no use across hosts), in the local tier's directory. Another host's fetches in flight
  count once published, when a scan finds them: all hosts together may pass the budget by
  what the other hosts are fetching at that moment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

from tiercache.config import TierCacheConfig
from tiercache.tiers.entry import CachedEntry, EntryMeta, EntryPaths
from tiercache.tiers.lease import LeaseLock
from tiercache.tiers.ledger import Ledger, ProcessLedger, ledger_at
from tiercache.tiers.local import LocalTier, create_exclusive, entry_files, remove_file


@dataclasses.dataclass(frozen=True)
class _Held:
    token: str


class SharedTier(LocalTier):
    """A cache tier on a shared POSIX filesystem used by many hosts at once."""

    name = "shared"

    def __init__(
        self,
        root: str,
        max_bytes: int,
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
        *,
        host_id: str | None = None,
        stale_after: float = 30.0,
        high_watermark: float = 1.0,
        low_watermark: float = 0.95,
        min_free_bytes: int = 0,
        ledger: Ledger | None = None,
    ):
        """``ledger``: where this host's processes count their fetches in flight (see the
        module docstring; ``shared_tier_of`` gives one on node-local disk); default: this
        process alone."""
        super().__init__(
            root,
            max_bytes,
            file_mode,
            dir_mode,
            high_watermark=high_watermark,
            low_watermark=low_watermark,
            min_free_bytes=min_free_bytes,
            ledger=ledger or ProcessLedger(),
        )
        self.leases = LeaseLock(host_id, stale_after, file_mode)
        # The umask would strip the group bits a tier shared by a group of users needs.
        for path in (self.root, self.objects_dir, self.staging_dir):
            _set_mode(path, dir_mode)

    def _make_shard(self, shard: str) -> os.stat_result:
        st = super()._make_shard(shard)
        if st.st_mode & 0o7777 != self.dir_mode:  # the umask took group bits away
            with contextlib.suppress(PermissionError):  # another user's: left as it is
                os.chmod(shard, self.dir_mode)
        return st

    @property
    def host_id(self) -> str:
        return self.leases.host

    @contextmanager
    def entry_lock(self, entry_id: str, timeout: float) -> Iterator[EntryPaths]:
        """Hold the entry's lease; the paths name a part file of this holder alone."""
        paths = self.paths(entry_id)
        token = self.leases.acquire(paths.lock, timeout, "fetching the same object")
        try:
            yield dataclasses.replace(paths, part=f"{paths.part}.{token}")
        finally:
            self.leases.release(paths.lock, token)

    def invalidate(self, entry_id: str, timeout: float) -> None:
        """Drop an entry; no lease is taken when nothing is cached and nobody holds one.

        Every write invalidates the shared copy of its object: most have none, and a lease
        costs a file, an fsync and a heartbeat. A fetch holds the lease from before its GET
        until it published, so an absent lease file and absent entry files mean none runs.
        """
        if self._anything_there(entry_id):
            super().invalidate(entry_id, timeout)

    def drop_clean(self, entry_id: str, timeout: float) -> None:
        """As ``LocalTier.drop_clean``; no lease is taken when nothing is there (see
        ``invalidate``)."""
        if self._anything_there(entry_id):
            super().drop_clean(entry_id, timeout)

    def _anything_there(self, entry_id: str) -> bool:
        """An entry file or a lease of the entry exists (a fetch may be running)."""
        paths = self.paths(entry_id)
        return any(os.path.lexists(path) for path in (paths.lock, *entry_files(paths)))

    def create_part(self, paths: EntryPaths) -> int:
        """Create this holder's part file; parts left by dead fetchers of the entry go."""
        base = paths.part.rsplit(".", 1)[0]
        for stale in glob.glob(glob.escape(base) + ".*"):
            if stale != paths.part:
                remove_file(stale)
        return create_exclusive(paths.part, self.file_mode)

    def publish(
        self,
        paths: EntryPaths,
        fd: int,
        meta: EntryMeta,
        src: str | None = None,
        durable: bool = False,
        keep_src: bool = False,
        prepared_meta: str | None = None,
        meta_absent: bool = False,
        reserved: int = 0,
    ) -> CachedEntry:
        if not durable:  # a fetched entry; ``durable`` bytes were fsynced by their writer
            os.fsync(fd)
        return super().publish(
            paths, fd, meta, src, True, keep_src, prepared_meta, meta_absent, reserved
        )

    def needs_check(self, entry: CachedEntry) -> bool:
        return False  # published durably: see the module docstring

    def _try_entry_lock(self, paths: EntryPaths) -> object | None:
        self.leases.break_if_stale(paths.lock)  # a dead fetcher's lease must not pin an entry
        token = self.leases.try_acquire(paths.lock)
        return None if token is None else _Held(token)

    def _release_entry_lock(self, paths: EntryPaths, held: object, removed: bool) -> None:
        assert isinstance(held, _Held)
        self.leases.release(paths.lock, held.token)

    def _remove_parts(self, paths: EntryPaths) -> int:
        freed = 0
        for part in glob.glob(glob.escape(paths.part) + "*"):
            with contextlib.suppress(FileNotFoundError):
                freed += os.stat(part, follow_symlinks=False).st_size
                os.unlink(part)
        return freed


def shared_tier_of(config: TierCacheConfig) -> SharedTier | None:
    """The shared tier ``config`` names (None without ``shared_dir``)."""
    if config.shared_dir is None:
        return None
    file_mode, dir_mode = config.shared_modes
    return SharedTier(
        config.shared_dir,
        config.shared_max_bytes,
        file_mode,
        dir_mode,
        host_id=config.host_id,
        stale_after=config.lease_stale_after,
        high_watermark=config.high_watermark,
        low_watermark=config.low_watermark,
        min_free_bytes=config.min_free_bytes,
        ledger=_host_ledger(config),
    )


def _host_ledger(config: TierCacheConfig) -> Ledger | None:
    """This host's ledger of the shared tier, in the local tier's directory (node-local
    disk), one per shared directory; None (this process alone) where there is no such
    directory yet (a command that uses the shared tier alone)."""
    assert config.shared_dir is not None
    local = os.path.realpath(config.local_dir)  # as ``LocalTier`` resolves it
    if not os.path.isdir(local):
        return None
    shared = os.path.realpath(config.shared_dir).encode("utf-8", "surrogateescape")
    name = f"shared-ledger-{hashlib.sha256(shared).hexdigest()[:16]}"
    return ledger_at(os.path.join(local, name), config.file_mode)


def _set_mode(path: str, mode: int) -> None:
    """Give a directory exactly ``mode`` if this user owns it (others' are left as they are)."""
    with contextlib.suppress(PermissionError):
        if os.stat(path).st_mode & 0o7777 != mode:
            os.chmod(path, mode)
