#!/usr/bin/env bash
# The demo from a fresh machine: installs what it needs, starts the bundled S3 server, writes a
# small dataset, reads it cold and warm through tiercache::s3:// and prints what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
python scripts/demo.py "$@"
