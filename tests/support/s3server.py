"""``scripts/s3server.py``: the S3 server (SeaweedFS) the tests start, and its endpoint type."""

from __future__ import annotations

from support.scripts import load

s3server = load("s3server")
S3Endpoint = s3server.S3Endpoint
start_server = s3server.start_server

__all__ = ["S3Endpoint", "s3server", "start_server"]
