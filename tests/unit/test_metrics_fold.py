"""Node counters from the tier's metrics directory: folding exited processes exactly once."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tiercache.metrics import files, publish
from tiercache.metrics.files import (
    fold_if_free,
    hold_alive,
    live_processes,
    new_process_id,
    node_counters,
    write_process_counters,
)
from tiercache.metrics.publish import Publisher
from tiercache.tiers.locks import unlock

# A process that publishes counters, holds its liveness lock and waits for a line on stdin.
_LIVE = """
import sys
from tiercache.metrics.files import hold_alive, new_process_id, write_process_counters
directory, hits = sys.argv[1], float(sys.argv[2])
me = new_process_id()
hold_alive(directory, me, 0o600)
write_process_counters(directory, me, {"hits": hits}, 0o600)
print(me, flush=True)
sys.stdin.readline()
"""


def _start_live(directory: Path, hits: float) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _LIVE, str(directory), str(hits)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    return child, child.stdout.readline().strip()


def _end(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait(30) == 0


def _dead_file(directory: Path, process_id: str, counters: dict[str, float]) -> None:
    """The files a process leaves when it has exited: counters, and a liveness lock nobody holds."""
    write_process_counters(str(directory), process_id, counters, 0o600)
    (directory / f"{process_id}.alive").touch()


def test_live_then_exited_process_never_goes_down(tmp_path: Path) -> None:
    first, first_id = _start_live(tmp_path, 5)
    second, _ = _start_live(tmp_path, 7)
    try:
        assert node_counters(str(tmp_path), 0o600)["hits"] == 12
        assert first_id in live_processes(str(tmp_path))
        _end(first)
        seen = [node_counters(str(tmp_path), 0o600)["hits"] for _ in range(3)]
        assert seen == [12, 12, 12]  # its counters moved into the total, once
        assert not (tmp_path / f"{first_id}.json").exists()
        assert json.loads((tmp_path / "total.json").read_text())["counters"]["hits"] == 5
    finally:
        for child in (first, second):
            if child.poll() is None:
                _end(child)
    assert node_counters(str(tmp_path), 0o600)["hits"] == 12
    assert sorted(os.listdir(tmp_path)) == [".fold.lock", "total.json"]  # bounded


def test_two_folders_at_once_fold_a_dead_process_once(tmp_path: Path) -> None:
    for n in range(20):
        _dead_file(tmp_path, f"{100 + n}-1-00000{n % 10}", {"misses": 1})
    results: list[float] = []

    def fold() -> None:
        results.append(node_counters(str(tmp_path), 0o600)["misses"])

    threads = [threading.Thread(target=fold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [20, 20, 20, 20]
    assert node_counters(str(tmp_path), 0o600)["misses"] == 20


def test_a_crash_after_writing_the_total_does_not_count_twice(tmp_path: Path) -> None:
    """The total was written (naming the folded process) but its files were not removed."""
    _dead_file(tmp_path, "4242-99-abcdef", {"hits": 3})
    total = {"counters": {"hits": 3}, "folded": ["4242-99-abcdef"]}
    (tmp_path / "total.json").write_text(json.dumps(total))
    assert node_counters(str(tmp_path), 0o600)["hits"] == 3
    assert not (tmp_path / "4242-99-abcdef.json").exists()


def test_a_reused_pid_is_another_process(tmp_path: Path) -> None:
    """A dead process's file under a pid that a live process (this one) holds now is folded;
    this process's own id differs from it by start time."""
    mine = new_process_id()
    pid, started, _ = mine.split("-")
    dead = f"{pid}-{int(started) - 1}-abcdef"
    _dead_file(tmp_path, dead, {"hits": 2})
    fd = hold_alive(str(tmp_path), mine, 0o600)
    try:
        write_process_counters(str(tmp_path), mine, {"hits": 1}, 0o600)
        assert live_processes(str(tmp_path)) == [mine]
        assert node_counters(str(tmp_path), 0o600)["hits"] == 3
        assert not (tmp_path / f"{dead}.json").exists()
        assert (tmp_path / f"{mine}.json").exists()
    finally:
        unlock(fd)


def test_fold_if_free_does_not_wait_for_another_folder(tmp_path: Path) -> None:
    _dead_file(tmp_path, "7-7-aaaaaa", {"hits": 1})
    with files._fold_lock(str(tmp_path), 0o600, wait=True):
        assert fold_if_free(str(tmp_path), 0o600) is False
    assert fold_if_free(str(tmp_path), 0o600) is True
    assert not (tmp_path / "7-7-aaaaaa.json").exists()


