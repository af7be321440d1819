"""Two CephFS "hosts" for tests: the cluster (scripts/cephfs.sh) and processes on each host.

A host is a ceph-fuse mount of its own (its own CephFS client and session) plus the processes
that use it: each runs in a UTS namespace with that host's hostname, so tiercache's default
``host_id`` (the hostname) differs between hosts as it does between real machines. Processes
take their options (credentials included) on stdin, never in argv.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cephfs.sh"
WORKER = Path(__file__).resolve().parent / "cephfs_host_worker.py"
HOSTS = ("hostA", "hostB")
MARK = "@@reply "
# The cluster binds fixed ports; one test session at a time uses it.
MiB = 1024 * 1024
LOCK_PATH = "/tmp/tiercache-cephfs.lock"


def why_not_here() -> str | None:
    """Why this machine cannot run the CephFS cluster, or None if it can."""
    if os.geteuid() != 0:
        return "needs root (Ceph daemons, ceph-fuse mounts, UTS namespaces)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    tools = ("ceph-mon", "ceph-osd", "ceph-mds", "ceph-mgr", "ceph-fuse")
    if any(shutil.which(t) is None for t in tools) and shutil.which("apt-get") is None:
        return "Ceph is not installed and there is no apt-get to install it"
    return None


@dataclass(frozen=True)
class CephFS:
    """A running cluster with one mount per host."""

    base: Path

    def mount(self, host: str) -> Path:
        return self.base / host

    def _script(self, *args: str, timeout: float = 120) -> str:
        env = {**os.environ, "CEPHFS_DIR": str(self.base)}
        done = subprocess.run(
            ["bash", str(SCRIPT), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"cephfs.sh {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> str:
        return self._script("start", timeout=900)  # may install the packages first

    def stop(self) -> None:
        self._script("stop")

    def crash(self, host: str) -> None:
        """The host dies: its ceph-fuse is killed and its MDS session evicted."""
        self._script("crash", str(HOSTS.index(host) + 1))

    def remount(self, host: str) -> None:
        self._script("mount", str(HOSTS.index(host) + 1))

    def ceph(self, *args: str) -> str:
        env = {**os.environ, "CEPH_CONF": str(self.base / "state" / "ceph.conf")}
        return subprocess.run(
            ["ceph", *args], env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout

    def client_hostnames(self) -> list[str]:
        """Hostnames of the CephFS clients the MDS knows (the mgr's own included)."""
        sessions = json.loads(self.ceph("tell", "mds.a", "client", "ls"))
        return [s.get("client_metadata", {}).get("hostname", "") for s in sessions]


@contextmanager
def session_lock(timeout: float) -> Iterator[bool]:
    """Hold the cluster's lock (False if another session kept it for ``timeout`` seconds)."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(1)
        yield True
    finally:
        os.close(fd)


def on_host(host: str, argv: list[str]) -> list[str]:
    """``argv`` run in a UTS namespace of its own whose hostname is ``host``."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$1"; shift; exec "$@"', "sh", host, *argv]


class HostProcess:
    """A tiercache process on one host, driven through ``cephfs_host_worker.py``."""

    def __init__(self, host: str, options: dict[str, Any]) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            on_host(host, [sys.executable, str(WORKER)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # Its store requests say which host sent them ("app/HOST" in the User-Agent),
            # so that a proxy can fault one host's requests alone.
            env={**os.environ, "AWS_SDK_UA_APP_ID": host},
        )
        self._send(options)
        self.hello: dict[str, Any] | None = None

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def ready(self, timeout: float = 120) -> dict[str, Any]:
        if self.hello is None:
            self.hello = self.receive(timeout)
        return self.hello

    def send(self, op: str, **args: Any) -> None:
        self.ready()
        self._send({"op": op, **args})

    def receive(self, timeout: float = 120) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply from the process on {self.host} in {timeout} s")
            # poll, not select: a long test session holds descriptors numbered past 1024.
            poller = select.poll()
            poller.register(self.proc.stdout, select.POLLIN)
            if not poller.poll(left * 1000):
                continue
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the process on {self.host} exited ({self.proc.wait()})")
            if line.startswith(MARK):
                reply: dict[str, Any] = json.loads(line[len(MARK) :])
                return reply

    def call(self, op: str, timeout: float = 120, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.receive(timeout)

    def kill(self) -> None:
        """``kill -9``, as when its host dies."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def start_all(procs: list[HostProcess]) -> None:
    """Wait until every process has built its filesystem."""
    for proc in procs:
        proc.ready()


class Hosts:
    """Processes on the two hosts of one test, sharing ``shared_dir`` through CephFS."""

    def __init__(self, cephfs: CephFS, name: str, tmp_path: Path, options: dict[str, Any]):
        self.cephfs = cephfs
        self.name = name
        self.tmp_path = tmp_path
        self.options = options
        self.procs: list[HostProcess] = []

    def shared(self, host: str) -> Path:
        """The shared tier's directory as ``host`` sees it (its own mount)."""
        return self.cephfs.mount(host) / self.name / "shared"

    def start(self, host: str, local: str | None = None, **extra: Any) -> HostProcess:
        config = {
            "target_options": self.options,
            "local_dir": str(self.tmp_path / (local or f"{host}-local")),
            "shared_dir": str(self.shared(host)),
            "consistency": "immutable",
            **extra,
        }
        proc = HostProcess(host, config)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            proc.close()


def fill_quota(shared: Path, views: list[Path]) -> None:
    """Use up a CephFS quota on ``shared``: other data of 4 MiB, then a quota of 4 MiB.

    ceph-fuse checks a write against the quota root's recursive size as the MDS last told
    it, plus that write's growth: a quota is enforced at once only once the usage has
    reached the client (seen here through ``ceph.dir.rbytes`` on each host's mount).
    """
    with open(shared / "other-data", "wb") as f:
        f.write(os.urandom(4 * MiB))
        os.fsync(f.fileno())
    os.setxattr(shared, "ceph.quota.max_bytes", str(4 * MiB).encode())
    deadline = time.monotonic() + 60
    for view in views:
        while int(os.getxattr(view, "ceph.dir.rbytes")) < 4 * MiB:
            assert time.monotonic() < deadline, "the MDS never reported the usage"
            time.sleep(0.1)
        assert os.getxattr(view, "ceph.quota.max_bytes") == str(4 * MiB).encode()
