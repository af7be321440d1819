"""Serving the node's metrics over HTTP or into a textfile, for the CLI and the mount."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from tiercache.config import TierCacheConfig
from tiercache.errors import TierCacheError
from tiercache.metrics.node import NodeReader

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from prometheus_client.registry import CollectorRegistry

# The one path served; any other is answered 404 (a scraper pointed at the wrong path, or
# a probe, learns so instead of getting the metrics).
METRICS_PATH = "/metrics"
MISSING_EXTRA = (
    "Prometheus metrics need prometheus_client: pip install 'tiercache[metrics]' "
    "(the metrics extra)"
)


class MetricsError(TierCacheError, ValueError):
    """Metrics cannot be served as asked (a bad address, or the ``metrics`` extra missing)."""


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{METRICS_PATH}"


def parse_listen(text: str) -> ListenAddress:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6; PORT 0: any free port) → ``ListenAddress``."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise MetricsError(f"bad listen address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return ListenAddress(host, int(port))


def require_prometheus_client() -> None:
    """Raise ``MetricsError`` naming the extra when ``prometheus_client`` is not installed."""
    try:
        import prometheus_client  # noqa: F401, PLC0415  (an optional extra)
    except ImportError:
        raise MetricsError(MISSING_EXTRA) from None


def node_registry(config: TierCacheConfig) -> CollectorRegistry:
    """A registry that reads the node of ``config``'s local tier at every scrape."""
    require_prometheus_client()
    from tiercache.metrics.exposition import registry_for  # noqa: PLC0415  (the extra)

    return registry_for(NodeReader(config))


def start_http(
    config: TierCacheConfig, address: ListenAddress
) -> tuple[ListenAddress, Callable[[], None]]:
    """Serve ``/metrics`` on ``address`` from a daemon thread; returns where, and a stop."""
    registry = node_registry(config)
    from prometheus_client import make_wsgi_app  # noqa: PLC0415  (the extra)

    app = only_metrics_path(make_wsgi_app(registry))
    try:
        family, host = _best_family(address)
        server_class = _MetricsServer6 if family == socket.AF_INET6 else _MetricsServer
        server = make_server(host, address.port, app, server_class, _QuietHandler)
    except OSError as exc:
        raise MetricsError(f"cannot listen on {address.host}:{address.port}: {exc}") from None
    thread = threading.Thread(target=server.serve_forever, name="tiercache-metrics-http")
    thread.daemon = True
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return ListenAddress(address.host, int(server.server_port)), stop


def only_metrics_path(app: WSGIApplication) -> WSGIApplication:
    """``app`` at ``/metrics`` (its query string kept: ``?name[]=``); 404 at any other path."""

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == METRICS_PATH:
            return app(environ, start_response)
        body = f"not found: the metrics are at {METRICS_PATH}\n".encode()
        headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
        ]
        start_response("404 Not Found", headers)
        return [body]

    return serve


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the process at exit


class _MetricsServer6(_MetricsServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one every few seconds, for as long as it runs)."""


def _best_family(address: ListenAddress) -> tuple[socket.AddressFamily, str]:
    """The address family and host to bind ``address`` with (IPv6 where the host is one)."""
    infos = socket.getaddrinfo(
        address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])


def write_textfile(registry: CollectorRegistry, path: str) -> None:
    """Write the node's families to ``path`` for node_exporter (temp file + rename).

    A failure names ``path``, never the temp file beside it.
    """
    from prometheus_client import write_to_textfile  # noqa: PLC0415  (the extra)

    try:
        write_to_textfile(path, registry)
    except OSError as exc:
        directory = os.path.dirname(os.path.abspath(path))
        if isinstance(exc, FileNotFoundError) and not os.path.isdir(directory):
            reason = f"no directory {directory}"
        else:
            reason = exc.strerror or str(exc)
        raise MetricsError(f"cannot write the textfile {path}: {reason}") from None


def exposition_text(registry: CollectorRegistry) -> str:
    """The node's families in Prometheus text format."""
    from prometheus_client import generate_latest  # noqa: PLC0415  (the extra)

    return generate_latest(registry).decode()
