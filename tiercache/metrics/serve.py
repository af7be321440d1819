"""Serving the node's metrics over HTTP or into a textfile, for the CLI and the mount."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiercache.config import TierCacheConfig
from tiercache.errors import TierCacheError
from tiercache.metrics.node import NodeReader

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

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
        return f"http://{host}:{self.port}/metrics"


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
    from prometheus_client import start_http_server  # noqa: PLC0415  (the extra)

    try:
        server, thread = start_http_server(address.port, address.host, registry=registry)
    except OSError as exc:
        raise MetricsError(f"cannot listen on {address.host}:{address.port}: {exc}") from None

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return ListenAddress(address.host, int(server.server_port)), stop


def write_textfile(registry: CollectorRegistry, path: str) -> None:
    """Write the node's families to ``path`` for node_exporter (temp file + rename)."""
    from prometheus_client import write_to_textfile  # noqa: PLC0415  (the extra)

    write_to_textfile(path, registry)


def exposition_text(registry: CollectorRegistry) -> str:
    """The node's families in Prometheus text format."""
    from prometheus_client import generate_latest  # noqa: PLC0415  (the extra)

    return generate_latest(registry).decode()
