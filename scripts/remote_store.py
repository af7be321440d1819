"""Remote-store emulator: an HTTP/1.1 proxy on 127.0.0.1 that paces an S3 endpoint like a far one.

A loopback SeaweedFS answers at once and serves one stream at local-disk speed; a real object
store adds tens of milliseconds to each request and gives one connection a small share of the
link (AWS: ~85-90 MB/s per connection, 8-16 MB ranged GETs, many connections at once). This
proxy adds, per request, one delay before forwarding it (round trip + first byte), and paces
bodies in both directions with a token bucket per connection and one shared by all connections.

    with RemoteStore(upstream_url, profile="s3-region") as rs:
        client = boto3.client("s3", endpoint_url=rs.url, ...)

    python scripts/remote_store.py --upstream URL --profile s3-region [--port P]

Profiles (rates in bytes/s; 0 = unlimited):
- ``loopback``: no shaping; the proxy is not inserted at all (``url`` is the upstream).
- ``s3-region``: 25 ms per request, 25 MiB/s per connection, 100 MiB/s for all together. S3 in
  the same region scaled down for a 2-core machine: first byte in tens of ms, one connection
  well below the link (real: ~85-90 MB/s of a 10-100 Gb/s NIC), so it takes parallel ranged
  GETs to fill the aggregate.
- ``cross-region``: 90 ms per request (an inter-region round trip), 10 MiB/s per connection
  (TCP window / RTT), 100 MiB/s aggregate.
Knobs override a profile: ``latency_s``, ``conn_bps``, ``total_bps``, ``error_rate`` (fraction
of requests answered with a 503 SlowDown S3 error, drawn from a RNG seeded with ``seed``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

MiB = 1024 * 1024
HOST = "127.0.0.1"
PIECE = 256 * 1024  # bytes per read, and per pacing step (10 ms at 25 MiB/s)
_HEAD_LIMIT = 65537
_EOL = (b"\r\n", b"\n", b"")


@dataclass(frozen=True)
class Profile:
    """How the emulated store behaves; rates in bytes/s, 0 = unlimited."""

    name: str
    latency_s: float = 0.0
    conn_bps: float = 0.0
    total_bps: float = 0.0
    error_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.latency_s, self.conn_bps, self.total_bps) < 0:
            raise ValueError("latency_s, conn_bps and total_bps must be >= 0")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("error_rate must be in [0, 1]")

    @property
    def passthrough(self) -> bool:
        """True when nothing is shaped: then no proxy is needed."""
        return not (self.latency_s or self.conn_bps or self.total_bps or self.error_rate)


PROFILES: dict[str, Profile] = {
    "loopback": Profile("loopback"),
    "s3-region": Profile("s3-region", latency_s=0.025, conn_bps=25 * MiB, total_bps=100 * MiB),
    "cross-region": Profile(
        "cross-region", latency_s=0.090, conn_bps=10 * MiB, total_bps=100 * MiB
    ),
}


def resolve_profile(
    name: str,
    *,
    latency_s: float | None = None,
    conn_bps: float | None = None,
    total_bps: float | None = None,
    error_rate: float | None = None,
    seed: int | None = None,
) -> Profile:
    """The named profile with the knobs that are given (not None) replacing its values."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
    base = PROFILES[name]
    return Profile(
        name,
        latency_s=base.latency_s if latency_s is None else latency_s,
        conn_bps=base.conn_bps if conn_bps is None else conn_bps,
        total_bps=base.total_bps if total_bps is None else total_bps,
        error_rate=base.error_rate if error_rate is None else error_rate,
        seed=base.seed if seed is None else seed,
    )


class TokenBucket:
    """A token bucket kept as a virtual clock: ``reserve(n)`` books n bytes and says how long
    to wait before sending them. Thread-safe, so one bucket can be shared by connections."""

    def __init__(self, rate: float, burst: int = PIECE) -> None:
        self._seconds_per_byte = 1.0 / rate
        self._burst_s = burst / rate
        self._busy_until = 0.0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> float:
        with self._lock:
            now = time.monotonic()
            self._busy_until = max(self._busy_until, now) + n * self._seconds_per_byte
            return self._busy_until - now - self._burst_s