class _Owner:
    """Stands in for a cache runtime (the publisher holds it weakly)."""


def _published(tier: Path, publisher: Publisher) -> dict[str, float]:
    process_id = publisher.process_id(str(tier))
    assert process_id is not None
    path = tier / "metrics" / f"{process_id}.json"
    counters: dict[str, float] = json.loads(path.read_text())["counters"]
    return counters


def test_a_collected_cache_leaves_its_counters_to_the_process(tmp_path: Path) -> None:
    publisher = Publisher(interval=3600)
    owner = _Owner()
    counts = {"hits": 4.0}
    publisher.track(str(tmp_path), owner, lambda: dict(counts))
    publisher.track(str(tmp_path), _Owner(), lambda: {"hits": 100.0})  # collected at once
    gc.collect()
    publisher.publish_now()
    assert _published(tmp_path, publisher)["hits"] == 104
    counts["hits"] = 6.0  # counted after the last publication, before it is collected
    keep = _Owner()
    publisher.track(str(tmp_path), keep, lambda: {"hits": 1.0})
    del owner
    gc.collect()
    publisher.publish_now()
    assert _published(tmp_path, publisher)["hits"] == 107
    publisher.publish_now()
    assert _published(tmp_path, publisher)["hits"] == 107


def test_a_tier_no_cache_uses_any_more_is_left_to_the_fold(tmp_path: Path) -> None:
    publisher = Publisher(interval=3600)
    owner = _Owner()
    publisher.track(str(tmp_path), owner, lambda: {"hits": 5.0})
    publisher.publish_now()
    first_id = publisher.process_id(str(tmp_path))
    del owner
    gc.collect()
    publisher.publish_now()  # its last counters written, its liveness lock released
    assert publisher.process_id(str(tmp_path)) is None
    directory = str(tmp_path / "metrics")
    assert live_processes(directory) == []
    assert node_counters(directory, 0o600)["hits"] == 5
    again = _Owner()
    publisher.track(str(tmp_path), again, lambda: {"hits": 2.0})
    publisher.publish_now()
    assert publisher.process_id(str(tmp_path)) not in (None, first_id)
    assert node_counters(directory, 0o600)["hits"] == 7


def test_a_failing_reader_keeps_its_last_reading(tmp_path: Path) -> None:
    publisher = Publisher(interval=3600)
    owner = _Owner()
    readings = iter([{"hits": 9.0}])
    publisher.track(str(tmp_path), owner, lambda: next(readings))
    publisher.publish_now()
    publisher.publish_now()  # StopIteration now: the published value must not drop
    assert _published(tmp_path, publisher)["hits"] == 9


def test_a_forked_child_publishes_under_its_own_id(tmp_path: Path) -> None:
    publisher = Publisher(interval=3600)
    owner = _Owner()
    counts = {"hits": 5.0}
    publisher.track(str(tmp_path), owner, lambda: dict(counts))
    publisher.publish_now()
    parent_id = publisher.process_id(str(tmp_path))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its counters start again from what it counts itself
        try:
            counts["hits"] = 1.0
            publisher.publish_now()
            os.write(write_end, str(publisher.process_id(str(tmp_path))).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child_id = os.read(read_end, 100).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    assert child_id and child_id != parent_id
    assert node_counters(str(tmp_path / "metrics"), 0o600)["hits"] == 6
    assert live_processes(str(tmp_path / "metrics")) == [parent_id]


def _worker(tier: str, counts: dict[str, float]) -> None:
    """A multiprocessing child: counts after its first publication, then returns."""
    owner = _Owner()
    publish.track(tier, owner, lambda: dict(counts))
    time.sleep(0.5)  # the publisher's first publication (all zeros) is done
    counts["hits"] = 7.0


def test_a_multiprocessing_child_publishes_its_last_counters(tmp_path: Path) -> None:
    """It ends with os._exit (no atexit): its final counters come from threading's shutdown."""
    child = multiprocessing.get_context("fork").Process(
        target=_worker, args=(str(tmp_path), {"hits": 0.0})
    )
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert node_counters(str(tmp_path / "metrics"), 0o600)["hits"] == 7
