"""``tiercache metrics``: the exporter serves ``/metrics`` only; a textfile error names the file."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_EXE = Path(sys.executable).with_name("tiercache")
CLI = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "tiercache.cli"]


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A running ``tiercache metrics --listen 127.0.0.1:0``; yields its host and port."""
    child = subprocess.Popen(
        [*CLI, "metrics", "--listen", "127.0.0.1:0", "--local-dir", str(tmp_path / "tier")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    try:
        assert line.startswith("serving http://127.0.0.1:"), (line, child.stderr)
        host, _, port = line.split()[1].removeprefix("http://").split("/")[0].partition(":")
        yield host, int(port)
    finally:
        child.terminate()
        child.wait(30)


def _get(where: tuple[str, int], path: str) -> tuple[int, str]:
    """GET ``path`` as sent (no client-side normalisation of ``..``)."""
    connection = http.client.HTTPConnection(*where, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_only_the_metrics_path_is_served(exporter: tuple[str, int]) -> None:
    status, body = _get(exporter, "/metrics")
    assert status == 200 and "tiercache_hits_total" in body
    assert _get(exporter, "/metrics?name[]=tiercache_hits_total")[0] == 200  # a query is kept
    for path in ("/", "/wrong", "/../../etc/passwd", "/metrics/", "/metricsx", "/favicon.ico"):
        status, body = _get(exporter, path)
        assert (status, body) == (404, "not found: the metrics are at /metrics\n"), path


@pytest.mark.parametrize("where", ["missing/tiercache.prom", "dir"])
def test_a_textfile_that_cannot_be_written_is_named(tmp_path: Path, where: str) -> None:
    (tmp_path / "dir").mkdir()
    textfile = tmp_path / where
    done = subprocess.run(
        [*CLI, "metrics", "--textfile", str(textfile), "--local-dir", str(tmp_path / "tier")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    said = done.stderr.strip()
    assert said.startswith(f"tiercache metrics: cannot write the textfile {textfile}: "), said
    assert f"{textfile}." not in said  # no temp file beside it
    assert "Traceback" not in said and len(said.splitlines()) == 1
    reason = f"no directory {tmp_path / 'missing'}" if "/" in where else "Is a directory"
    assert said.endswith(reason), said
    assert os.listdir(tmp_path / "dir") == []  # nothing left behind