class _Pacer:
    """The buckets one direction of one connection draws from: its own and the shared one."""

    def __init__(self, own: TokenBucket | None, shared: TokenBucket | None) -> None:
        self._buckets = [b for b in (own, shared) if b is not None]

    def pace(self, n: int) -> None:
        if self._buckets:
            wait = max(b.reserve(n) for b in self._buckets)
            if wait > 0:
                time.sleep(wait)


def _reader(sock: socket.socket) -> io.BufferedReader:
    return io.BufferedReader(socket.SocketIO(sock, "rb"), PIECE)


def _read_head(rfile: io.BufferedReader) -> tuple[bytes, str, dict[str, str]]:
    """A request or response head: raw bytes, first line and lower-cased headers."""
    first = rfile.readline(_HEAD_LIMIT)
    while first in (b"\r\n", b"\n"):
        first = rfile.readline(_HEAD_LIMIT)
    if not first:
        raise EOFError("connection closed")
    raw, headers = [first], {}
    while (line := rfile.readline(_HEAD_LIMIT)) not in _EOL:
        raw.append(line)
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return b"".join(raw) + b"\r\n", first.decode("latin-1").strip(), headers


def _relay(
    src: io.BufferedReader,
    dst: socket.socket | None,
    headers: dict[str, str],
    pacer: _Pacer,
    to_eof: bool,
    sent_bytes: Callable[[int], None] | None = None,
) -> int:
    """Copy a body (chunked, Content-Length, else to EOF when ``to_eof``) to ``dst`` (None:
    drop it); return its size. ``sent_bytes`` is told of each piece as it goes (a body the
    client stops reading half way counts what it was sent)."""
    buf = memoryview(bytearray(PIECE))
    send = dst.sendall if dst is not None else _drop

    def copy(left: int) -> int:  # left < 0: until EOF
        sent = 0
        while left != 0:
            n = src.readinto1(buf[: PIECE if left < 0 else min(PIECE, left)])
            if not n:
                if left > 0:
                    raise EOFError("body ended early")
                break
            pacer.pace(n)
            send(buf[:n])
            if sent_bytes is not None:
                sent_bytes(n)
            sent += n
            left -= n if left > 0 else 0
        return sent

    if "chunked" in headers.get("transfer-encoding", "").lower():
        total = 0
        while True:
            size_line = src.readline(_HEAD_LIMIT)
            send(size_line)
            size = int(size_line.split(b";")[0], 16)
            if size == 0:  # trailers, then the blank line
                while (line := src.readline(_HEAD_LIMIT)) not in _EOL:
                    send(line)
                send(line)
                return total
            total += copy(size + 2)  # the data and its CRLF
    length = headers.get("content-length")
    if length is None:
        return copy(-1) if to_eof else 0
    return copy(int(length))


def _drop(data: bytes | memoryview) -> None:
    pass


