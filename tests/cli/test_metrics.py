"""``tiercache metrics --listen``: a live exporter scraped over HTTP, on the real S3 server."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.proxy import FaultProxy

from tiercache.metrics.node import USAGE_SCAN_AGE

KiB = 1024
_EXE = Path(sys.executable).with_name("tiercache")
CLI = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "tiercache.cli"]
FAMILIES = (
    "tiercache_hits_total",
    "tiercache_misses_total",
    "tiercache_fetched_bytes_total",
    "tiercache_read_bytes_total",
    "tiercache_store_requests_total",
    "tiercache_store_errors_total",
    "tiercache_reader_wait_seconds_total",
    "tiercache_tier_used_bytes",
    "tiercache_tier_capacity_bytes",
    "tiercache_pending_uploads",
    "tiercache_pending_upload_bytes",
    "tiercache_pending_uploads_by_durability",
    "tiercache_pending_upload_bytes_by_durability",
    "tiercache_oldest_pending_upload_age_seconds",
    "tiercache_prefetch_used_total",
    "tiercache_prefetch_wasted_total",
    "tiercache_verify_failures_total",
    "tiercache_evictions_total",
)
# Reads KEYS through tiercache, says so, then waits for a line on stdin when asked (a live
# process) or exits normally.
_READER = """
import os, sys
from tiercache import TierCacheFileSystem
fs = TierCacheFileSystem(
    target_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}, skip_instance_cache=True
)
wait, bucket, keys = sys.argv[1] == "wait", sys.argv[2], sys.argv[3:]
for key in keys:
    fs.cat_file(f"{bucket}/{key}")
print("read", flush=True)
if wait:
    sys.stdin.readline()
"""
# Writes one object behind, and dies once close() returned: its upload stays pending.
_WRITER = """
import os, sys
from tiercache import TierCacheFileSystem
fs = TierCacheFileSystem(
    target_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]},
    skip_instance_cache=True,
    write_mode="behind",
)
with fs.open(sys.argv[1], "wb") as f:
    f.write(b"w" * 3000)
print("closed", flush=True)
os._exit(0)
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _env(s3: Any, tier: Path, endpoint: str | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint or s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.key,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_DEFAULT_REGION": s3.region,
        "TIERCACHE_LOCAL_DIR": str(tier),
        "TIERCACHE_RETRIES": "2",
    }


@pytest.fixture
def tier(tmp_path: Path) -> Path:
    return tmp_path / "tier"


