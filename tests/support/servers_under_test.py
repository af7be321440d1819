"""The S3 servers tests talk to: the server under test (``S3Endpoint``) and a private one.

Test modules import these types from here (``from support.servers_under_test import ...``);
``from conftest import ...`` would find whichever folder's conftest came first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.s3server import S3Endpoint, s3server

__all__ = ["OwnServer", "S3Endpoint"]


class OwnServer:
    """A SeaweedFS a test module starts for itself, whatever ``TIERCACHE_TEST_S3_ENDPOINT`` says.

    For tests of tiercache while its store is frozen (SIGSTOP), stopped or restarted: a test can
    only do that to a server it owns. Such tests check tiercache's side of those faults; they do
    not test the server under test (the ``s3`` fixture).
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._server = s3server.start_server(data_dir=str(data_dir))
        self.port = self._server.port
        self.endpoint = self._server.s3

    def client(self) -> Any:
        return self.endpoint.client()

    def env(self) -> dict[str, str]:
        """``AWS_*`` variables that point boto3, s3fs and the tiercache CLI at this server."""
        return self._server.env()

    def pause(self) -> None:
        self._server.pause()

    def resume(self) -> None:
        self._server.resume()

    def stop(self) -> None:
        self._server.stop()

    def restart(self) -> None:
        """Stop the server process and start a new one on the same port and data."""
        self._server.stop()
        self._server = s3server.start_server(port=self.port, data_dir=str(self.data_dir))
