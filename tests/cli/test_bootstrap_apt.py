"""``scripts/bootstrap.sh`` installing fuse3 with apt: apt's reason is shown, a lock waited out.

The script runs as root would, against stand-ins for the commands it calls (``apt-get``,
``id``, ``ldconfig``, the venv's python), so nothing is installed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

BOOTSTRAP = Path(__file__).resolve().parents[2] / "scripts" / "bootstrap.sh"
LOCKED = (
    "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)\n"
    "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another "
    "process using it?\n"
)
MISSING = "E: Unable to locate package fuse3\n"
# apt-get: answers as the file ``answers`` says for each call in turn (its last line for the
# rest): "ok", "locked" or "missing"; every call is appended to ``calls``.
_APT = """#!/bin/bash
echo "$*" >> "$FAKE/calls"
n=$(wc -l < "$FAKE/calls")
answer=$(sed -n "${n}p" "$FAKE/answers"); answer=${answer:-$(tail -n 1 "$FAKE/answers")}
case "$answer" in
  ok) exit 0 ;;
  locked) printf '%s' "$LOCKED" >&2; exit 100 ;;
  missing)
    [ "$1" = update ] && exit 0
    echo "Reading package lists..."; printf '%s' "$MISSING" >&2; exit 100 ;;
esac
"""
_STUBS = {
    "id": "echo 0\n",  # root
    "uname": "echo Darwin\n",  # no libfuse build
    "ldconfig": "exit 0\n",  # no libfuse3 known: fuse3 is installed
    "sleep": "exit 0\n",  # the waits between tries take no time here
    "fio": "exit 0\n",
    "rsync": "exit 0\n",
}


def _bootstrap(tmp_path: Path, answers: list[str], **env: str) -> tuple[str, list[str]]:
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "venv" / "bin").mkdir(parents=True)
    (fake / "answers").write_text("\n".join(answers) + "\n")
    (fake / "calls").write_text("")
    scripts = {**_STUBS, "apt-get": _APT}
    for name, body in scripts.items():
        path = fake / "bin" / name
        path.write_text(body if body.startswith("#!") else "#!/bin/bash\n" + body)
        path.chmod(0o755)
    python = fake / "venv" / "bin" / "python"
    python.write_text("#!/bin/bash\nexit 0\n")  # pip, the S3 server's install: nothing to do
    python.chmod(0o755)
    done = subprocess.run(
        ["bash", str(BOOTSTRAP)],
        env={
            "PATH": f"{fake / 'bin'}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TIERCACHE_VENV": str(fake / "venv"),
            "FAKE": str(fake),
            "LOCKED": LOCKED,
            "MISSING": MISSING,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr, (fake / "calls").read_text().splitlines()


def test_a_failed_install_says_apts_reason(tmp_path: Path) -> None:
    said, calls = _bootstrap(tmp_path, ["missing"])
    assert "bootstrap:   apt: E: Unable to locate package fuse3" in said, said
    assert "bootstrap: could not install fuse3; mount tests will skip" in said
    assert "Reading package lists" not in said  # apt's chatter stays out
    assert calls == ["update -qq", "install -y -qq fuse3"]


def test_a_locked_apt_is_waited_for(tmp_path: Path) -> None:
    said, calls = _bootstrap(tmp_path, ["locked", "locked", "ok"])
    assert said.count("apt is locked by another apt or dpkg; trying again") == 2, said
    assert "could not install" not in said
    assert calls == ["update -qq", "update -qq", "update -qq", "install -y -qq fuse3"]


def test_a_lock_held_too_long_is_given_up_with_apts_words(tmp_path: Path) -> None:
    said, calls = _bootstrap(tmp_path, ["locked"], TIERCACHE_APT_LOCK_WAIT="0")
    assert "bootstrap:   apt: E: Could not get lock /var/lib/dpkg/lock-frontend" in said, said
    assert "bootstrap: could not install fuse3; mount tests will skip" in said
    assert calls == ["update -qq"]
