"""``FaultProxy``: a threaded HTTP/1.1 proxy on 127.0.0.1 that injects S3 faults on demand."""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, BinaryIO, TypedDict
from urllib.parse import urlsplit

from support.remote_store import ConnectionServer

if TYPE_CHECKING:
    from typing_extensions import Unpack

_CODES = {403: "AccessDenied", 404: "NoSuchKey", 500: "InternalError", 503: "SlowDown"}
_PIECE = 64 * 1024
_EOL = (b"\r\n", b"\n", b"")
Headers = dict[str, str]


class Match(TypedDict, total=False):
    """Which requests a fault applies to (see ``FaultProxy``)."""

    method: str | None
    path_contains: str | None
    user_agent_contains: str | None  # "app/hostA": a process with AWS_SDK_UA_APP_ID=hostA
    skip: int


@dataclass
class _Rule:
    kind: str  # "fail" | "reset" | "truncate" | "hold"
    left: int  # requests it still applies to
    method: str | None = None
    path_contains: str | None = None  # matched against the request target, query included
    user_agent_contains: str | None = None  # matched against the User-Agent header
    skip: int = 0  # matching requests to let through first
    status: int = 503
    code: str = ""
    after_bytes: int = 0
    hold: float = 0.0  # truncate: seconds of silence before the connection closes
    forward: bool = False  # reset: the store gets the request, the client loses the answer
    on_hold: Callable[[], None] | None = None  # hold: called once the request is held
    release: threading.Event = field(default_factory=threading.Event)  # hold: forward it now
    answered: threading.Event = field(default_factory=threading.Event)  # hold: store answered


def _matches(method: str, target: str, want: str | None, path_contains: str | None) -> bool:
    return (want is None or want == method) and (path_contains is None or path_contains in target)


def _read_head(rfile: BinaryIO) -> tuple[bytes, str, Headers]:
    """A request or response head: its raw bytes, first line and lower-cased headers."""
    first = rfile.readline(65537)
    while first in (b"\r\n", b"\n"):
        first = rfile.readline(65537)
    if not first:
        raise EOFError("connection closed")
    raw, headers = [first], {}
    while (line := rfile.readline(65537)) not in _EOL:
        raw.append(line)
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return b"".join(raw) + b"\r\n", first.decode("latin-1").strip(), headers


def _has_body(headers: Headers) -> bool:
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    return chunked or headers.get("content-length", "0") != "0"


def _copy_body(
    rfile: BinaryIO,
    headers: Headers,
    out: socket.socket | None,
    limit: int | None = None,
    to_eof: bool = False,
) -> bytes:
    """Copy a body (Content-Length, chunked, else to EOF if ``to_eof``) to ``out``.

    Returns the raw bytes when ``out`` is None; with ``limit`` sends only that many and stops.
    """
    kept: list[bytes] = []
    room = [-1 if limit is None else limit]

    def emit(data: bytes) -> bool:
        if room[0] >= 0:
            data, room[0] = data[: room[0]], max(0, room[0] - len(data))
        if out is None:
            kept.append(data)
        elif data:
            out.sendall(data)
        return room[0] != 0

    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = rfile.readline(65537)
            size = int(size_line.split(b";")[0], 16)
            if not (emit(size_line) and emit(rfile.read(size + 2) if size else b"")):
                break
            if size == 0:  # trailers, then the blank line
                while emit(line := rfile.readline(65537)) and line not in _EOL:
                    pass
                break
    else:
        left = int(headers.get("content-length", "-1" if to_eof else "0"))
        while left != 0:
            data = rfile.read(_PIECE if left < 0 else min(_PIECE, left))
            if not data:
                if left > 0:
                    raise EOFError("body ended early")
                break
            left = left - len(data) if left > 0 else left
            if not emit(data):
                break
    return b"".join(kept)


