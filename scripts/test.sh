#!/usr/bin/env bash
# Runs every check and test from a fresh machine: installs what it needs (bootstrap.sh), then
# ruff, mypy and pytest (which starts the S3 server itself). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
ruff check .
ruff format --check .
mypy
python -m pytest -q -rs "$@"
