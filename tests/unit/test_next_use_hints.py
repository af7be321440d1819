"""Next-use hints: what eviction may take for a prefetch, and orders seen from other processes."""

from __future__ import annotations

import math
import multiprocessing
import os
from pathlib import Path

from tiercache.tiers.next_use import NEVER, Floor, NextUse


def _ids(*names: str) -> list[str]:
    return [name.encode().hex().rjust(64, "0") for name in names]


def _distances_elsewhere(root: str, ids: list[str]) -> dict[str, float]:
    return NextUse(root).distances(ids)


def _order_then_die(root: str, ids: list[str]) -> None:
    NextUse(root).add(ids)
    os._exit(0)  # no close: the file stays behind


def test_the_floor_keeps_what_min_would_keep(tmp_path: Path) -> None:
    p, y, a, b = _ids("p", "y", "a", "b")
    hints = NextUse(str(tmp_path))
    order = hints.add([p, y, a, b])
    assert order.floor(0) == Floor(1, 0)  # nothing read before it: only its own next use
    order.advance(0)
    # p, open now, is not read again: once closed it is what eviction should take for y.
    assert order.floor(1) == Floor(NEVER, 1)
    order.extend([a, p])  # read again, at position 5: later than anything else
    assert order.floor(1) == Floor(5, 1)
    assert order.floor(2) == Floor(NEVER, 2)  # y is not read again: wait until it was
    assert hints.distances([p, y, a, b]) == {p: 0, y: 1, a: 2, b: 3}
    order.advance(2)
    assert hints.distances([p, y, a, b, _ids("z")[0]]) == {p: 3, y: NEVER, a: 0, b: 1}
    order.close()
    assert hints.distances([p]) == {}


def test_another_process_sees_the_order_and_where_its_reader_is(tmp_path: Path) -> None:
    ids = _ids("s0", "s1", "s2", "s3")
    hints = NextUse(str(tmp_path))
    order = hints.add(ids)
    order.advance(1)
    fork = multiprocessing.get_context("fork")
    with fork.Pool(1) as pool:
        seen = pool.apply(_distances_elsewhere, (str(tmp_path), ids))
        assert seen == {ids[0]: math.inf, ids[1]: 0, ids[2]: 1, ids[3]: 2}
        order.extend(ids[:1])  # a new file, with s0 read again at position 4
        order.advance(2)
        seen = pool.apply(_distances_elsewhere, (str(tmp_path), ids))
        assert seen == {ids[0]: 2, ids[1]: math.inf, ids[2]: 0, ids[3]: 1}
    assert len(os.listdir(hints.dir)) == 1
    order.close()
    assert os.listdir(hints.dir) == []


def test_the_file_of_a_process_that_is_gone_is_removed(tmp_path: Path) -> None:
    ids = _ids("s0", "s1")
    child = multiprocessing.get_context("fork").Process(
        target=_order_then_die, args=(str(tmp_path), ids)
    )
    child.start()
    child.join()
    hints = NextUse(str(tmp_path))
    assert len(os.listdir(hints.dir)) == 1
    assert hints.distances(ids) == {}
    assert os.listdir(hints.dir) == []
