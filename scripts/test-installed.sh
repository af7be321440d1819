#!/usr/bin/env bash
# Tests tiercache as users install it: builds the sdist and, from it, the wheel; installs the
# wheel (not editable) into fresh virtual environments outside the checkout, three times:
#   pinned: the wheel with its mount and metrics extras under scripts/constraints.txt (the
#     versions the development environment tests, so a failure here is ours), then the unit
#     tests against that install;
#   latest: `pip install "$wheel"` and, in another fresh environment,
#     `pip install "$wheel[mount,metrics]"`, with no constraints file, as users run them: pip
#     takes the newest releases, so a dependency that stops resolving (or backtracks for
#     minutes, as boto3 and s3fs's aiobotocore pins once did) fails here, not at a user's. An
#     install that has not finished within $TIERCACHE_RESOLVE_LIMIT seconds (120) fails.
# Each runs scripts/installed_smoke.py from a directory outside the checkout: every module
# imports, `tiercache --help`, a byte-exact write/flush/cold/warm round trip through
# tiercache::s3:// against the S3 server, and that URL read by a new process without s3fs.
# Needs the development environment (scripts/bootstrap.sh) for the build and the S3 server.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV_PYTHON=${TIERCACHE_VENV:-$ROOT/.venv}/bin/python
RESOLVE_LIMIT=${TIERCACHE_RESOLVE_LIMIT:-120}
WORK=$(mktemp -d /tmp/tiercache-installed.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pip_quiet=(--quiet --disable-pip-version-check)

"$DEV_PYTHON" -m pip install "${pip_quiet[@]}" -c "$ROOT/scripts/constraints.txt" build
# sdist first, then the wheel built from that sdist: a file the sdist lacks fails the build.
"$DEV_PYTHON" -m build --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 ||
  { tail -n 40 "$WORK/build.log"; exit 1; }
wheel=$(ls "$WORK"/dist/tiercache-*-py3-none-any.whl)
ls "$WORK"/dist/tiercache-*.tar.gz >/dev/null
echo "installed: built $(basename "$wheel") and its sdist"

# install_fresh VENV LABEL PIP-ARGS...: a fresh virtual environment VENV, and pip install
# PIP-ARGS into it, timed; pip's output is shown only when it fails.
install_fresh() {
  local venv=$1 label=$2 start=$SECONDS rc=0
  shift 2
  python3 -m venv "$venv"
  timeout "$RESOLVE_LIMIT" "$venv/bin/python" -m pip install --disable-pip-version-check "$@" \
    >"$venv.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 40 "$venv.log"
    if [ "$rc" = 124 ]; then
      echo "installed: $label did not finish within ${RESOLVE_LIMIT}s (pip backtracking?)" >&2
    fi
    echo "installed: $label failed" >&2
    exit 1
  fi
  echo "installed: $label in $((SECONDS - start))s"
}

# smoke VENV: scripts/installed_smoke.py with the Python of VENV, from outside the checkout.
smoke() {
  (cd "$WORK" && "$1/bin/python" "$ROOT/scripts/installed_smoke.py")
}

install_fresh "$WORK/pinned" \
  "pinned: pip install -c scripts/constraints.txt '<wheel>[mount,metrics]'" \
  -c "$ROOT/scripts/constraints.txt" "$wheel[mount,metrics]" pytest pytest-timeout
# The same CPU build of torch the development environment uses, if there is one, so that the
# PyTorch adapters import and their unit tests run.
torch_wheel=$(ls /opt/wheels/torch-*+cpu-cp3*-manylinux*_x86_64.whl 2>/dev/null | head -n 1 || true)
if [ -n "$torch_wheel" ]; then
  "$WORK/pinned/bin/python" -m pip install "${pip_quiet[@]}" -c "$ROOT/scripts/constraints.txt" \
    "$torch_wheel" numpy
fi
smoke "$WORK/pinned"
# The unit tests, importing tiercache from the install: the conftest refuses the checkout's.
(cd "$WORK" && TIERCACHE_TEST_INSTALLED=1 "$WORK/pinned/bin/python" -m pytest -q \
  -p no:cacheprovider --rootdir "$ROOT" -c "$ROOT/pyproject.toml" "$ROOT/tests/unit")

install_fresh "$WORK/latest" "latest: pip install '<wheel>'" "$wheel"
smoke "$WORK/latest"
install_fresh "$WORK/latest-extras" "latest: pip install '<wheel>[mount,metrics]'" \
  "$wheel[mount,metrics]"
smoke "$WORK/latest-extras"
