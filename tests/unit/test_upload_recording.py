"""An upload that reached the store is never sent again because the tier could not record it."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from tiercache import MemoryStore, TierCacheFileSystem


def test_an_upload_whose_recording_fails_is_recorded_later_not_resent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore(["b"])
    fs = TierCacheFileSystem(store=store, local_dir=str(tmp_path / "t"), skip_instance_cache=True)
    state = fs._runtime.write_state
    record_it = state.uploaded
    refusals = []

    def full_twice(*args: Any, **kwargs: Any) -> bool:
        if len(refusals) < 2:  # the tier's disk is full, then has room again
            refusals.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")
        return record_it(*args, **kwargs)

    monkeypatch.setattr(state, "uploaded", full_twice)
    with fs.open("b/k.bin", "wb") as f:
        f.write(b"sent once")
    fs.flush(timeout=30)
    assert len(refusals) == 2 and fs.pending() == []
    assert store.request_counts()["PutObject"] == 1
    assert fs.cat_file("b/k.bin") == b"sent once"
