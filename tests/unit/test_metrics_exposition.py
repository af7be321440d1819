"""The Prometheus families built from a node reading, and the dashboard that queries them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.core import Metric

from tiercache.metrics.exposition import families
from tiercache.metrics.node import NodeSample, PendingUploads, TierUsage

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "tiercache.json"


def _sample() -> NodeSample:
    return NodeSample(
        counters={
            "hits": 5,
            "shared_hits": 2,
            "misses": 1,
            "bytes_read": 10,
            "uploads": 3,
            "store_requests:GetObject": 4,
            "store_requests:Bad Op!": 1,
            "store_errors:PutObject": 2,
            "some/key/Name": 1,
        },
        processes=2,
        tiers={"local": TierUsage(1, 2), "shared": TierUsage(3, 4)},
        pending={"dirty": PendingUploads(1, 100)},
        oldest_pending_age=7.5,
    )


def _samples(metrics: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics for s in m.samples}


def test_families_carry_bounded_labels_and_the_counters() -> None:
    samples = _samples(families(_sample()))
    assert samples[("tiercache_hits_total", (("tier", "local"),))] == 5
    assert samples[("tiercache_hits_total", (("tier", "shared"),))] == 2
    assert samples[("tiercache_store_requests_total", (("op", "GetObject"),))] == 4
    assert samples[("tiercache_store_requests_total", (("op", "PutObject"),))] == 0  # seeded
    assert samples[("tiercache_store_errors_total", (("op", "PutObject"),))] == 2
    assert samples[("tiercache_uploads_total", ())] == 3
    assert samples[("tiercache_oldest_pending_upload_age_seconds", ())] == 7.5
    assert samples[("tiercache_tier_capacity_bytes", (("tier", "shared"),))] == 4
    labels = {label for _, pairs in samples for label, _ in pairs}
    assert labels == {"tier", "op", "state"}
    values = {value for _, pairs in samples for _, value in pairs}
    assert not [v for v in values if not re.fullmatch(r"[A-Za-z0-9]+", v)]  # no key, no path


def test_the_dashboard_queries_only_served_families() -> None:
    served = {m.name for m in families(_sample())}
    served |= {name + "_total" for name in served}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried = set(re.findall(r"tiercache_[a-z_]+", " ".join(exprs)))
    assert queried and queried <= served, queried - served
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for question in ("hit rate per tier", "loader wait", "fallbacks to the store", "pending"):
        assert question in titles
    assert "oldest pending upload age" in titles
