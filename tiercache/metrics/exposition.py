"""The node's metrics as Prometheus families (``prometheus_client``, the ``metrics`` extra).

Labels take values from small fixed sets only (``tier``: local/shared, ``op``: S3 operations,
``state``: dirty/failed/lost); no label ever carries an object key, a path or a process id.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from tiercache.metrics.node import NodeReader, NodeSample
from tiercache.metrics.publish import STORE_ERRORS, STORE_REQUESTS

PREFIX = "tiercache_"
# Operations always shown, so their series exist (at 0) before the first request.
_SEEDED_OPS = ("GetObject", "HeadObject", "ListObjectsV2", "PutObject")
# Counters with a name of their own: family (without ``_total``), counter, help.
_NAMED = (
    ("misses", "misses", "Reads no tier held: fallbacks to the object store."),
    ("fetched_bytes", "bytes_fetched", "Bytes fetched from the object store into a tier."),
    ("read_bytes", "bytes_read", "Bytes handed to readers."),
    (
        "reader_wait_seconds",
        "reader_wait_seconds",
        "Seconds readers waited for bytes that were not in a tier yet (loader wait).",
    ),
    ("prefetch_used", "prefetch_used", "Prefetched objects that were read."),
    ("prefetch_wasted", "prefetch_wasted", "Prefetched objects evicted or dropped unread."),
    ("verify_failures", "verify_failures", "Cached copies that failed their digest check."),
    ("evictions", "evictions", "Entries evicted from the local tier."),
)
_HIT_COUNTERS = {"local": "hits", "shared": "shared_hits"}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class NodeCollector(Collector):
    """Reads the node at each scrape (``NodeReader.sample``) and yields its families."""

    def __init__(self, reader: NodeReader) -> None:
        self._reader = reader

    def collect(self) -> Iterator[Metric]:
        return iter(families(self._reader.sample()))


def registry_for(reader: NodeReader) -> CollectorRegistry:
    """A registry serving only the node's families (none of the exporter process's own)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(reader))
    return registry


def families(sample: NodeSample) -> list[Metric]:
    """Every family the node serves, from one reading."""
    counters = sample.counters
    out: list[Metric] = []
    hits = CounterMetricFamily(
        PREFIX + "hits", "Reads served from a tier, by tier.", labels=["tier"]
    )
    for tier, name in _HIT_COUNTERS.items():
        hits.add_metric([tier], counters.get(name, 0))
    out.append(hits)
    for family, name, text in _NAMED:
        out.append(CounterMetricFamily(PREFIX + family, text, value=counters.get(name, 0)))
    out.append(_by_op(counters, STORE_REQUESTS, "store_requests", "Requests sent to the store."))
    out.append(_by_op(counters, STORE_ERRORS, "store_errors", "Store requests that failed."))
    out.extend(_gauges(sample))
    out.extend(_other_counters(counters))
    return out


def _by_op(counters: dict[str, float], prefix: str, family: str, text: str) -> Metric:
    metric = CounterMetricFamily(PREFIX + family, text + " By S3 operation.", labels=["op"])
    ops = {op: 0.0 for op in _SEEDED_OPS}
    for name, value in counters.items():
        op = name.removeprefix(prefix)
        if name.startswith(prefix) and op.isalnum():
            ops[op] = value
    for op, value in sorted(ops.items()):
        metric.add_metric([op], value)
    return metric


def _gauges(sample: NodeSample) -> list[Metric]:
    used = GaugeMetricFamily(PREFIX + "tier_used_bytes", "Bytes a tier holds.", labels=["tier"])
    capacity = GaugeMetricFamily(
        PREFIX + "tier_capacity_bytes", "A tier's byte budget.", labels=["tier"]
    )
    for tier, usage in sample.tiers.items():
        used.add_metric([tier], usage.used_bytes)
        capacity.add_metric([tier], usage.capacity_bytes)
    pending = GaugeMetricFamily(
        PREFIX + "pending_uploads",
        "Writes acknowledged but not in the store yet, by state (dirty: waiting; failed, lost: "
        "need an operator).",
        labels=["state"],
    )
    pending_bytes = GaugeMetricFamily(
        PREFIX + "pending_upload_bytes", "Bytes of the pending uploads, by state.", labels=["state"]
    )
    for state, uploads in sample.pending.items():
        pending.add_metric([state], uploads.count)
        pending_bytes.add_metric([state], uploads.nbytes)
    on = GaugeMetricFamily(
        PREFIX + "pending_uploads_by_durability",
        "Pending writes by where they survive until uploaded (local: this host's disk; "
        "shared: the shared tier, finished by any host if this one is lost).",
        labels=["durability"],
    )
    on_bytes = GaugeMetricFamily(
        PREFIX + "pending_upload_bytes_by_durability",
        "Bytes of the pending writes by where they survive until uploaded.",
        labels=["durability"],
    )
    for durability, uploads in sample.durability.items():
        on.add_metric([durability], uploads.count)
        on_bytes.add_metric([durability], uploads.nbytes)
    oldest = GaugeMetricFamily(
        PREFIX + "oldest_pending_upload_age_seconds",
        "Age of the oldest pending upload (0: none pending).",
        value=sample.oldest_pending_age,
    )
    processes = GaugeMetricFamily(
        PREFIX + "processes",
        "Processes publishing counters for this tier now.",
        value=sample.processes,
    )
    return [used, capacity, pending, pending_bytes, on, on_bytes, oldest, processes]


def _other_counters(counters: dict[str, float]) -> list[Metric]:
    """The remaining counters (uploads, fetches, bytes written...) under their own names."""
    taken = {name for _, name, _ in _NAMED} | set(_HIT_COUNTERS.values()) | {"processes"}
    out: list[Metric] = []
    for name in sorted(counters):
        if name in taken or not _NAME.match(name):  # store_*: ops, already served above
            continue
        text = f"The {name.replace('_', ' ')} counter of tiercache's Stats."
        out.append(CounterMetricFamily(PREFIX + name, text, value=counters[name]))
    return out
