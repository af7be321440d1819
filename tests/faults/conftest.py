"""Fixtures of the fault-injection tests: a ``FaultProxy`` in front of the session's server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from proxy import FaultProxy


@pytest.fixture
def proxy(s3: Any) -> Iterator[FaultProxy]:
    with FaultProxy(s3.endpoint) as fault_proxy:
        yield fault_proxy
