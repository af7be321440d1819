"""``CacheRuntime``: the store, tier, read path and counters shared by equal filesystems.

fsspec makes one filesystem instance per distinct set of arguments, and a chained URL passes
the object path (``fo``) as an argument, so ``fsspec.open`` of two shards yields two
instances. They must still share one single-flight table, one set of counters and one boto3
client, so the instances are thin and the state lives here, keyed by configuration.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any

from tiercache.checkpoints import CheckpointRegistry, CommitHolds
from tiercache.config import TierCacheConfig, fetch_streams, upload_parts
from tiercache.metadata.cache import MetadataCache
from tiercache.metadata.freshness import Freshness, wall_clock
from tiercache.metadata.revalidate import ListingRevalidator
from tiercache.metadata.shared import Lister, ListingProofs, SharedListings
from tiercache.metrics import publish
from tiercache.prefetch.engine import PrefetchEngine
from tiercache.read.path import ReadPath
from tiercache.stats import Stats
from tiercache.store.base import ObjectStore
from tiercache.store.retry import RetryPolicy
from tiercache.store.s3 import S3Store
from tiercache.store.s3_options import S3Options
from tiercache.tiers.local import LocalTier, make_tier_root
from tiercache.tiers.next_use import NextUse
from tiercache.tiers.shared import SharedTier, shared_tier_of
from tiercache.write.behind import WriteBehind
from tiercache.write.path import WritePath
from tiercache.write.state import WriteState
from tiercache.write.through import WriteThrough
from tiercache.write.uploader import Uploader


@dataclass(frozen=True)
class CacheRuntime:
    """Everything a filesystem instance uses to serve reads and writes."""

    config: TierCacheConfig
    store: ObjectStore
    tier: LocalTier
    shared: SharedTier | None
    read_path: ReadPath
    metadata: MetadataCache
    lister: Lister
    stats: Stats
    write_state: WriteState
    commit_holds: CommitHolds
    uploader: Uploader
    write_behind: WriteBehind
    write_through: WriteThrough
    write_path: WritePath
    prefetch: PrefetchEngine
    # Whether this process may list a prefix, before another host's pending writes under it
    # are merged into a listing (``shared_auth=store``; None: not asked).
    listing_proofs: ListingProofs | None = None


# Weak: a runtime lives as long as some filesystem instance uses it.
_runtimes: weakref.WeakValueDictionary[tuple[Any, ...], CacheRuntime] = (
    weakref.WeakValueDictionary()
)
_runtimes_lock = threading.Lock()


def runtime_for(
    config: TierCacheConfig, s3_options: S3Options | None, store: ObjectStore | None
) -> CacheRuntime:
    """The runtime for this configuration, built on first use."""
    key = (config, s3_options, id(store) if store is not None else None)
    with _runtimes_lock:
        runtime = _runtimes.get(key)
        if runtime is None or (store is not None and runtime.store is not store):
            runtime = _build(config, store or _s3_store(config, s3_options or S3Options()))
            _runtimes[key] = runtime
        return runtime


def _build(config: TierCacheConfig, store: ObjectStore) -> CacheRuntime:
    """Every component, each given its collaborators as it is made (lowest layer first)."""
    stats = Stats()
    make_tier_root(config.local_dir, config.dir_mode, "local_dir")
    root = os.path.realpath(config.local_dir)
    shared = shared_tier_of(config)
    staged_shared = shared if config.write_tier == "shared" else None
    # Markers are held back beside the journal that holds them, for every uploader of it.
    holds = CommitHolds(
        root if staged_shared is None else staged_shared.root,
        config.file_mode if staged_shared is None else staged_shared.file_mode,
        config.dir_mode if staged_shared is None else staged_shared.dir_mode,
        stale_after=config.lease_stale_after if staged_shared is not None else None,
    )
    checkpoints = CheckpointRegistry(
        root, config.keep_checkpoints, config.file_mode, config.dir_mode, holds
    )
    next_use = NextUse(root, stats, config.file_mode, config.dir_mode)
    tier = LocalTier(
        root,
        config.local_max_bytes,
        file_mode=config.file_mode,
        dir_mode=config.dir_mode,
        high_watermark=config.high_watermark,
        low_watermark=config.low_watermark,
        min_free_bytes=config.min_free_bytes,
        stats=stats,
        keep=checkpoints.keeps,
        next_use=next_use,
    )
    staging = staged_shared or tier
    write_state = WriteState(staging, config.lock_timeout)
    clock = wall_clock
    freshness = Freshness(config.consistency, config.ttl, clock)
    shared_listings = None
    proofs = None
    if shared is not None:
        # Group-readable listings another user kept are served once the store let this
        # process's own credentials list the same prefix (``shared_auth``), as bytes are.
        proofs = (
            ListingProofs(store, config.ttl, clock) if config.shared_auth_mode == "store" else None
        )
        shared_listings = SharedListings(
            shared, store.namespace, freshness, config.lock_timeout, proofs
        )
    # This host's own upload changes the listings the other hosts read (its own ls merged
    # the pending write meanwhile).
    on_landed = None if shared_listings is None else partial(_forget_landed, shared_listings)
    uploader = Uploader(config, write_state, store, stats, checkpoints, on_landed)
    write_behind = WriteBehind(config, write_state, uploader, stats, store.namespace)
    metadata = MetadataCache(
        root,
        store.namespace,
        config.consistency,
        config.ttl,
        file_mode=config.file_mode,
        dir_mode=config.dir_mode,
        lock_timeout=config.lock_timeout,
        clock=clock,
        freshness=freshness,
        also_invalidate=None if shared_listings is None else shared_listings.invalidate,
    )
    lister = Lister(store, shared_listings, metadata.now)
    revalidator = ListingRevalidator(
        lister,
        metadata,
        metadata.freshness,
        stats,
        pending_under=lambda bucket, prefix: bool(write_behind.pending(f"{bucket}/{prefix}")),
    )
    read_path = ReadPath(
        config,
        tier,
        store,
        stats,
        shared,
        revalidator,
        pending_write=write_state.pending_entry,
        pending_tier=staging,
    )
    if write_state.record_ids():
        uploader.start()  # finish what a crashed or exited process left in the journal
    write_through = WriteThrough(store, write_state, stats)
    write_path = WritePath(config, tier, uploader, write_behind, write_through, read_path, metadata)
    runtime = CacheRuntime(
        config=config,
        store=store,
        tier=tier,
        shared=shared,
        read_path=read_path,
        metadata=metadata,
        lister=lister,
        stats=stats,
        write_state=write_state,
        commit_holds=holds,
        uploader=uploader,
        write_behind=write_behind,
        write_through=write_through,
        write_path=write_path,
        prefetch=PrefetchEngine(config, read_path, tier, store, stats, next_use),
        listing_proofs=proofs if staging is not tier else None,
    )
    # The node's metrics (``tiercache metrics``) count this cache's work while it lives.
    counters = publish.cache_counters(stats, store)
    publish.track(tier.root, runtime, counters, tier.file_mode, tier.dir_mode)
    return runtime


def _forget_landed(listings: SharedListings, bucket: str, key: str) -> None:
    listings.invalidate(bucket, [key])


def _s3_store(config: TierCacheConfig, options: S3Options) -> S3Store:
    return S3Store(
        options,
        retry=RetryPolicy(attempts=config.retries),
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        # Each fetch's streams, prefetches in flight and upload parts hold connections.
        max_connections=max(16, 2 * fetch_streams(config) + upload_parts(config)),
        part_size=config.part_size,
        upload_concurrency=config.upload_concurrency,
        max_parts_in_flight=upload_parts(config),
    )
