#!/usr/bin/env bash
# Creates the virtual environment (.venv, or $TIERCACHE_VENV) and installs tiercache with its
# development extras (the metrics extra among them: prometheus_client) and the pinned S3 test
# server. Sourced by test.sh and demo.sh; idempotent.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TIERCACHE_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
# How long an apt-get waits for another apt or dpkg to let go of its lock (an unattended
# upgrade at boot holds it for minutes) before the install is given up.
APT_LOCK_WAIT=${TIERCACHE_APT_LOCK_WAIT:-300}

# apt-get update, then install PACKAGES, quietly. A locked apt is tried again every 5 s for
# APT_LOCK_WAIT seconds; a failure prints apt's own error lines (why), not just that it failed.
bootstrap_apt_install() {
  local out deadline
  out=$(mktemp)
  deadline=$((SECONDS + APT_LOCK_WAIT))
  while true; do
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } \
      >"$out" 2>&1; then
      rm -f "$out"
      return 0
    fi
    if ! grep -qiE 'could not get lock|unable to (acquire|lock)' "$out" || [ "$SECONDS" -ge "$deadline" ]; then
      break
    fi
    echo "bootstrap: apt is locked by another apt or dpkg; trying again in 5 s" >&2
    sleep 5
  done
  # apt says why in lines of its own ("E: ..."); otherwise its last lines are the reason.
  { grep -E '^(E|W|dpkg|Err):' "$out" || tail -n 5 "$out"; } | sed 's/^/bootstrap:   apt: /' >&2
  rm -f "$out"
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  -c "$ROOT/scripts/constraints.txt" -e "$ROOT[dev,mount,metrics]"
# The mount tests need libfuse 3 and fusermount3 from the OS. Installed here when missing and
# when we may (root with apt); a failure only makes those tests skip, saying why.
if ! command -v fusermount3 >/dev/null 2>&1 || ! ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing fuse3 (libfuse 3 and fusermount3) for the mount tests" >&2
    bootstrap_apt_install fuse3 || echo "bootstrap: could not install fuse3; mount tests will skip" >&2
  else
    echo "bootstrap: fuse3 is missing (apt-get install fuse3); mount tests will skip" >&2
  fi
fi
# FUSE passthrough (warm reads by the kernel from the tier file) needs libfuse >= 3.16 and
# root; Debian 12 ships 3.14, so root builds 3.17 into the venv (scripts/build-libfuse.sh,
# about 30 s once). Without it the mount serves every read itself, and says why in its log.
if [ "$(id -u)" = 0 ] && [ "$(uname -s)" = Linux ]; then
  bash "$ROOT/scripts/build-libfuse.sh" ||
    echo "bootstrap: libfuse 3.17 not built; the mount will not use passthrough" >&2
fi
# The mount benchmark compares with fio (psync); rsync is one of the tools the mount tests run.
for tool in fio rsync; do
  if ! command -v "$tool" >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    bootstrap_apt_install "$tool" || echo "bootstrap: could not install $tool" >&2
  fi
done
# The PyTorch adapters' tests need torch. PyPI's default Linux build drags in gigabytes of
# CUDA libraries, so only a CPU wheel found locally is installed; without one those tests
# are skipped, and say so.
TORCH_WHEEL=$(ls /opt/wheels/torch-*+cpu-cp3*-manylinux*_x86_64.whl 2>/dev/null | head -n 1 || true)
if [ -n "$TORCH_WHEEL" ] && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$ROOT/scripts/constraints.txt" "$TORCH_WHEEL"
fi
"$VENV/bin/python" "$ROOT/scripts/s3server.py" install >/dev/null
export PATH="$VENV/bin:$PATH"
