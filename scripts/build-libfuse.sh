#!/usr/bin/env bash
# Builds libfuse 3.17 (and its fusermount3) from Debian's source archive into $VENV/libfuse,
# where the mount finds it when it runs as root: FUSE passthrough (the kernel reading a warm
# file's tier copy itself) needs libfuse >= 3.16, and Debian 12 ships 3.14. Idempotent; any
# failure leaves the system's libfuse in use (the mount then serves reads itself) and says so.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TIERCACHE_VENV:-$ROOT/.venv}
VERSION=3.17.2
SHA256=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
URL=http://deb.debian.org/debian/pool/main/f/fuse3/fuse3_${VERSION}.orig.tar.gz
PREFIX=$VENV/libfuse
if [ -e "$PREFIX/lib/libfuse3.so.$VERSION" ] && [ -x "$PREFIX/bin/fusermount3" ]; then
  exit 0
fi
for tool in cc curl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-libfuse: $tool is missing; the mount keeps the system's libfuse" >&2
    exit 1
  fi
done
# The build tools come from PyPI, pinned, into the venv.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  -c "$ROOT/scripts/constraints.txt" meson ninja
export PATH="$VENV/bin:$PATH"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
curl -fsS -m 300 -o "$WORK/src.tar.gz" "$URL"
echo "$SHA256  $WORK/src.tar.gz" | sha256sum -c --quiet -
tar -xzf "$WORK/src.tar.gz" -C "$WORK"
cd "$WORK/fuse-$VERSION"
# No setuid helper and no system files: the build serves this environment's root mounts only.
meson setup build --prefix="$PREFIX" --libdir=lib -Dutils=true -Dexamples=false \
  -Dtests=false -Duseroot=false -Dinitscriptdir= -Dudevrulesdir="$PREFIX/udev" \
  -Ddisable-mtab=true >"$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log" >&2; exit 1; }
ninja -C build install >"$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log" >&2; exit 1; }
echo "build-libfuse: libfuse $VERSION in $PREFIX" >&2
