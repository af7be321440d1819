"""The ``cli`` and ``mount`` fixtures: the CLI against the server under test, and mounts made
with ``tiercache mount`` that never outlive their test.

Mounts are made in a subprocess (background mode) against the real S3 server; teardown
unmounts with ``tiercache unmount``, falls back to a lazy unmount, and kills the mount process
if it lingers, so a failing test leaves no stale mount behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.mount_helpers import Cli, cleanup_mount, make_cli, mounted, server_env


@pytest.fixture
def cli(s3: Any, tmp_path: Path) -> Cli:
    return make_cli(tmp_path, server_env(s3.endpoint, s3.key, s3.secret, s3.region))


@pytest.fixture
def mount(cli: Cli, tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``mount(url, *flags)`` mounts with the CLI and returns the mountpoint."""
    made: list[tuple[str, int]] = []

    def do_mount(url: str, *flags: str, name: str = "mnt") -> Path:
        mountpoint = tmp_path / name
        mountpoint.mkdir()
        report = cli.json("mount", url, str(mountpoint), *flags)
        made.append((str(mountpoint), int(report["pid"])))
        assert mounted(str(mountpoint))
        return mountpoint

    yield do_mount
    for mountpoint, pid in made:
        cleanup_mount(cli, mountpoint, pid)
