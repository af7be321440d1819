#!/usr/bin/env bash
# Creates the virtual environment (.venv, or $TIERCACHE_VENV) and installs tiercache with its
# development extras and the pinned S3 test server. Sourced by test.sh and demo.sh; idempotent.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TIERCACHE_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  -c "$ROOT/scripts/constraints.txt" -e "$ROOT[dev]"
"$VENV/bin/python" "$ROOT/scripts/s3server.py" install >/dev/null
export PATH="$VENV/bin:$PATH"
