"""A staged file its writer had closed (a mount's file still open elsewhere) survives the
writer's death: ``reconcile`` commits it; one never closed is dropped, as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiercache import MemoryStore, TierCacheFileSystem


def _fs(tmp_path: Path, store: MemoryStore) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=store, local_dir=str(tmp_path / "tier"), skip_instance_cache=True
    )


def _write_and_die(tmp_path: Path, store: MemoryStore, data: bytes, mark: bool) -> None:
    """In a child process: stage ``data`` as b/k, maybe mark it closed, then die."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            f = _fs(tmp_path, store).open("b/k", "wb")
            f.write(data)
            if mark:
                f.mark_closed(store.namespace)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("mark", [True, False], ids=["closed", "never-closed"])
def test_a_dead_writer_s_closed_file_is_committed(tmp_path: Path, mark: bool) -> None:
    store = MemoryStore(buckets=("b",))
    data = os.urandom(3 * 1024 * 1024 + 17)
    _write_and_die(tmp_path, store, data, mark)
    fs = _fs(tmp_path, store)
    fs.flush(timeout=60)
    if mark:
        assert fs.cat("b/k") == data
        elsewhere = TierCacheFileSystem(
            store=store, local_dir=str(tmp_path / "other"), skip_instance_cache=True
        )
        assert elsewhere.cat("b/k") == data  # from the store
    else:
        assert not fs.exists("b/k")
    staging = tmp_path / "tier" / "staging"
    assert not [n for n in os.listdir(staging) if n.endswith(".closed")]
