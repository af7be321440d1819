"""Shared-tier test fixtures: the fault proxy, which counts requests as the server sees them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "faults"))

from proxy import FaultProxy


@pytest.fixture
def proxy(s3: Any) -> Iterator[FaultProxy]:
    with FaultProxy(s3.endpoint) as fault_proxy:
        yield fault_proxy
