#!/usr/bin/env bash
# The demo from a fresh machine: installs what it needs, starts the bundled S3 server, writes a
# small dataset, reads it cold and warm through tiercache::s3:// and prints what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
# The demo keeps its files (and its server's data) in a directory of its own, removed at the
# end. Should the demo die before stopping its server (a SIGTERM or SIGHUP ends Python without
# cleanup), the server named there is stopped here, so nothing is left running.
work=$(mktemp -d "${TMPDIR:-/tmp}/tiercache-demo.XXXXXX")
cleanup() {
  local server
  for server in "$work"/*/s3; do
    [ -d "$server" ] && python scripts/s3server.py stop --data-dir "$server" || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
TMPDIR=$work python scripts/demo.py "$@"