def _abort(sock: socket.socket) -> None:
    """Make the coming close send RST instead of FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _error_response(method: str, target: str, status: int, code: str, close: bool) -> bytes:
    resource = target.split("?", 1)[0]
    xml = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>injected by FaultProxy</Message><Resource>{resource}</Resource>"
        "<RequestId>fault</RequestId></Error>"
    )
    body = b"" if method == "HEAD" else xml.encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Content-Type: application/xml"]
    head += [f"Content-Length: {len(body)}", "x-amz-request-id: fault"]
    head += ["Connection: close"] if close else []
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class FaultProxy(ConnectionServer):
    """Forwards HTTP requests to ``upstream`` unchanged unless a programmed fault matches.

    Every fault applies to the next ``n`` requests whose method is ``method`` and whose target
    (path and query) contains ``path_contains`` (None: any), after letting ``skip`` of them
    through; rules are tried in the order they were programmed.
    """

    def __init__(self, upstream: str, timeout: float = 60.0) -> None:
        parts = urlsplit(upstream)
        assert parts.scheme == "http" and parts.hostname, upstream
        self._upstream = (parts.hostname, parts.port or 80)
        self._timeout = timeout
        super().__init__()
        self._rules: list[_Rule] = []
        self._delay = 0.0
        self.requests: Counter[str] = Counter()  # per method, faulted ones included
        self.log: list[tuple[str, str, Headers]] = []  # (method, target, headers)
        self._listen()

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def fail_next(
        self, n: int, status: int = 503, code: str | None = None, **match: Unpack[Match]
    ) -> None:
        """Answer with an S3 XML error (``code`` defaults from ``status``) instead of the store."""
        code = code or _CODES.get(status, HTTPStatus(status).phrase.replace(" ", ""))
        self._add(_Rule("fail", n, status=status, code=code, **match))

    def reset_next(self, n: int, forward: bool = False, **match: Unpack[Match]) -> None:
        """Close the client connection with RST before answering; with ``forward`` only after
        the store handled the request (its answer is lost)."""
        self._add(_Rule("reset", n, forward=forward, **match))

    def truncate_next(
        self, n: int, after_bytes: int, hold: float = 0.0, **match: Unpack[Match]
    ) -> None:
        """Relay the store's response head and ``after_bytes`` of its body, stay silent for
        ``hold`` seconds (a stalled transfer), then close the connection."""
        self._add(_Rule("truncate", n, after_bytes=after_bytes, hold=hold, **match))

    def hold_next(
        self, n: int, on_hold: Callable[[], None], **match: Unpack[Match]
    ) -> tuple[threading.Event, threading.Event]:
        """Take the whole request from the client, call ``on_hold`` (say, stop the client's
        process), and keep the request until the first event returned is set: then it goes to
        the store, as a request delayed on the wire would, and the second event is set once
        the store's answer was relayed."""
        rule = _Rule("hold", n, on_hold=on_hold, **match)
        self._add(rule)
        return rule.release, rule.answered

    def delay(self, seconds: float) -> None:
        """Wait this long before handling each request."""
        self._delay = seconds

    def clear(self) -> None:
        """Drop every fault and the delay; the counters stay."""
        with self._lock:
            self._rules.clear()
        self._delay = 0.0

    def count(self, method: str | None = None, path_contains: str | None = None) -> int:
        """Requests received (faulted ones included) matching ``method`` and ``path_contains``."""
        with self._lock:
            return sum(1 for m, t, _ in self.log if _matches(m, t, method, path_contains))

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _converse(self, sock: socket.socket) -> None:
        rfile = sock.makefile("rb")
        try:
            while not self._stop.is_set() and self._handle(sock, rfile):
                pass
        finally:
            rfile.close()

    def _pick(self, method: str, target: str, headers: Headers) -> _Rule | None:
        with self._lock:
            self.requests[method] += 1
            self.log.append((method, target, headers))
            for rule in self._rules:
                agent = rule.user_agent_contains
                if agent is not None and agent not in headers.get("user-agent", ""):
                    continue
                if rule.left > 0 and _matches(method, target, rule.method, rule.path_contains):
                    if rule.skip > 0:
                        rule.skip -= 1
                        continue
                    rule.left -= 1
                    return rule
        return None

    def _handle(self, sock: socket.socket, rfile: BinaryIO) -> bool:
        """Serve one request; False when the client connection must close."""
        head, line, headers = _read_head(rfile)
        method, target = line.split(" ")[:2]
        # A request with an empty body has nothing to wait for: the store answers it at once
        # (no 100 Continue) and the connection stays usable, as for any other request.
        expect = headers.get("expect", "").lower() == "100-continue" and _has_body(headers)
        rule = self._pick(method, target, headers)
        if self._delay:
            self._stop.wait(self._delay)
        if rule is not None and rule.kind in ("fail", "reset") and not rule.forward:
            if not expect:  # read the whole request first, as a server does
                _copy_body(rfile, headers, None)
            if rule.kind == "reset":
                _abort(sock)
                return False
            sock.sendall(_error_response(method, target, rule.status, rule.code, expect))
            return not expect  # a client told to stop before its body: do not reuse
        truncating = rule if rule is not None and rule.kind == "truncate" else None
        held_body: bytes | None = None
        if rule is not None and rule.kind == "hold":
            held_body = self._hold(sock, rfile, headers, expect, rule)
        with socket.create_connection(self._upstream, timeout=self._timeout) as up:
            upfile = up.makefile("rb")
            try:
                if held_body is not None:  # sent whole, as the client sent it to us
                    lines = head.split(b"\r\n")
                    up.sendall(
                        b"\r\n".join(x for x in lines if not x.lower().startswith(b"expect:"))
                    )
                    up.sendall(held_body)
                    expect = False
                else:
                    up.sendall(head)
                if not expect and held_body is None:
                    _copy_body(rfile, headers, up)
                while True:  # interim 1xx answers (100 Continue), then the final one
                    resp_head, status_line, resp_headers = _read_head(upfile)
                    status = int(status_line.split(" ")[1])
                    if status >= 200:
                        break
                    if held_body is None:  # the client of a held request had its 100 already
                        sock.sendall(resp_head)
                    if status == 100 and expect:
                        if held_body is not None:
                            up.sendall(held_body)
                        else:
                            _copy_body(rfile, headers, up)
                        expect = False
                has_body = method != "HEAD" and status not in (204, 304)
                if rule is not None and rule.kind == "reset":  # forwarded: lose the answer
                    if has_body:
                        _copy_body(upfile, resp_headers, None, to_eof=True)
                    _abort(sock)
                    return False
                sock.sendall(resp_head)
                limit = truncating.after_bytes if truncating is not None else None
                if has_body:
                    _copy_body(upfile, resp_headers, sock, limit, to_eof=True)
            finally:
                upfile.close()
        if truncating is not None:
            self._stop.wait(truncating.hold)
            return False
        if rule is not None and rule.kind == "hold":
            rule.answered.set()
        return not expect and resp_headers.get("connection", "").lower() != "close"

    def _hold(
        self, sock: socket.socket, rfile: BinaryIO, headers: Headers, expect: bool, rule: _Rule
    ) -> bytes:
        """Read a held request whole (answering ``100 Continue`` for it), then wait for its
        release; returns its body. One that waited for ``100 Continue`` goes to the store the
        same way (a store that refuses the request answers without reading it)."""
        if expect:
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _copy_body(rfile, headers, None)
        assert rule.on_hold is not None
        rule.on_hold()
        while not rule.release.wait(0.1):
            if self._stop.is_set():
                raise EOFError("proxy stopped while holding a request")
        return body
