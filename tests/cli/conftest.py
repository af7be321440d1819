"""The CLI tests' fixtures (``cli``, ``mount``), shared with ``tests/mount``."""

from support.mount_fixtures import cli, mount

__all__ = ["cli", "mount"]
