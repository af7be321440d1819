"""What the node's metrics say at one moment: folded counters, tier usage, pending uploads."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from tiercache.config import TierCacheConfig
from tiercache.metrics.files import DIRNAME, live_processes, node_counters
from tiercache.tiers.local import LocalTier, make_tier_dir
from tiercache.tiers.shared import shared_tier_of
from tiercache.write.state import WriteState

# A tier's usage is rescanned at most this often, however often it is scraped.
USAGE_SCAN_AGE = 10.0
PENDING_STATES = ("dirty", "failed", "lost")


@dataclass(frozen=True)
class TierUsage:
    used_bytes: int
    capacity_bytes: int


@dataclass(frozen=True)
class PendingUploads:
    count: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class NodeSample:
    """One reading of the node: every value an exporter serves."""

    counters: dict[str, float]
    processes: int
    tiers: dict[str, TierUsage]
    pending: dict[str, PendingUploads] = field(default_factory=dict)
    oldest_pending_age: float = 0.0
    # Pending writes by where they survive until uploaded: ``local`` or ``shared``.
    durability: dict[str, PendingUploads] = field(default_factory=dict)


class NodeReader:
    """Reads the node's metrics from the local tier of ``config`` (and its shared tier's usage).

    Never talks to the store; folds the counters of processes that have exited (so it needs
    write access to ``LOCAL_DIR/metrics``, as the processes using the tier have).
    """

    def __init__(self, config: TierCacheConfig) -> None:
        self.tier = LocalTier(
            config.local_dir, config.local_max_bytes, config.file_mode, config.dir_mode
        )
        self.shared = shared_tier_of(config)
        # Writes behind wait in the local tier's journal, or the shared tier's
        # (``write_tier="shared"``): the node reports both.
        self.journals = [WriteState(self.tier, config.lock_timeout)]
        if self.shared is not None:
            self.journals.append(WriteState(self.shared, config.lock_timeout))
        self.directory = make_tier_dir(self.tier.root, DIRNAME, self.tier.dir_mode)

    def counters(self) -> dict[str, float]:
        """The node's counters: every process that used the tier, living or exited."""
        return node_counters(self.directory, self.tier.file_mode)

    def sample(self) -> NodeSample:
        counters = self.counters()
        tiers = {"local": TierUsage(self.tier.usage(max_age=USAGE_SCAN_AGE), self.tier.max_bytes)}
        if self.shared is not None:
            tiers["shared"] = TierUsage(
                self.shared.usage(max_age=USAGE_SCAN_AGE), self.shared.max_bytes
            )
        now = time.time()
        counts: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        oldest = 0.0
        durability: dict[str, PendingUploads] = {}
        for journal in self.journals:
            records = journal.records()
            for record in records:
                counts[record.state] += 1
                sizes[record.state] += record.size
                oldest = max(oldest, now - record.created_at)
            durability[journal.durability] = PendingUploads(
                len(records), sum(r.size for r in records)
            )
        pending = {
            state: PendingUploads(counts[state], sizes[state])
            for state in (*PENDING_STATES, *sorted(set(counts) - set(PENDING_STATES)))
        }
        return NodeSample(
            counters=counters,
            processes=len(live_processes(self.directory)),
            tiers=tiers,
            pending=pending,
            oldest_pending_age=oldest,
            durability=durability,
        )
