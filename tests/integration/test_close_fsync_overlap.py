"""close() fsyncs a staged file while its commit prepares: nothing is installed before the
bytes are on disk, a failed fsync commits nothing, and close() never returns before it ends."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tiercache import TierFullError
from tiercache.write import staged as staged_module

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


class FsyncSpy:
    """Wraps ``os.fsync`` as the staged file sees it: a staged file's fsync is slow (or fails),
    and every rename into the journal is checked to come after it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.events: list[str] = []
        self._lock = threading.Lock()
        self._fail = fail
        real_fsync, real_rename = os.fsync, os.rename

        def fsync(fd: int) -> None:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if "/staging/" not in target or target.endswith((".closed", ".mpu")):
                real_fsync(fd)
                return
            self._add("data fsync started")
            time.sleep(0.3)  # a slow disk: the commit prepares meanwhile
            if self._fail:
                self._add("data fsync failed")
                raise OSError(errno.ENOSPC, "No space left on device")
            real_fsync(fd)
            self._add("data fsync done")

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            name = os.fspath(dst)
            if name.endswith((".json", ".data", ".meta")) and "/journal/" in name + "/objects/":
                self._add(f"installed {os.path.basename(name).rsplit('.', 1)[1]}")
            real_rename(src, dst, *args, **kwargs)

        monkeypatch.setattr(staged_module.os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)

    def _add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)


def _write(fs: Any, path: str, data: bytes) -> None:
    with fs.open(path, "wb") as f:
        f.write(data)


def test_nothing_is_installed_before_the_staged_bytes_are_on_disk(
    make_fs: Callable[..., Any], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = make_fs(write_mode="behind")
    spy = FsyncSpy(monkeypatch)
    data = os.urandom(3 * MiB)
    _write(fs, f"{bucket}/ckpt/a.bin", data)
    done = spy.events.index("data fsync done")
    installed = [i for i, e in enumerate(spy.events) if e.startswith("installed")]
    assert spy.events[0] == "data fsync started" and installed, spy.events
    assert min(installed) > done, spy.events  # the record and the entry come after the fsync
    monkeypatch.undo()
    fs.flush(timeout=60)
    assert fs.cat_file(f"{bucket}/ckpt/a.bin") == data


@pytest.mark.parametrize("size", [100 * 1024, 3 * MiB], ids=["inline", "background"])
def test_a_failed_fsync_commits_nothing_and_keeps_the_previous_version(
    make_fs: Callable[..., Any], bucket: str, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    fs = make_fs(write_mode="behind")
    path = f"{bucket}/ckpt/b.bin"
    old = os.urandom(size)
    _write(fs, path, old)
    fs.flush(timeout=60)
    spy = FsyncSpy(monkeypatch, fail=True)
    with pytest.raises(TierFullError):
        _write(fs, path, os.urandom(size))
    assert "data fsync failed" in spy.events
    assert not [e for e in spy.events if e.startswith("installed")], spy.events
    monkeypatch.undo()
    assert fs.pending(path) == []
    assert fs.cat_file(path) == old
    fs.flush(timeout=60)
    assert fs.cat_file(path) == old
