"""The README's Quick start, run as written against the test server, passes ``tiercache doctor``;
and each FAIL of doctor's tier checks names a command that, run as printed, makes it pass.

The Quick start's code and commands are read from README.md, so that the test follows the page:
only what stands for the reader's machine is replaced (the endpoint, the credentials, the bucket,
``/nvme/tiercache``). The mount and ``metrics --listen`` (a server that runs until stopped) are
left out: tests/mount and tests/cli/test_metrics.py run them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.mount_helpers import Cli

from tiercache.mount.library import fuse_support

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
FUSE_CHECKS = ("fuse library", "fuse binding", "fusermount", "/dev/fuse")
SKIPPED = ("tiercache mount", "tiercache unmount", "tiercache metrics --listen")


def _quick_start() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Quick start\n")
    return text[start : text.index("\n## ", start + 1)]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", _quick_start(), re.MULTILINE | re.DOTALL)


def _shell_lines() -> list[str]:
    """The Quick start's shell lines that set the environment or run tiercache, in order."""
    lines = []
    for block in _blocks("bash"):
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.strip()
            if line.startswith("export ") or (
                line.startswith("tiercache ") and not line.startswith(SKIPPED)
            ):
                lines.append(line)
    return lines


def _for_this_machine(text: str, s3: Any, bucket: str, tier: Path) -> str:
    for theirs, ours in (
        ("https://s3.example.com", s3.endpoint),
        ('"key": "..."', f'"key": "{s3.key}"'),
        ('"secret": "..."', f'"secret": "{s3.secret}"'),
        ("AWS_ACCESS_KEY_ID=...", f"AWS_ACCESS_KEY_ID={s3.key}"),
        ("AWS_SECRET_ACCESS_KEY=...", f"AWS_SECRET_ACCESS_KEY={s3.secret}"),
        ("s3://datasets", f"s3://{bucket}"),
        ("my-bucket", bucket),
        ("/nvme/tiercache", str(tier)),
    ):
        text = text.replace(theirs, ours)
    assert "..." not in text, text  # a placeholder of the page left unreplaced
    return text


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """doctor's checks by name: the line of each."""
    lines = (re.match(r"(?:OK|FAIL)\s+([^:]+):", line) for line in done.stdout.splitlines())
    return {found[1]: found.string for found in lines if found}


def _assert_passes(done: subprocess.CompletedProcess[str]) -> None:
    checks = _report(done)
    assert {"config", "tier private", "tier writable", "free space", "store"} <= set(checks)
    failed = [name for name, line in checks.items() if not line.startswith("OK")]
    if fuse_support().usable:
        assert done.returncode == 0 and not failed, done.stdout
    else:  # a machine without FUSE: the mount's checks say so; nothing else may fail
        assert set(failed) <= set(FUSE_CHECKS), done.stdout


@pytest.mark.parametrize("made_by", ["tiercache", "mkdir"])
def test_quick_start_as_written_passes_doctor(
    made_by: str, bucket: str, s3: Any, s3_client: Any, cli: Cli, tmp_path: Path
) -> None:
    tier = tmp_path / "nvme" / "tiercache"
    tier.parent.mkdir()
    if made_by == "mkdir":  # the reader makes the tier first, as a umask of 022 leaves it
        subprocess.run(["bash", "-c", f"umask 022 && mkdir {tier}"], check=True)
        assert tier.stat().st_mode & 0o777 == 0o755
    for key in ("dataset/shard-00000.tar", "train/shard-00000.tar", "train/shard-00001.tar"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=os.urandom(64 * 1024))
    env = {k: v for k, v in cli.env.items() if k != "TIERCACHE_LOCAL_DIR"}
    env["TIERCACHE_LOCAL_MAX_BYTES"] = "64MiB"  # this disk is not a node's NVMe

    code = "\n".join(_for_this_machine(b, s3, bucket, tier) for b in _blocks("python"))
    ran = subprocess.run(
        [sys.executable, "-c", "state_bytes = b'weights' * 1000\n" + code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert s3_client.get_object(Bucket=bucket, Key="ckpt/step-100/model.pt")["Body"].read()

    lines = [_for_this_machine(line, s3, bucket, tier) for line in _shell_lines()]
    prelude = [f'tiercache() {{ "{sys.executable}" -m tiercache.cli "$@"; }}'] + [
        line for line in lines if line.startswith("export ")
    ]
    commands = [line for line in lines if not line.startswith("export ")]
    assert any(c.startswith("tiercache doctor") for c in commands), _shell_lines()
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", "\n".join([*prelude, command])],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if command.startswith("tiercache doctor"):
            _assert_passes(done)
            assert str(tier) in done.stdout  # the tier the code used, not another
        else:
            assert done.returncode == 0, (command, done.stdout, done.stderr)
    assert (tier / "objects").stat().st_mode & 0o777 == 0o700


def _doctor_tier(cli: Cli, tier: Path) -> str:
    """doctor's "tier private" line for ``tier``."""
    done = cli("doctor", "--local-dir", str(tier), "--local-max-bytes", "64MiB")
    return _report(done)["tier private"]


def _run_fix(line: str) -> None:
    fix = line.split("; fix: ", 1)[1]
    subprocess.run(["bash", "-c", fix], check=True)


def test_doctor_names_the_command_that_makes_a_tier_private(
    bucket: str, s3_client: Any, cli: Cli, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"k")
    tier = tmp_path / "tier"
    assert cli("prefetch", f"s3://{bucket}/k", "--local-dir", str(tier)).returncode == 0
    assert _doctor_tier(cli, tier).startswith("OK")

    # Others may list a 0755 root: they see the names of the tier's own directories, no more.
    os.chmod(tier, 0o755)
    line = _doctor_tier(cli, tier)
    assert line.startswith("OK") and "0755" in line and "nothing in it is open" in line

    # ...unless an entry is open too: then its chmod is the fix, and running it is enough.
    os.chmod(tier / "objects", 0o755)
    line = _doctor_tier(cli, tier)
    assert line.startswith("FAIL") and "objects" in line
    assert f"fix: chmod 700 {tier / 'objects'}" in line
    _run_fix(line)
    assert _doctor_tier(cli, tier).startswith("OK")

    # Others who may write to the root could remove or plant what tiercache writes into.
    os.chmod(tier, 0o775)
    line = _doctor_tier(cli, tier)
    assert line.startswith("FAIL") and "may add, rename or remove" in line
    assert line.endswith(f"fix: chmod 700 {tier}")
    _run_fix(line)
    assert _doctor_tier(cli, tier).startswith("OK")
    assert tier.stat().st_mode & 0o777 == 0o700
