"""``flush()`` returns once what it uploaded has left the journal: records and claims alike."""

from __future__ import annotations

import glob
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.gated_store import GatedStore

from tiercache import TierCacheFileSystem


@pytest.mark.parametrize("write_tier", ["local", "shared"])
def test_a_flush_returns_after_the_uploads_gave_their_claims_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_tier: str
) -> None:
    store = GatedStore()
    fs = TierCacheFileSystem(
        store=store,
        local_dir=str(tmp_path / "local"),
        shared_dir=str(tmp_path / "shared"),
        write_tier=write_tier,
        skip_instance_cache=True,
    )
    state = fs._runtime.write_state
    release = state.release

    def slow_release(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)  # the record is gone already: a flush that looks only at records ends
        return release(*args, **kwargs)

    monkeypatch.setattr(state, "release", slow_release)
    for name in ("x", "y"):
        with fs.open(f"b/{name}", "wb") as f:
            f.write(os.urandom(1000))
    assert len(fs.pending()) == 2
    threading.Timer(0.2, store.gate.set).start()  # the uploads go once the flush waits
    try:
        fs.flush(timeout=30)
    finally:
        store.gate.set()
    assert fs.pending() == []
    assert glob.glob(os.path.join(state.dir, "*")) == []  # no record, bytes or claim
