"""The mount tests' fixtures (``cli``, ``mount``), shared with ``tests/cli``."""

from support.mount_fixtures import cli, mount

__all__ = ["cli", "mount"]
