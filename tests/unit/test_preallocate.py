"""Part files reserve their blocks up front, and a full disk says so before any byte is read."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tiercache.tiers.preallocate import preallocate

MiB = 1024 * 1024


def test_blocks_are_reserved_and_the_size_is_unchanged(small_tier: Path) -> None:
    fd = os.open(small_tier / "part", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert preallocate(fd, 2 * MiB) is True
        st = os.fstat(fd)
        assert st.st_size == 0  # grows as bytes are written, as without preallocation
        assert st.st_blocks * 512 >= 2 * MiB
    finally:
        os.close(fd)


def test_no_room_raises_enospc(small_tier: Path) -> None:
    fd = os.open(small_tier / "part", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError) as err:
            preallocate(fd, 64 * MiB)  # the tmpfs holds 8 MiB
        assert err.value.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_nothing_to_reserve(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "part", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert preallocate(fd, 0) is False
        assert os.fstat(fd).st_blocks == 0
    finally:
        os.close(fd)
