"""``tiercache mount --metrics-listen``: the mount process serves the node's Prometheus metrics."""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support.mount_helpers import Cli, requires_fuse

MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@requires_fuse
def test_the_mount_serves_the_nodes_metrics(
    bucket: str, s3_client: Any, cli: Cli, mount: Callable[..., Path]
) -> None:
    body = os.urandom(MiB + 5)
    s3_client.put_object(Bucket=bucket, Key="ds/a.bin", Body=body)
    port = _free_port()
    mnt = mount(f"s3://{bucket}/ds", "--read-only", "--metrics-listen", f"127.0.0.1:{port}")
    assert (mnt / "a.bin").read_bytes() == body
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 10  # published every 2 s: seen within 10 s
    while True:
        samples = _scrape(url)
        if samples[("tiercache_read_bytes_total", ())] >= len(body):
            break
        assert time.monotonic() < deadline, samples
        time.sleep(0.5)
    assert samples[("tiercache_misses_total", ())] >= 1
    assert samples[("tiercache_fetched_bytes_total", ())] >= len(body)
    assert samples[("tiercache_processes", ())] >= 1  # the mount itself, live


def test_a_bad_metrics_address_is_refused_before_mounting(
    bucket: str, cli: Cli, tmp_path: Path
) -> None:
    (tmp_path / "mnt").mkdir()
    done = cli("mount", f"s3://{bucket}", str(tmp_path / "mnt"), "--metrics-listen", "nowhere")
    assert done.returncode == 1 and "HOST:PORT" in done.stderr, done.stderr