def _slow_down(method: str, target: str, close: bool) -> bytes:
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        "<Message>Please reduce your request rate.</Message>"
        f"<Resource>{target.split('?', 1)[0]}</Resource>"
        "<RequestId>remote-store</RequestId></Error>"
    )
    body = b"" if method == "HEAD" else xml.encode()
    head = ["HTTP/1.1 503 Slow Down", "Content-Type: application/xml"]
    head += [f"Content-Length: {len(body)}", "x-amz-request-id: remote-store"]
    head += ["Connection: close"] if close else []
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Upstream:
    """One client connection's persistent (keep-alive) connection to the store."""

    def __init__(self, address: tuple[str, int]) -> None:
        self._address = address
        self.sock: socket.socket | None = None
        self.rfile: io.BufferedReader | None = None

    def connect(self) -> tuple[socket.socket, io.BufferedReader]:
        """The open connection, or a new one if there is none or the store closed it."""
        if self.sock is not None and self.rfile is not None:
            # Readable while idle means EOF (or junk): the store dropped it; do not reuse.
            idle = select.poll()  # poll, not select: descriptors may be numbered past 1024
            idle.register(self.sock, select.POLLIN)
            if not idle.poll(0):
                return self.sock, self.rfile
            self.close()
        sock = socket.create_connection(self._address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.rfile = sock, _reader(sock)
        return sock, self.rfile

    def close(self) -> None:
        if self.rfile is not None:
            self.rfile.close()
        if self.sock is not None:
            self.sock.close()
        self.sock = self.rfile = None


class ConnectionServer:
    """A listener on 127.0.0.1 that serves each connection in a thread of its own until
    ``close()``; a subclass says how to serve one connection (``_converse``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clients: dict[socket.socket, threading.Thread] = {}
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self.url = ""

    def _listen(self, port: int = 0, nodelay: bool = False) -> None:
        """Start accepting on ``port`` (0: any free one); ``url`` then points at it."""
        self._listener = socket.create_server((HOST, port))
        self._listener.settimeout(0.1)
        self.url = f"http://{HOST}:{self._listener.getsockname()[1]}"
        self._acceptor = threading.Thread(target=self._accept_loop, args=(nodelay,), daemon=True)
        self._acceptor.start()

    def close(self) -> None:
        """Stop accepting, drop every client connection and join the threads."""
        self._stop.set()
        if self._acceptor is None or self._listener is None:
            return
        self._acceptor.join(timeout=5)
        self._listener.close()
        with self._lock:
            clients = dict(self._clients)
        for sock, thread in clients.items():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            thread.join(timeout=5)

    def _accept_loop(self, nodelay: bool) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            if nodelay:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            with self._lock:
                self._clients[sock] = thread
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            self._converse(sock)
        except (OSError, EOFError, ValueError, IndexError):
            pass  # the client or the store went away, or spoke nonsense: drop the connection
        finally:
            sock.close()
            with self._lock:
                self._clients.pop(sock, None)

    def _converse(self, sock: socket.socket) -> None:
        """Serve requests on ``sock`` until it must close."""
        raise NotImplementedError


class RemoteStore(ConnectionServer):
    """A pacing proxy in front of ``upstream`` (an ``http://`` S3 endpoint), in this process.

    ``url`` is where clients connect: the upstream itself for a profile that shapes nothing.
    ``requests``, ``errors`` (injected), ``continues`` (100 Continue relayed), ``bytes_up`` and
    ``bytes_down`` (bodies) count what went through.
    """

    def __init__(
        self,
        upstream: str,
        profile: str = "s3-region",
        *,
        port: int = 0,
        latency_s: float | None = None,
        conn_bps: float | None = None,
        total_bps: float | None = None,
        error_rate: float | None = None,
        seed: int | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, not {upstream!r}")
        self.profile = resolve_profile(
            profile,
            latency_s=latency_s,
            conn_bps=conn_bps,
            total_bps=total_bps,
            error_rate=error_rate,
            seed=seed,
        )
        self.upstream = upstream.rstrip("/")
        self._address = (parts.hostname, parts.port or 80)
        self._rng = random.Random(self.profile.seed)
        super().__init__()
        self.requests = self.errors = self.continues = self.bytes_up = self.bytes_down = 0
        total = self.profile.total_bps
        self._shared_up = TokenBucket(total) if total else None
        self._shared_down = TokenBucket(total) if total else None
        if self.profile.passthrough:
            self.url = self.upstream
            return
        self._listen(port, nodelay=True)

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pacers(self) -> tuple[_Pacer, _Pacer]:
        """(up, down) pacers for a new connection: its own buckets plus the shared ones."""
        rate = self.profile.conn_bps
        return (
            _Pacer(TokenBucket(rate) if rate else None, self._shared_up),
            _Pacer(TokenBucket(rate) if rate else None, self._shared_down),
        )

    def _converse(self, sock: socket.socket) -> None:
        rfile = _reader(sock)
        upstream = _Upstream(self._address)
        up, down = self._pacers()
        try:
            while not self._stop.is_set() and self._handle(sock, rfile, upstream, up, down):
                pass
        finally:
            upstream.close()
            rfile.close()

    def _fail_this_one(self) -> bool:
        with self._lock:
            self.requests += 1
            fail = self.profile.error_rate > 0 and self._rng.random() < self.profile.error_rate
            self.errors += fail
        return fail

    def _count_down(self, sent: int) -> None:
        with self._lock:
            self.bytes_down += sent

    def _count(self, up: int = 0, down: int = 0) -> None:
        with self._lock:
            self.bytes_up += up
            self.bytes_down += down

    def _handle(
        self,
        sock: socket.socket,
        rfile: io.BufferedReader,
        upstream: _Upstream,
        up: _Pacer,
        down: _Pacer,
    ) -> bool:
        """Serve one request; False when the client connection must close."""
        head, line, headers = _read_head(rfile)
        method, target = line.split(" ")[:2]
        expect = headers.get("expect", "").lower() == "100-continue"
        if self.profile.latency_s:
            self._stop.wait(self.profile.latency_s)
        if self._fail_this_one():
            if not expect:  # read the whole request first, as a server does
                _relay(rfile, None, headers, _Pacer(None, None), to_eof=False)
            sock.sendall(_slow_down(method, target, close=expect))
            return not expect  # a client told to stop before its body: do not reuse
        usock, ufile = upstream.connect()
        usock.sendall(head)
        if not expect:
            self._count(up=_relay(rfile, usock, headers, up, to_eof=False))
        while True:  # interim 1xx answers (100 Continue), then the final one
            resp_head, status_line, resp_headers = _read_head(ufile)
            status = int(status_line.split(" ")[1])
            if status >= 200:
                break
            sock.sendall(resp_head)
            if status == 100 and expect:
                with self._lock:
                    self.continues += 1
                self._count(up=_relay(rfile, usock, headers, up, to_eof=False))
                expect = False
        sock.sendall(resp_head)
        if method != "HEAD" and status not in (204, 304):
            _relay(ufile, sock, resp_headers, down, to_eof=True, sent_bytes=self._count_down)
        close = resp_headers.get("connection", "").lower() == "close" or (
            "content-length" not in resp_headers
            and "chunked" not in resp_headers.get("transfer-encoding", "").lower()
            and method != "HEAD"
            and status not in (204, 304)
        )
        if close:
            upstream.close()
        return not expect and not close


# -- a proxy in its own process (benchmarks: its CPU is then its own) --------------------------


@dataclass(frozen=True)
class Spawned:
    url: str
    pid: int | None  # None when the profile shapes nothing and no proxy runs


@contextlib.contextmanager
def spawn(upstream: str, profile: str = "s3-region", **knobs: float) -> Iterator[Spawned]:
    """Run the proxy as ``python scripts/remote_store.py`` in a child process until exit."""
    if resolve_profile(profile, **knobs).passthrough:  # type: ignore[arg-type]
        yield Spawned(upstream.rstrip("/"), None)
        return
    argv = [sys.executable, os.path.abspath(__file__), "--upstream", upstream, "--profile", profile]
    for name, value in knobs.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"remote_store did not start (exit {child.poll()})")
        yield Spawned(url, child.pid)
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


# -- command line ------------------------------------------------------------------------------

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": MiB, "gi": 1024 * MiB}


def parse_rate(text: str) -> float:
    """Bytes/s from ``26214400``, ``25MiB`` or ``90MB`` (a trailing ``/s`` or ``B`` is fine)."""
    match = re.fullmatch(r"\s*([0-9.e+]+)\s*((?:[kmg]i?)?)b?(?:/s)?\s*", text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="remote_store", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="the S3 endpoint, http://host:port")
    p.add_argument("--profile", default="s3-region", choices=sorted(PROFILES))
    p.add_argument("--port", type=int, default=0, help="listen port (default: a free one)")
    p.add_argument("--latency-s", type=float, help="delay added to each request")
    p.add_argument("--conn-bps", type=parse_rate, help="per-connection rate, e.g. 25MiB; 0=off")
    p.add_argument("--total-bps", type=parse_rate, help="rate of all connections; 0=off")
    p.add_argument("--error-rate", type=float, help="fraction of requests answered 503")
    p.add_argument("--seed", type=int, help="seed of the error RNG")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        store = RemoteStore(
            args.upstream,
            args.profile,
            port=args.port,
            latency_s=args.latency_s,
            conn_bps=args.conn_bps,
            total_bps=args.total_bps,
            error_rate=args.error_rate,
            seed=args.seed,
        )
    except (OSError, ValueError) as exc:
        print(f"remote_store: {exc}", file=sys.stderr)
        return 1
    print(store.url, flush=True)
    try:
        with store:
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
