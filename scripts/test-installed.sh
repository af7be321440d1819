#!/usr/bin/env bash
# Tests tiercache as users install it: builds the sdist and, from it, the wheel; installs the
# wheel (not editable, with the mount extra) into a fresh virtual environment outside the
# checkout; then, from a directory outside the checkout, runs scripts/installed_smoke.py (every
# module imports, `tiercache --help`, a byte-exact write/flush/cold/warm round trip through
# tiercache::s3:// against the S3 server) and the unit tests against that install.
# Needs the development environment (scripts/bootstrap.sh) for the build and the S3 server.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV_PYTHON=${TIERCACHE_VENV:-$ROOT/.venv}/bin/python
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

python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install "${pip_quiet[@]}" -c "$ROOT/scripts/constraints.txt" \
  "$wheel[mount,metrics]" pytest pytest-timeout
# The same CPU build of torch the development environment uses, if there is one, so that the
# PyTorch adapters import and their unit tests run.
torch_wheel=$(ls /opt/wheels/torch-*+cpu-cp3*-manylinux*_x86_64.whl 2>/dev/null | head -n 1 || true)
if [ -n "$torch_wheel" ]; then
  "$WORK/venv/bin/python" -m pip install "${pip_quiet[@]}" -c "$ROOT/scripts/constraints.txt" \
    "$torch_wheel" numpy
fi

cd "$WORK"
"$WORK/venv/bin/python" "$ROOT/scripts/installed_smoke.py"
# The unit tests, importing tiercache from the install: the conftest refuses the checkout's.
TIERCACHE_TEST_INSTALLED=1 "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$ROOT" -c "$ROOT/pyproject.toml" "$ROOT/tests/unit"
