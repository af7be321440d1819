"""``GetConnections``: keep-alive HTTP/1.1 connections that send signed GETs and read the replies.

A GET of a small object through urllib3 and ``http.client`` spends more client CPU on the
exchange than on the bytes: a connection-pool checkout with a ``poll``, a ``Timeout`` object,
the request written header by header, the reply's headers parsed by the ``email`` package,
and a response object built around them (about 0.4 ms per GET, against 0.1 ms for the same
exchange written out here; a dataset of loose files pays it per file). This module does the
exchange for ``SignedGet`` alone: one request written in one ``sendall``, the status line and
headers split by hand, and the body read straight into the caller's buffer. It speaks the
HTTP/1.1 that object stores answer a GET with: a body framed by ``Content-Length``, by
chunks, or by the connection's end; interim ``1xx`` replies skipped; ``Connection: close``
honoured.

Connections are kept per origin, as many as the client's own pool keeps. One idle connection
the server has closed is noticed before reuse, and a request that fails on a reused one before
any byte of the reply came back is sent once more on a new connection (a GET is idempotent).
Every other failure below HTTP is a ``ConnectionError`` or ``TimeoutError``, which the store
retries; a certificate the client does not trust is not.
"""

from __future__ import annotations

import errno
import select
import socket
import ssl
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from botocore.httpsession import get_cert_path

_HEAD_LIMIT = 64 * 1024  # status line and headers, as http.client bounds them
_RECV = 64 * 1024
_DRAIN_LIMIT = 1024 * 1024  # an unread error body longer than this costs the connection
_NO_BODY = frozenset({204, 304})


class HttpProtocolError(ConnectionError):
    """The server's reply was not HTTP/1.x as expected, or it ended before its body did."""


