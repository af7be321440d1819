"""Which mount opens use FUSE passthrough and which backing files they share (no kernel)."""

from __future__ import annotations

import ctypes
import itertools
import threading
from types import SimpleNamespace

import pytest

from tiercache.mount import passthrough as pt
from tiercache.mount.passthrough import FUSE_CAP_PASSTHROUGH, Passthrough


class FileInfo(ctypes.Structure):
    """libfuse 3.17's ``struct fuse_file_info`` (include/fuse_common.h)."""

    _fields_ = [
        ("flags", ctypes.c_int32),
        ("writepage", ctypes.c_uint32, 1),
        ("direct_io", ctypes.c_uint32, 1),
        ("keep_cache", ctypes.c_uint32, 1),
        ("other_bits", ctypes.c_uint32, 29),
        ("padding2", ctypes.c_uint32),
        ("padding3", ctypes.c_uint32),
        ("fh", ctypes.c_uint64),
        ("lock_owner", ctypes.c_uint64),
        ("poll_events", ctypes.c_uint32),
        ("backing_id", ctypes.c_int32),
        ("compat_flags", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
    ]


def test_the_backing_id_lands_where_libfuse_reads_it() -> None:
    assert ctypes.sizeof(FileInfo) == 64
    assert FileInfo.backing_id.offset == pt._BACKING_ID_OFFSET


class Kernel:
    """Stands in for the ioctls: hands out backing ids, records the ones closed."""

    def __init__(self, refuse: bool = False) -> None:
        self.ids = itertools.count(1)
        self.closed: list[int] = []
        self.refuse = refuse

    def install(self, monkeypatch: pytest.MonkeyPatch, table: Passthrough) -> None:
        def backing_open(fd: int) -> int:
            if self.refuse:
                table.active = False
                return 0
            return next(self.ids)

        monkeypatch.setattr(table, "_backing_open", backing_open)
        monkeypatch.setattr(table, "_backing_close", self.closed.append)


def _conn(capable: int = FUSE_CAP_PASSTHROUGH) -> SimpleNamespace:
    return SimpleNamespace(capable=capable, want=0, want_ext=0, max_backing_stack_depth=7)


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> tuple[Passthrough, Kernel]:
    passthrough = Passthrough(wanted=True)
    passthrough.negotiate(_conn(), (3, 17))
    kernel = Kernel()
    kernel.install(monkeypatch, passthrough)
    return passthrough, kernel


def test_negotiate_asks_only_where_libfuse_and_the_kernel_can() -> None:
    for wanted, capable, version in [
        (False, FUSE_CAP_PASSTHROUGH, (3, 17)),
        (True, 0, (3, 17)),
        (True, FUSE_CAP_PASSTHROUGH, (3, 14)),
    ]:
        off, conn = Passthrough(wanted), _conn(capable)
        off.negotiate(conn, version)
        assert not off.active and conn.want == 0 and conn.want_ext == 0
    on, conn = Passthrough(True), _conn()
    on.negotiate(conn, (3, 16))
    assert on.active
    assert conn.want & FUSE_CAP_PASSTHROUGH and conn.want_ext & FUSE_CAP_PASSTHROUGH
    assert conn.max_backing_stack_depth == 0


def test_readers_share_one_backing_file_closed_with_the_last(
    table: tuple[Passthrough, Kernel],
) -> None:
    passthrough, kernel = table
    first, second = FileInfo(keep_cache=1), FileInfo(keep_cache=1)
    assert passthrough.opened(1, "/a", first, backing_fd=10)
    assert passthrough.opened(2, "/a", second, backing_fd=11)
    assert first.backing_id == second.backing_id == 1
    assert not first.keep_cache and not second.keep_cache  # the kernel refuses both at once
    assert passthrough.held("/a")
    passthrough.released(1)
    assert kernel.closed == [] and passthrough.held("/a")
    passthrough.released(2)
    assert kernel.closed == [1] and not passthrough.held("/a")
    assert passthrough.counters() == {"passthrough_opens": 2}


def test_a_file_open_through_the_mount_is_not_passed_through(
    table: tuple[Passthrough, Kernel],
) -> None:
    passthrough, _ = table
    assert not passthrough.opened(1, "/a", FileInfo(), backing_fd=None)  # a writer, say
    reader = FileInfo()
    assert not passthrough.opened(2, "/a", reader, backing_fd=10)
    assert reader.backing_id == 0
    passthrough.released(1)
    passthrough.released(2)
    assert passthrough.opened(3, "/a", FileInfo(), backing_fd=10)


def test_a_rename_moves_the_hold_and_frees_the_old_name(
    table: tuple[Passthrough, Kernel],
) -> None:
    passthrough, _ = table
    assert passthrough.opened(1, "/d/a", FileInfo(), backing_fd=10)
    passthrough.moved("/d", "/e")
    assert passthrough.held("/e/a") and not passthrough.held("/d/a")
    assert passthrough.opened(2, "/d/a", FileInfo(), backing_fd=11)  # a new file, a new id
    assert passthrough.opened(3, "/x", FileInfo(), backing_fd=12)
    passthrough.moved("/d/a", "/x")  # renamed over: the old /x is no longer under its name
    assert passthrough.held("/x")
    joined = FileInfo()
    assert passthrough.opened(4, "/x", joined, backing_fd=13)
    assert joined.backing_id == 2  # the renamed file's backing, not the replaced one's


def test_an_unlinked_name_is_not_joined(table: tuple[Passthrough, Kernel]) -> None:
    passthrough, kernel = table
    assert passthrough.opened(1, "/a", FileInfo(), backing_fd=10)
    passthrough.gone("/a")
    assert not passthrough.held("/a")
    fresh = FileInfo()
    assert passthrough.opened(2, "/a", fresh, backing_fd=11)
    assert fresh.backing_id == 2
    passthrough.released(1)
    assert kernel.closed == [1]


def test_a_refused_backing_file_turns_passthrough_off(monkeypatch: pytest.MonkeyPatch) -> None:
    passthrough = Passthrough(wanted=True)
    passthrough.negotiate(_conn(), (3, 17))
    Kernel(refuse=True).install(monkeypatch, passthrough)
    info = FileInfo(keep_cache=1)
    assert not passthrough.opened(1, "/a", info, backing_fd=10)
    assert info.backing_id == 0 and info.keep_cache == 1
    assert not passthrough.active
    assert not passthrough.opened(2, "/b", FileInfo(), backing_fd=10)


def test_a_writer_waits_for_releases_still_on_their_way(
    table: tuple[Passthrough, Kernel],
) -> None:
    passthrough, _ = table
    assert passthrough.opened(1, "/a", FileInfo(), backing_fd=10)
    assert passthrough.held("/a", wait=0.05)  # a reader that keeps it open: still held
    late = threading.Timer(0.1, passthrough.released, args=(1,))
    late.start()
    try:
        assert not passthrough.held("/a", wait=5.0)  # the release arrived while it waited
    finally:
        late.join()
