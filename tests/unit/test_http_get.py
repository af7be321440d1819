"""The signed GETs' own HTTP/1.1 connections, against a scripted server on a real socket: each
framing of a body, reuse and its limits, a connection the server dropped, and every failure
surfacing as an error the store retries (or, for a certificate, does not)."""

from __future__ import annotations

import gc
import shutil
import socket
import ssl
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tiercache.store.http_get import GetConnections, HttpProtocolError, ssl_context_for
from tiercache.store.retry import RetryableError
from tiercache.store.s3_errors import translate_transport_error

# A reply script gets the connection's socket and the request's number on that connection
# (0 first) after the request's head was read; it sends what it likes. Returning False
# closes the connection.
Script = Callable[[socket.socket, int], bool]
Pair = tuple[Path, Path]  # a certificate and its key


class ScriptedServer:
    """A loopback HTTP server whose every reply is scripted by the test."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            pending = b""
            n = 0
            while True:
                while b"\r\n\r\n" not in pending:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                head, pending = pending.split(b"\r\n\r\n", 1)
                self.requests.append(head)
                if not self.script(sock, n):
                    return
                n += 1
        except OSError:
            return
        finally:
            sock.close()

    def close(self) -> None:
        self.listener.close()


Serve = Callable[..., "ScriptedServer"]


@pytest.fixture
def serve() -> Iterator[Callable[..., ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Script, tls: ssl.SSLContext | None = None) -> ScriptedServer:
        server = ScriptedServer(script, tls)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def connections(
    server: ScriptedServer,
    read_timeout: float = 5.0,
    scheme: str = "http",
    context: ssl.SSLContext | None = None,
    keep: int = 4,
) -> GetConnections:
    return GetConnections(
        scheme,
        "127.0.0.1",
        server.port,
        connect_timeout=5.0,
        read_timeout=read_timeout,
        keep=keep,
        ssl_context=context,
    )


def fixed(body: bytes, extra: str = "") -> bytes:
    head = f'HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nETag: "e"\r\n{extra}\r\n'
    return head.encode() + body


def read_all(reply: object) -> bytes:
    out = bytearray()
    buf = memoryview(bytearray(1000))  # smaller than the bodies: several reads each
    while n := reply.readinto(buf):  # type: ignore[attr-defined]
        out += buf[:n]
    return bytes(out)


def get(pool: GetConnections, target: str = "/b/k", **headers: str) -> tuple[int, bytes]:
    reply = pool.get(target, "example", headers)
    body = read_all(reply)
    reply.release_conn()
    return reply.status, body


def test_bodies_by_length_are_read_whole_and_the_connection_is_reused(serve: Serve) -> None:
    bodies = [bytes(range(256)) * 40, b"", b"x" * 70000]

    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(fixed(bodies[n % 3]))
        return True

    server = serve(script)
    pool = connections(server)
    for i in range(6):
        assert get(pool) == (200, bodies[i % 3])
    assert server.connections == 1
    assert pool.idle_count() == 1
    request = server.requests[0].decode()
    assert request.startswith("GET /b/k HTTP/1.1\r\nHost: example\r\n")


def test_headers_are_sent_as_given_and_reply_headers_read_by_lower_case_name(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(fixed(b"ok", "X-Amz-Meta-A: 1\r\nX-Amz-Meta-A: 2\r\nLast-Modified: x\r\n"))
        return True

    server = serve(script)
    pool = connections(server)
    reply = pool.get("/b/k%20y", "example:9000", {"range": "bytes=0-1", "x-amz-date": "d"})
    assert reply.status == 200
    assert reply.headers["content-length"] == "2" and reply.headers["etag"] == '"e"'
    assert reply.headers["x-amz-meta-a"] == "1, 2"
    assert reply.read() == b"ok"
    lines = server.requests[0].decode().split("\r\n")
    assert lines[0] == "GET /b/k%20y HTTP/1.1"
    assert "Host: example:9000" in lines and "range: bytes=0-1" in lines


def test_a_chunked_body_with_extensions_and_trailers(serve: Serve) -> None:
    body = b"".join(bytes([i]) * (i * 37 + 1) for i in range(40))

    def script(sock: socket.socket, n: int) -> bool:
        out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for i in range(0, len(body), 333):
            piece = body[i : i + 333]
            out += f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n"
        out += b"0\r\nX-Trailer: t\r\n\r\n"
        for i in range(0, len(out), 100):  # dribbled out, so every state meets a short read
            sock.sendall(out[i : i + 100])
        return True

    server = serve(script)
    pool = connections(server)
    assert get(pool) == (200, body)
    assert get(pool) == (200, body)
    assert server.connections == 1


def test_a_body_ended_by_the_connection_is_not_reused(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + b"z" * 5000)
        return False

    server = serve(script)
    pool = connections(server)
    assert get(pool) == (200, b"z" * 5000)
    assert get(pool) == (200, b"z" * 5000)
    assert server.connections == 2 and pool.idle_count() == 0


def test_connection_close_and_http_1_0_are_honoured(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        if n == 0:
            sock.sendall(fixed(b"a", "Connection: close\r\n"))
        else:
            sock.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb")
        return True

    server = serve(script)
    pool = connections(server)
    assert get(pool) == (200, b"a")
    assert pool.idle_count() == 0


def test_interim_replies_are_skipped(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n")
        sock.sendall(fixed(b"body"))
        return True

    pool = connections(serve(script))
    assert get(pool) == (200, b"body")


def test_an_idle_connection_the_server_closed_is_replaced(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(fixed(b"one"))
        return False  # keep-alive promised, then closed while the client holds it idle

    server = serve(script)
    pool = connections(server)
    assert get(pool) == (200, b"one")
    time.sleep(0.2)  # the close reached the client
    assert get(pool) == (200, b"one")
    assert server.connections == 2


def test_a_reused_connection_dropped_after_the_request_is_sent_once_more(serve: Serve) -> None:
    # The server takes the second request on the kept connection and closes without a reply,
    # as one does whose keep-alive time ran out while the request was on its way.
    def script(sock: socket.socket, n: int) -> bool:
        if n == 1:
            return False
        sock.sendall(fixed(b"again"))
        return True

    server = serve(script)
    pool = connections(server)
    assert get(pool) == (200, b"again")
    assert get(pool) == (200, b"again")  # on a new connection, no error
    assert server.connections == 2


def test_a_new_connection_closed_before_the_reply_is_a_retried_error(serve: Serve) -> None:
    pool = connections(serve(lambda sock, n: False))
    with pytest.raises(HttpProtocolError) as caught:
        pool.get("/b/k", "example", {})
    translated = translate_transport_error(caught.value, "GetObject", "b", "k")
    assert isinstance(translated, RetryableError)
    assert "closed the connection before answering" in str(translated)


def test_a_body_cut_short_is_a_retried_error_and_costs_the_connection(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"q" * 500)
        return False

    pool = connections(serve(script))
    reply = pool.get("/b/k", "example", {})
    with pytest.raises(HttpProtocolError, match="cut short") as caught:
        read_all(reply)
    assert isinstance(
        translate_transport_error(caught.value, "GetObject", "b", "k"), RetryableError
    )
    reply.release_conn()
    assert pool.idle_count() == 0


def test_a_read_that_breaks_returns_the_bytes_that_came_then_raises(serve: Serve) -> None:
    # As http.client's read(n): the bytes before the break are the caller's (a ranged read
    # resumes from the last byte it got), and the break is raised by the next read, every time.
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n" + b"r" * 123457)
        return False

    pool = connections(serve(script))
    reply = pool.get("/b/k", "example", {})
    assert reply.read(1 << 20) == b"r" * 123457
    for _ in range(2):
        with pytest.raises(HttpProtocolError, match="cut short"):
            reply.read(10)
        with pytest.raises(HttpProtocolError, match="cut short"):
            reply.readinto(bytearray(10))


def test_a_body_left_unread_costs_the_connection(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(fixed(b"w" * 10000))
        return True

    server = serve(script)
    pool = connections(server)
    reply = pool.get("/b/k", "example", {})
    assert reply.read(10) == b"w" * 10
    reply.release_conn()  # the rest would be taken for the next reply's start
    assert pool.idle_count() == 0
    assert get(pool) == (200, b"w" * 10000)
    assert server.connections == 2


def test_a_silent_server_is_a_read_timeout_that_names_itself(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        time.sleep(3)
        return False

    pool = connections(serve(script), read_timeout=0.3)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        pool.get("/b/k", "example", {})
    assert time.monotonic() - start < 2.5
    translated = translate_transport_error(caught.value, "GetObject", "b", "k")
    assert isinstance(translated, RetryableError)
    assert "read timeout after 0.3 s" in str(translated)


def test_a_refused_connection_is_a_retried_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed below: nothing listens there any more
    pool = GetConnections("http", "127.0.0.1", port, connect_timeout=2, read_timeout=2, keep=1)
    with pytest.raises(ConnectionError) as caught:
        pool.get("/b/k", "example", {})
    translated = translate_transport_error(caught.value, "GetObject", "b", "k")
    assert isinstance(translated, RetryableError) and "connection refused" in str(translated)


@pytest.mark.parametrize(
    "reply",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 2xx OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (70 * 1024) + b"\r\n\r\n",
    ],
    ids=["not-http", "bad-status", "bad-header", "bad-length", "headers-too-long"],
)
def test_malformed_replies_are_protocol_errors(serve: Serve, reply: bytes) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(reply)
        return True

    pool = connections(serve(script))
    with pytest.raises(HttpProtocolError):
        pool.get("/b/k", "example", {})
    assert pool.idle_count() == 0


def test_a_header_that_would_split_the_request_is_refused_unsent(serve: Serve) -> None:
    server = serve(lambda sock, n: False)
    pool = connections(server)
    for name, value in (("if-match", 'x"\r\nX-Evil: 1'), ("x-a\r\nb", "v"), ("x:y", "v")):
        with pytest.raises(ValueError):
            pool.get("/b/k", "example", {name: value})
    assert server.connections == 0


def test_connections_dropped_with_their_pool_or_reply_are_closed(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(fixed(b"d" * 5000))
        return True

    server = serve(script)
    gc.collect()  # what earlier tests left is not this test's to judge
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pool = connections(server)
        assert get(pool) == (200, b"d" * 5000)  # one idle connection in the pool
        unread = pool.get("/b/k", "example", {})  # and one held by a reply never closed
        assert unread.read(10) == b"d" * 10
        del pool, unread
        gc.collect()
    # The client's sockets are the ones connected to the server's port (the server's own
    # sockets end on their thread's schedule, and other tests' garbage may be collected here).
    ours = f"raddr=('127.0.0.1', {server.port})"
    unclosed = [
        str(w.message)
        for w in caught
        if issubclass(w.category, ResourceWarning) and ours in str(w.message)
    ]
    assert not unclosed, unclosed


def test_connections_beyond_the_pool_size_are_closed(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(fixed(b"p"))
        return True

    pool = connections(serve(script), keep=2)
    replies = [pool.get("/b/k", "example", {}) for _ in range(4)]  # four at once
    for reply in replies:
        assert reply.read() == b"p"
        reply.release_conn()
    assert pool.idle_count() == 2


def test_many_threads_share_the_connections(serve: Serve) -> None:
    def script(sock: socket.socket, n: int) -> bool:
        target = server.requests[-1].split(b" ")[1]
        sock.sendall(fixed(target * 100))
        return True

    server = serve(script)
    pool = connections(server, keep=8)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(50):
                target = f"/b/{t}-{i}"
                assert get(pool, target) == (200, target.encode() * 100)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert server.connections <= 8 + 8  # reused, not one per request


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's certificate")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def tls_server(serve: Serve, certificate: Pair) -> ScriptedServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)

    def script(sock: socket.socket, n: int) -> bool:
        sock.sendall(fixed(b"secret bytes" * 1000))
        return True

    server: ScriptedServer = serve(script, tls=context)
    return server


def test_https_with_the_bundle_that_signed_the_server(serve: Serve, certificate: Pair) -> None:
    server = tls_server(serve, certificate)
    pool = connections(server, scheme="https", context=ssl_context_for(str(certificate[0])))
    assert get(pool) == (200, b"secret bytes" * 1000)
    assert get(pool) == (200, b"secret bytes" * 1000)
    assert server.connections == 1


def test_https_refuses_an_untrusted_certificate_and_does_not_retry(
    serve: Serve, certificate: Pair
) -> None:
    server = tls_server(serve, certificate)
    pool = connections(server, scheme="https", context=ssl_context_for(True))
    with pytest.raises(ssl.SSLCertVerificationError) as caught:
        pool.get("/b/k", "example", {})
    translated = translate_transport_error(caught.value, "GetObject", "b", "k")
    assert not isinstance(translated, RetryableError)


def test_https_without_verification_when_told(serve: Serve, certificate: Pair) -> None:
    pool = connections(
        tls_server(serve, certificate), scheme="https", context=ssl_context_for(False)
    )
    assert get(pool) == (200, b"secret bytes" * 1000)