class GetConnections:
    """Keep-alive connections to one origin; ``get`` sends one GET and returns its reply."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        *,
        connect_timeout: float | None,
        read_timeout: float | None,
        keep: int,
        ssl_context: ssl.SSLContext | None = None,
        socket_options: Sequence[tuple[int, int, int]] = (),
    ) -> None:
        if scheme not in ("http", "https"):
            raise ValueError(f"scheme {scheme!r}: only http and https")
        if scheme == "https" and ssl_context is None:
            raise ValueError("https needs an ssl_context")
        self.scheme = scheme
        self.host = host
        self.port = port
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._keep = max(1, keep)
        self._ssl = ssl_context if scheme == "https" else None
        self._socket_options = tuple(socket_options)
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def get(self, target: str, host_header: str, headers: Mapping[str, str]) -> GetReply:
        """Send ``GET target`` with ``headers`` and read the reply's head; the body is left
        for the reply's ``readinto``/``read``."""
        request = _request(target, host_header, headers)
        conn = self._take_idle()
        if conn is not None:
            try:
                return conn.exchange(request, self)
            except _StaleConnectionError:
                conn.close()  # closed by the server while idle: once more, on a new one
        return self._connect().exchange(request, self, fresh=True)

    def close(self) -> None:
        """Close the idle connections; replies still being read close theirs when done."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def idle_count(self) -> int:
        """How many connections wait for a request (for tests and stats)."""
        with self._lock:
            return len(self._idle)

    def _take_idle(self) -> _Connection | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()  # the most recently used: the least likely closed
            if conn.usable():
                return conn
            conn.close()

    def _put_back(self, conn: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self) -> _Connection:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self._connect_timeout)
        except TimeoutError as exc:
            raise TimeoutError(
                f"connect timeout={self._connect_timeout} to {self.host}:{self.port}"
            ) from exc
        except OSError as exc:
            raise _connection_error(exc, f"connecting to {self.host}:{self.port}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for level, name, value in self._socket_options:
                sock.setsockopt(level, name, value)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self._read_timeout)
        except ssl.SSLCertVerificationError:
            sock.close()
            raise  # not retried: the certificate is wrong, not the network
        except OSError as exc:
            sock.close()
            raise _connection_error(exc, f"setting up the connection to {self.host}") from exc
        return _Connection(sock, self._read_timeout)


class _StaleConnectionError(Exception):
    """A reused connection failed before any byte of the reply came back."""


class _Connection:
    """One socket with the bytes read past the last reply's end."""

    def __init__(self, sock: socket.socket, read_timeout: float | None) -> None:
        self.sock = sock
        self.read_timeout = read_timeout
        self.buffer = bytearray()

    def __del__(self) -> None:
        # A connection dropped with its pool (a filesystem garbage-collected) or with a reply
        # nobody closed: its socket is closed here, not left to warn as an unclosed one.
        self.close()

    def usable(self) -> bool:
        """Whether the idle connection is still open: a readable idle socket has been closed
        by the server (or holds bytes nobody asked for)."""
        if self.buffer:
            return False
        poller = select.poll()
        try:
            poller.register(self.sock, select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def exchange(self, request: bytes, owner: GetConnections, fresh: bool = False) -> GetReply:
        try:
            self.sock.sendall(request)
            head = self._read_head(first=True)
        except _StaleConnectionError:
            if fresh:
                self.close()
                raise HttpProtocolError(
                    f"{owner.host}:{owner.port} closed the connection before answering"
                ) from None
            raise
        except TimeoutError as exc:
            self.close()
            raise TimeoutError(f"read timeout={self.read_timeout} from {owner.host}") from exc
        except OSError as exc:  # HttpProtocolError too: it is a ConnectionError
            self.close()
            if not fresh and _is_reset(exc):
                raise _StaleConnectionError() from exc
            raise _connection_error(exc, f"GET from {owner.host}") from exc
        while 100 <= head[0] < 200:  # interim replies (100 Continue, 103 Early Hints)
            try:
                head = self._read_head(first=False)
            except TimeoutError as exc:
                self.close()
                raise TimeoutError(f"read timeout={self.read_timeout} from {owner.host}") from exc
            except OSError as exc:
                self.close()
                raise _connection_error(exc, f"GET from {owner.host}") from exc
        try:
            return GetReply(self, owner, *head)
        except HttpProtocolError:
            self.close()
            raise

    def _read_head(self, first: bool) -> tuple[int, dict[str, str], bool]:
        """The status, the headers (names in lower case) and whether HTTP/1.1 keeps it open."""
        while True:
            end = self.buffer.find(b"\r\n\r\n", 0, _HEAD_LIMIT + 4)
            if end >= 0:
                break
            if len(self.buffer) > _HEAD_LIMIT:
                raise HttpProtocolError(f"the reply's headers exceed {_HEAD_LIMIT} bytes")
            chunk = self.sock.recv(_RECV)
            if not chunk:
                if first and not self.buffer:
                    raise _StaleConnectionError()
                raise HttpProtocolError("the connection ended inside the reply's headers")
            self.buffer += chunk
        raw = bytes(self.buffer[:end]).decode("latin-1")
        del self.buffer[: end + 4]
        status_line, _, rest = raw.partition("\r\n")
        version, _, tail = status_line.partition(" ")
        code = tail[:3]
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise HttpProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        for line in rest.split("\r\n") if rest else ():
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise HttpProtocolError(f"malformed header line: {line[:80]!r}")
            name = name.lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        persistent = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        return int(code), headers, persistent

    def fill(self) -> bool:
        """Read more bytes into the buffer; False at the connection's end."""
        chunk = self.sock.recv(_RECV)
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def readinto(self, view: memoryview) -> int:
        """Bytes from the buffer first, then straight from the socket into ``view``."""
        if self.buffer:
            n = min(len(view), len(self.buffer))
            view[:n] = self.buffer[:n]
            del self.buffer[:n]
            return n
        return self.sock.recv_into(view)

    def readline(self) -> bytes:
        while True:
            end = self.buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 2]
                return line
            if len(self.buffer) > _HEAD_LIMIT or not self.fill():
                raise HttpProtocolError("the connection ended inside a chunked body")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class GetReply:
    """A GET's reply: ``status``, ``headers`` (lower-case names) and the body, read once.

    The connection goes back to its pool when ``release_conn`` (or ``close``) is called after
    the body was read to its end; otherwise it is closed.
    """

    def __init__(
        self,
        conn: _Connection,
        owner: GetConnections,
        status: int,
        headers: dict[str, str],
        persistent: bool,
    ) -> None:
        self.status = status
        self.headers = headers
        self._conn: _Connection | None = conn
        self._owner = owner
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._chunk_left = 0
        self._left: int | None  # body bytes still to come; None: until the connection ends
        if status in _NO_BODY:
            self._left = 0
        elif self._chunked:
            self._left = None
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise HttpProtocolError(
                    f"Content-Length {headers['content-length'][:40]!r} is not a number"
                ) from None
            if self._left < 0:
                raise HttpProtocolError(f"negative Content-Length {self._left}")
        else:
            self._left = None
            persistent = False  # its end is the connection's
        self._persistent = persistent
        self._done = self._left == 0
        self._error: Exception | None = None

    def readinto(self, buffer: memoryview | bytearray) -> int:
        """Read up to ``len(buffer)`` bytes of the body; 0 at its end. A failure is raised
        again by every later read: a body that broke never looks complete."""
        if self._error is not None:
            raise self._error
        view = memoryview(buffer).cast("B")
        conn = self._conn
        if self._done or conn is None or not len(view):
            return 0
        try:
            return self._read_body(conn, view)
        except TimeoutError as exc:
            timeout = TimeoutError(f"read timeout={conn.read_timeout} from {self._owner.host}")
            raise self._fail(timeout) from exc
        except HttpProtocolError as exc:
            raise self._fail(exc) from None
        except OSError as exc:
            failure = _connection_error(exc, f"reading a reply from {self._owner.host}")
            raise self._fail(failure) from exc

    def _fail(self, error: Exception) -> Exception:
        """Remember ``error`` for every later read and close the connection."""
        self._error = error
        self._abandon()
        return error

    def _read_body(self, conn: _Connection, view: memoryview) -> int:
        if self._chunked:
            return self._read_chunked(conn, view)
        if self._left is not None:
            view = view[: self._left]
        n = conn.readinto(view)
        if n == 0:
            if self._left is not None:
                raise HttpProtocolError(
                    f"the answer was cut short: the connection ended {self._left} bytes "
                    "before its end"
                )
            self._done = True
            return 0
        if self._left is not None:
            self._left -= n
            self._done = self._left == 0
        return n

    def _read_chunked(self, conn: _Connection, view: memoryview) -> int:
        if self._chunk_left == 0:
            size_line = conn.readline().split(b";", 1)[0].strip()
            try:
                self._chunk_left = int(size_line, 16)
            except ValueError:
                raise HttpProtocolError(f"bad chunk size {size_line[:20]!r}") from None
            if self._chunk_left == 0:
                while conn.readline():  # trailers, up to the empty line
                    pass
                self._done = True
                return 0
        n = conn.readinto(view[: self._chunk_left])
        if n == 0:
            raise HttpProtocolError("the answer was cut short inside a chunk")
        self._chunk_left -= n
        if self._chunk_left == 0 and conn.readline() != b"":
            raise HttpProtocolError("a chunk did not end with CRLF")
        return n

    def read(self, amount: int = -1) -> bytes:
        """Up to ``amount`` bytes of the body (all of the rest if negative): fewer only at
        its end, or where it broke after some bytes came (the next read raises)."""
        if amount < 0:
            parts = []
            while part := self.read(_RECV * 16):
                parts.append(part)
            return b"".join(parts)
        view = memoryview(bytearray(amount))
        got = 0
        while got < amount:
            try:
                n = self.readinto(view[got:])
            except Exception:
                if not got:
                    raise
                break  # the bytes that came are the caller's; the failure is raised next time
            if n == 0:
                break
            got += n
        return view[:got].tobytes()

    def drain_conn(self) -> None:
        """Read and drop what is left of a short body, so the connection can be reused."""
        drained = 0
        block = memoryview(bytearray(_RECV))
        while not self._done and self._conn is not None and drained < _DRAIN_LIMIT:
            n = self.readinto(block)
            if n == 0:
                break
            drained += n

    def release_conn(self) -> None:
        """Give the connection back to its pool if the body was read to its end, else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._persistent:
            self._owner._put_back(conn)
        else:
            conn.close()

    def close(self) -> None:
        self.release_conn()

    def _abandon(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _request(target: str, host_header: str, headers: Mapping[str, str]) -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host_header}"]
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0") or ":" in name:
            raise ValueError(f"header {name!r}: a line break, NUL or colon has no place there")
        lines.append(f"{name}: {value}")
    lines.append("Accept-Encoding: identity")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _is_reset(exc: OSError) -> bool:
    return isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)) or (
        exc.errno in (errno.EPIPE, errno.ECONNRESET)
    )


def _connection_error(exc: OSError, doing: str) -> Exception:
    """A failure below HTTP as a ``ConnectionError`` (retried), naming its cause."""
    if isinstance(exc, ConnectionError):
        return exc
    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc
    cause = exc.strerror or str(exc) or type(exc).__name__
    return ConnectionError(f"{doing}: {cause}")


def ssl_context_for(verify: Any) -> ssl.SSLContext:
    """The TLS settings botocore's ``verify`` names: False (no check), True (botocore's CA
    bundle) or a CA bundle's path."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    cafile = get_cert_path(verify)
    return ssl.create_default_context(cafile=cafile if isinstance(cafile, str) else None)
