"""``ls -l`` of a large directory through a read-write mount: store requests in each mode."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli, make_cli, requires_fuse, server_env

pytestmark = [pytest.mark.integration, requires_fuse]

FILES = 2000
TTL = 3.0  # the ttl of ``ttl`` mode here: the second ``ls -l`` comes after it
ATTR_TIMEOUT = 1.0
# A listing vouches for metadata a HEAD read only if the object's LastModified lay this far
# before the HEAD (a change within the same second would keep the LastModified).
SETTLED = 2.5
SET_NS = 1_500_000_000_250_000_000


@pytest.fixture
def cli(s3: Any, proxy: Any, tmp_path: Path) -> Cli:
    """The CLI (and so the mount) talking to the store through the counting proxy."""
    made = make_cli(tmp_path, server_env(proxy.url, s3.key, s3.secret, s3.region))
    made.env["TIERCACHE_TTL"] = str(TTL)
    return made


def populate(s3_client: Any, bucket: str, prefix: str) -> None:
    def put(i: int) -> None:
        s3_client.put_object(Bucket=bucket, Key=f"{prefix}/f{i:05d}.txt", Body=b"x" * (i % 7))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(FILES)))


def ls_l(directory: Path) -> list[str]:
    done = subprocess.run(
        ["ls", "-l", "--time-style=+%s", str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "LC_ALL": "C"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()[1:]  # "total ..."
    assert len(lines) == FILES, lines[:3]
    return lines


def requests_of(proxy: Any, run: Callable[[], object]) -> Counter[str]:
    """The store requests (by method) made while ``run`` runs."""
    start = len(proxy.log)
    run()
    return Counter(method for method, _, _ in proxy.log[start:])


def mode_and_mtime(path: Path) -> tuple[int, int]:
    st = path.stat()
    return stat.S_IMODE(st.st_mode), st.st_mtime_ns


@pytest.mark.parametrize("consistency", ["immutable", "ttl", "always"])
def test_ls_l_twice_asks_the_store_little_the_second_time(
    consistency: str,
    bucket: str,
    s3_client: Any,
    proxy: Any,
    cli: Cli,
    mount: Callable[..., Path],
) -> None:
    populate(s3_client, bucket, "many")
    time.sleep(SETTLED)
    mnt = mount(
        f"s3://{bucket}/many", "--consistency", consistency, "--attr-timeout", str(ATTR_TIMEOUT)
    )
    first = requests_of(proxy, lambda: ls_l(mnt))
    time.sleep(max(TTL, ATTR_TIMEOUT) + 0.5)  # what ls -l was told has expired everywhere
    second = requests_of(proxy, lambda: ls_l(mnt))
    print(f"{consistency}: first ls -l {dict(first)}, second {dict(second)}")
    assert first["HEAD"] <= FILES, first  # a listing carries no metadata: one HEAD per file
    assert sum(second.values()) <= FILES // 100, second

    # Times and modes set through the mount read back once published and forgotten by the
    # kernel, and a later ls -l asks little again.
    subprocess.run(["chmod", "600", str(mnt / "f00001.txt")], check=True)
    subprocess.run(["touch", "-m", "-d", "@1500000000.25", str(mnt / "f00002.txt")], check=True)
    done = cli("flush", "--timeout", "120")
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 30
    for name, key in (("f00001.txt", "mode"), ("f00002.txt", "mtime")):
        while key not in s3_client.head_object(Bucket=bucket, Key=f"many/{name}")["Metadata"]:
            assert time.monotonic() < deadline, f"the {key} set never reached the store"
            time.sleep(0.1)
    time.sleep(ATTR_TIMEOUT + 0.5)
    assert mode_and_mtime(mnt / "f00001.txt")[0] == 0o600
    assert mode_and_mtime(mnt / "f00002.txt")[1] == SET_NS
    time.sleep(max(TTL, ATTR_TIMEOUT) + 0.5)
    lines: list[str] = []
    third = requests_of(proxy, lambda: lines.extend(ls_l(mnt)))
    assert lines[1].startswith("-rw------- ") and " 1500000000 f00002.txt" in lines[2], lines[:3]
    assert mode_and_mtime(mnt / "f00001.txt")[0] == 0o600
    assert mode_and_mtime(mnt / "f00002.txt")[1] == SET_NS
    assert sum(third.values()) <= FILES // 100 + 2, third  # the two changed files, once


@pytest.mark.parametrize("consistency", ["ttl", "always"])
def test_metadata_changed_elsewhere_shows_within_the_mode_s_promise(
    consistency: str,
    bucket: str,
    s3_client: Any,
    cli: Cli,
    mount: Callable[..., Path],
) -> None:
    for name in ("a.txt", "b.txt"):
        s3_client.put_object(Bucket=bucket, Key=f"other/{name}", Body=b"same bytes")
    time.sleep(SETTLED)
    mnt = mount(
        f"s3://{bucket}/other", "--consistency", consistency, "--attr-timeout", str(ATTR_TIMEOUT)
    )
    assert sorted(os.listdir(mnt)) == ["a.txt", "b.txt"]
    assert mode_and_mtime(mnt / "a.txt")[0] == 0o644
    # Another host's chmod: a metadata-only copy, which keeps the ETag.
    s3_client.copy_object(
        Bucket=bucket,
        Key="other/a.txt",
        CopySource={"Bucket": bucket, "Key": "other/a.txt"},
        Metadata={"mode": str(0o100600)},
        MetadataDirective="REPLACE",
    )
    time.sleep((TTL if consistency == "ttl" else ATTR_TIMEOUT) + 0.5)
    os.listdir(mnt)
    assert mode_and_mtime(mnt / "a.txt")[0] == 0o600
    assert mode_and_mtime(mnt / "b.txt")[0] == 0o644