@pytest.fixture
def exporter(tier: Path) -> Iterator[str]:
    """A running ``tiercache metrics --listen 127.0.0.1:PORT`` on the tier; yields its URL."""
    child = subprocess.Popen(
        [*CLI, "metrics", "--listen", "127.0.0.1:0", "--local-dir", str(tier)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    try:
        assert line.startswith("serving http://127.0.0.1:"), (line, child.stderr)
        yield line.split()[1]
    finally:
        child.terminate()
        child.wait(30)


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _total(samples: Samples, name: str) -> float:
    return sum(value for (sample, _), value in samples.items() if sample == name)


def _never_down(scrapes: list[Samples]) -> None:
    for before, after in itertools.pairwise(scrapes):
        for key, value in before.items():
            if key[0].endswith("_total"):
                assert after[key] >= value, (key, value, after[key])


def _wait_for(url: str, done: Any, scrapes: list[Samples], within: float) -> Samples:
    deadline = time.monotonic() + within
    while True:
        samples = _scrape(url)
        scrapes.append(samples)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


def _live_one_seen(samples: Samples) -> bool:
    """The live reader's counters (one miss, one hit, 20 KiB read) are in the node's."""
    return (
        _value(samples, "tiercache_hits_total", tier="local") == 1
        and _value(samples, "tiercache_read_bytes_total") == 4 * 10 * KiB
    )


def _reader(env: dict[str, str], wait: bool, bucket: str, *keys: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _READER, "wait" if wait else "exit", bucket, *keys],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "read"
    return child


def test_every_family_is_served(exporter: str) -> None:
    samples = _scrape(exporter)
    names = {name for name, _ in samples}
    assert not [family for family in FAMILIES if family not in names]
    for _, labels in samples:
        assert {label for label, _ in labels} <= {"tier", "op", "state", "durability"}


def test_exited_and_live_processes_are_both_counted(
    s3: Any, s3_client: Any, bucket: str, tier: Path, exporter: str
) -> None:
    for key in ("a", "b", "c"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x" * (10 * KiB))
    env = _env(s3, tier)
    scrapes = [_scrape(exporter)]
    exited = _reader(env, False, bucket, "a", "b")
    assert exited.wait(60) == 0
    scrapes.append(_scrape(exporter))
    assert _value(scrapes[-1], "tiercache_misses_total") == 2  # the exited one, at once

    live = _reader(env, True, bucket, "c", "a")  # c from the store, a from the tier
    seen_at = time.monotonic()
    try:
        samples = _wait_for(exporter, _live_one_seen, scrapes, within=10)
        assert time.monotonic() - seen_at <= 10
        assert _value(samples, "tiercache_misses_total") == 3
        assert _value(samples, "tiercache_hits_total", tier="local") == 1
        assert _value(samples, "tiercache_read_bytes_total") == 4 * 10 * KiB
        assert _value(samples, "tiercache_fetched_bytes_total") == 3 * 10 * KiB
        assert _value(samples, "tiercache_store_requests_total", op="GetObject") >= 3
        used = _wait_for(  # the exporter rescans the tier at most every USAGE_SCAN_AGE
            exporter,
            lambda s: _value(s, "tiercache_tier_used_bytes", tier="local") == 3 * 10 * KiB,
            scrapes,
            within=USAGE_SCAN_AGE + 5,
        )
        assert _value(used, "tiercache_tier_used_bytes", tier="local") == 3 * 10 * KiB
        assert _value(samples, "tiercache_processes") == 1
        for _ in range(3):
            scrapes.append(_scrape(exporter))
    finally:
        assert live.stdin is not None
        live.stdin.close()
        assert live.wait(60) == 0
    scrapes.append(_scrape(exporter))
    assert _value(scrapes[-1], "tiercache_misses_total") == 3  # folded, not lost
    assert _value(scrapes[-1], "tiercache_processes") == 0
    _never_down(scrapes)


def test_a_write_left_pending_by_an_exited_process(
    s3: Any, bucket: str, tier: Path, exporter: str, proxy: FaultProxy
) -> None:
    proxy.fail_next(1000, 503, method="PUT")  # the writer's upload cannot land before it dies
    env = _env(s3, tier, endpoint=proxy.url)
    writer = subprocess.run(
        [sys.executable, "-c", _WRITER, f"{bucket}/ckpt/model.pt"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert writer.returncode == 0 and writer.stdout.strip() == "closed", writer.stderr
    time.sleep(0.2)
    scrapes = [_scrape(exporter)]
    assert _value(scrapes[-1], "tiercache_pending_uploads", state="dirty") == 1
    assert _value(scrapes[-1], "tiercache_pending_upload_bytes", state="dirty") == 3000
    assert _value(scrapes[-1], "tiercache_pending_uploads_by_durability", durability="local") == 1
    assert _value(scrapes[-1], "tiercache_oldest_pending_upload_age_seconds") > 0

    proxy.clear()
    flushed = subprocess.run(
        [*CLI, "flush", "--local-dir", str(tier)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert flushed.returncode == 0, flushed.stderr
    scrapes.append(_scrape(exporter))
    assert _total(scrapes[-1], "tiercache_pending_uploads") == 0
    assert _value(scrapes[-1], "tiercache_oldest_pending_upload_age_seconds") == 0
    assert _value(scrapes[-1], "tiercache_uploads_total") >= 1  # the flush's own, folded
    _never_down(scrapes)


def test_without_prometheus_client_the_error_names_the_extra(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker" / "prometheus_client"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    done = subprocess.run(
        [*CLI, "metrics", "--local-dir", str(tmp_path / "tier")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "tiercache[metrics]" in done.stderr and "Traceback" not in done.stderr


def test_textfile_and_stats_show_the_node_totals(
    s3: Any, s3_client: Any, bucket: str, tier: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"y" * KiB)
    env = _env(s3, tier)
    assert _reader(env, False, bucket, "k", "k").wait(60) == 0
    textfile = tier.parent / "tiercache.prom"
    done = subprocess.run(
        [*CLI, "metrics", "--textfile", str(textfile)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    samples: Samples = {}
    for family in text_string_to_metric_families(textfile.read_text()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert _value(samples, "tiercache_misses_total") == 1
    assert _value(samples, "tiercache_hits_total", tier="local") == 1
    stats = subprocess.run(
        [*CLI, "stats", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert stats.returncode == 0, stats.stderr
    node = json.loads(stats.stdout)["node"]
    assert (node["misses"], node["hits"], node["bytes_read"]) == (1, 1, 2 * KiB)
