#!/usr/bin/env bash
# A throwaway single-node CephFS mounted twice through ceph-fuse: two clients standing in for two
# hosts, for the shared-tier tests (tests/distributed_fs/) and benchmarks/shared_bench.py --cephfs.
# mon + 1 OSD (memstore) + MDS + mgr on 127.0.0.1; each ceph-fuse runs in its own UTS namespace
# with its own hostname (CLIENT_HOSTNAMES), so the MDS and tiercache's leases see two hosts.
#
# Usage:
#   scripts/cephfs.sh start [MNT_A MNT_B]  (re)start from scratch and mount both clients (~10-20 s);
#                                          installs the Debian packages first when missing (root+apt)
#   scripts/cephfs.sh stop                 unmount both, stop the daemons (idempotent)
#   scripts/cephfs.sh status               cluster state and both mounts
#   scripts/cephfs.sh crash N              host N (1=A, 2=B) dies: kill -9 its ceph-fuse, evict its
#                                          MDS session (its caps and locks go at once), drop the mount
#   scripts/cephfs.sh mount N              mount client N again (after crash)
# Env (defaults): CEPHFS_DIR=/tmp/tiercache-cephfs (state in $CEPHFS_DIR/state, mounts in
#   $CEPHFS_DIR/hostA and hostB), MON_V2_PORT=13330 MON_V1_PORT=16830, daemons bind 127.0.0.1
#   ports 6800-7300 only, MEMSTORE_BYTES=1073741824 (RAM: ~2 bytes RSS per stored byte),
#   CLIENT_HOSTNAMES="hostA hostB", SESSION_TIMEOUT=60, FUSE_PAGECACHE=0 (keep it 0: with the
#   kernel page cache on, a client can read stale bytes after the other's same-size overwrite).
# Semantics (measured with the recipe this is based on): cross-client flock/fcntl locks, O_EXCL,
# rename-over and mtime are coherent; O_APPEND from two clients loses lines; a dead client's caps
# block the other client until its session is evicted (crash does that) or times out.
# Use the cluster: export CEPH_CONF=$CEPHFS_DIR/state/ceph.conf; ceph -s
set -euo pipefail
# shellcheck source=ceph-global.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/ceph-global.sh"
BASE=${CEPHFS_DIR:-/tmp/tiercache-cephfs}
D=$BASE/state
V2=${MON_V2_PORT:-13330}; V1=${MON_V1_PORT:-16830}
MEMSTORE_BYTES=${MEMSTORE_BYTES:-1073741824}
SESSION_TIMEOUT=${SESSION_TIMEOUT:-60}; SESSION_AUTOCLOSE=${SESSION_AUTOCLOSE:-300}
FUSE_PAGECACHE=${FUSE_PAGECACHE:-0}
CLIENT_HOSTNAMES=${CLIENT_HOSTNAMES:-hostA hostB}
PACKAGES="ceph-mon ceph-osd ceph-mds ceph-mgr ceph-fuse uuid-runtime bc"
[ "$SESSION_TIMEOUT" -ge 30 ] || { echo "SESSION_TIMEOUT must be >= 30 (mon refuses less)" >&2; exit 2; }
if [ "$FUSE_PAGECACHE" = 1 ]; then DISABLE_PC=false; else DISABLE_PC=true; fi
export CEPH_CONF="$D/ceph.conf"
ts() { date +%s.%N; }
el() { echo "$2-$1" | bc; }
log() { echo "[cephfs $(date +%T)] $*"; }
die() { echo "cephfs.sh: $*" >&2; exit 1; }

ensure_packages() {  # the daemons and ceph-fuse from Debian, when missing and we may install them
  local missing=()
  for tool in ceph-mon ceph-osd ceph-mds ceph-mgr ceph-fuse uuidgen bc unshare; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  [ ${#missing[@]} = 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; as root: apt-get install $PACKAGES"
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
  log "installing $PACKAGES (missing: ${missing[*]})"
  # another apt run may hold the lock: wait for it instead of failing
  # shellcheck disable=SC2086
  { apt-get -o DPkg::Lock::Timeout=600 update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends $PACKAGES; } >"${TMPDIR:-/tmp}/tiercache-cephfs-apt.log" 2>&1 \
    || die "apt-get install failed (see ${TMPDIR:-/tmp}/tiercache-cephfs-apt.log)"
}

check_host() {  # what a start needs besides the packages
  [ "$(id -u)" = 0 ] || die "needs root (ceph daemons, fuse mounts, UTS namespaces)"
  [ -c /dev/fuse ] || die "no /dev/fuse"
}

umount_one() {  # unmount a (possibly dead) fuse mount
  local m=$1
  if grep -q " $(realpath -m "$m") fuse" /proc/mounts 2>/dev/null; then
    fusermount3 -u "$m" 2>/dev/null || fusermount -u "$m" 2>/dev/null || umount "$m" 2>/dev/null \
      || fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  fi
}

pid_of() {  # pid from a pid file, only if it is still a live ceph process (guards against pid reuse)
  local f=$1 pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  case "$(cat "/proc/$pid/comm" 2>/dev/null)" in ceph-*) echo "$pid";; *) return 1;; esac
}

alive_any() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }

term_wait() {  # TERM the given pids together, wait up to $1 s, then KILL the stragglers
  local grace=$1; shift
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  for _ in $(seq 1 $((grace*10))); do alive_any "$@" || return 0; sleep 0.1; done
  kill -9 "$@" 2>/dev/null || true
  for _ in $(seq 1 50); do alive_any "$@" || return 0; sleep 0.1; done
}

mountpoint_of() { sed -n "${1}p" "$D/mounts"; }

do_stop() {
  local t0 pids=() p f m; t0=$(ts)
  [ -d "$D/run" ] || { log "nothing to stop ($D absent)"; return 0; }
  # 1. unmount (ceph-fuse exits by itself ~1 s after a clean unmount), then TERM/KILL leftovers
  if [ -s "$D/mounts" ]; then
    while read -r m; do [ -n "$m" ] && umount_one "$m"; done < "$D/mounts"
  fi
  for f in "$D"/run/client.*.pid; do p=$(pid_of "$f") && pids+=("$p"); done
  if [ ${#pids[@]} -gt 0 ]; then
    for _ in $(seq 1 30); do alive_any "${pids[@]}" || break; sleep 0.1; done
    term_wait 5 "${pids[@]}"
  fi
  # 2. all daemons at once; a clean MDS shutdown takes 7-12 s, so KILL after 1 s (state is
  #    thrown away by the next start anyway)
  pids=()
  for f in "$D"/run/mds.*.pid "$D"/run/osd.*.pid "$D"/run/mgr.*.pid "$D"/run/mon.*.pid; do
    p=$(pid_of "$f") && pids+=("$p")
  done
  term_wait 1 "${pids[@]+"${pids[@]}"}"
  rm -f "$D"/run/*.pid
  log "stopped in $(el "$t0" "$(ts)")s"
}

do_status() {
  [ -f "$D/ceph.conf" ] || { echo "not set up"; return 1; }
  timeout 20 ceph -s 2>/dev/null || true
  timeout 10 ceph mds stat 2>/dev/null || true
  local m
  [ -s "$D/mounts" ] && while read -r m; do
    if mountpoint -q "$m" && stat -f "$m" >/dev/null 2>&1; then echo "mounted: $m"; else echo "NOT mounted/dead: $m"; fi
  done < "$D/mounts"
  return 0
}

mount_client() {  # mount client N (1|2) at its mountpoint, in its own UTS namespace
  local n=$1 m hn
  m=$(mountpoint_of "$n"); [ -n "$m" ] || die "no mountpoint for client $n"
  umount_one "$m"
  hn=$(echo "$CLIENT_HOSTNAMES" | awk -v n="$n" '{print $n}')
  if [ -n "$hn" ]; then  # the MDS (client ls) and processes started alike see hostname $hn
    unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' sh "$hn" \
      ceph-fuse --id "m$n" "$m" >>"$D/log/ceph-fuse.m$n.out" 2>&1 \
      || { log "ceph-fuse $m failed"; tail "$D/log/ceph-fuse.m$n.out"; exit 1; }
  else
    ceph-fuse --id "m$n" "$m" >>"$D/log/ceph-fuse.m$n.out" 2>&1 \
      || { log "ceph-fuse $m failed"; tail "$D/log/ceph-fuse.m$n.out"; exit 1; }
  fi
  for _ in $(seq 1 100); do mountpoint -q "$m" && stat -f "$m" >/dev/null 2>&1 && break; sleep 0.1; done
  mountpoint -q "$m" || die "$m not mounted"
}

do_crash() {  # the host of client N dies: its ceph-fuse is killed and its session evicted
  local n=${1:?usage: $0 crash N} p m
  m=$(mountpoint_of "$n")
  if p=$(pid_of "$D/run/client.m$n.pid"); then kill -9 "$p"; fi
  # its caps, flocks and fcntl locks go now, not SESSION_TIMEOUT seconds later
  timeout 30 ceph tell mds.a client evict "client_metadata.entity_id=m$n" >/dev/null 2>&1 || true
  [ -n "$m" ] && umount_one "$m"
  log "client $n crashed and evicted; $m unmounted"
}

do_start() {
  local A=${1:-$BASE/hostA} B=${2:-$BASE/hostB}
  ensure_packages
  check_host
  do_stop >/dev/null
  for m in "$A" "$B"; do umount_one "$m"; done
  rm -rf "$D"; mkdir -p "$D"/{run,log,mon.a,osd.0,mds.a,mgr.x} "$A" "$B"
  local free_pct
  free_pct=$(df -P "$D" | awk 'NR==2 {print int($4 * 100 / $2)}')
  # the mon exits at start, without a word on stderr, below mon_data_avail_crit (5 %)
  [ "$free_pct" -gt 5 ] || die "only ${free_pct}% of the disk under $D is free; ceph-mon needs more than 5%"
  printf '%s\n%s\n' "$(realpath "$A")" "$(realpath "$B")" > "$D/mounts"
  local FSID T0 T1 T2 T3 T4 T5 K OSD_UUID ID
  FSID=$(uuidgen); T0=$(ts)
  {
    ceph_global_conf "$D" "$FSID" "$V2" "$V1" 6800 7300 "$MEMSTORE_BYTES"
    cat <<C
mon_data_avail_warn = 5
mds_cache_memory_limit = 268435456
# with early replies the MDS journals a metadata update only on its 5 s tick, and another
# client waiting for that dentry/inode lock stalls up to 5 s (e.g. rename-over-file seen by a reader)
mds_early_reply = false
# the MDS also flushes its journal only on its tick; a lock waiting for a journaled cap flush
# (e.g. B stat()ing a file A just created) otherwise stalls up to 5 s
mds_tick_interval = 0.2
[mon.a]
mon_data = $D/mon.a
[osd.0]
osd_data = $D/osd.0
[mds.a]
mds_data = $D/mds.a
[mgr.x]
mgr_data = $D/mgr.x
[client]
client_oc_size = 104857600
fuse_disable_pagecache = $DISABLE_PC
# quotas (ceph.quota.max_bytes) are enforced by the client
client_quota = true
C
  } > "$D/ceph.conf"
  K="$D/keyring"
  ceph-authtool --create-keyring "$K" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$K" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  ceph-authtool "$K" --gen-key -n osd.0 --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *' >/dev/null
  ceph-authtool "$K" --gen-key -n mds.a --cap mon 'allow profile mds' --cap mgr 'allow profile mds' --cap osd 'allow rwx' --cap mds 'allow *' >/dev/null
  ceph-authtool "$K" --gen-key -n mgr.x --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *' >/dev/null
  for c in m1 m2; do  # rwp: may set quotas (ceph.quota.* xattrs)
    ceph-authtool "$K" --gen-key -n client.$c --cap mon 'allow r' --cap mds 'allow rwp' --cap osd 'allow rw pool=cephfs_data' >/dev/null
  done
  chmod 600 "$K"
  monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$V2,v1:127.0.0.1:$V1]" "$D/monmap" >/dev/null
  ceph-mon --mkfs -i a --monmap "$D/monmap" --keyring "$K"
  ceph-mon -i a
  T1=$(ts)
  OSD_UUID=$(uuidgen)
  ID=$(ceph osd new "$OSD_UUID")
  ceph-osd -i "$ID" --mkfs --osd-uuid "$OSD_UUID" 2>>"$D/log/osd-mkfs.err"
  # big buffers via mmap so glibc gives memstore's freed object data back to the OS
  MALLOC_MMAP_THRESHOLD_=131072 ceph-osd -i "$ID"
  ceph-mds -i a
  ceph-mgr -i x  # without a mgr, statvfs() on the mounts reports 0 size and 0 free
  ceph osd pool create cephfs_metadata 8 >/dev/null 2>&1
  ceph osd pool create cephfs_data 8 >/dev/null 2>&1
  ceph fs new cephfs cephfs_metadata cephfs_data >/dev/null
  ceph fs set cephfs session_timeout "$SESSION_TIMEOUT" >/dev/null
  ceph fs set cephfs session_autoclose "$SESSION_AUTOCLOSE" >/dev/null
  for _ in $(seq 1 300); do ceph osd stat -f json 2>/dev/null | grep -q '"num_up_osds":1' && break; sleep 0.2; done
  T2=$(ts)
  for _ in $(seq 1 300); do ceph mds stat 2>/dev/null | grep -q 'up:active' && break; sleep 0.3; done
  ceph mds stat | grep -q 'up:active' || { log "MDS did not become active"; ceph mds stat; exit 1; }
  T3=$(ts)
  mount_client 1
  mount_client 2
  T4=$(ts)
  for _ in $(seq 1 150); do [ "$(stat -f -c %b "$A")" != 0 ] && break; sleep 0.2; done
  T5=$(ts)
  log "mon-up $(el "$T0" "$T1")s osd-up $(el "$T1" "$T2")s mds-active $(el "$T2" "$T3")s mounts $(el "$T3" "$T4")s statfs-ready $(el "$T4" "$T5")s total $(el "$T0" "$T5")s"
  log "mounted cephfs at $A (client.m1) and $B (client.m2); CEPH_CONF=$CEPH_CONF"
}

case "${1:-}" in
  start) shift; do_start "$@";;
  stop) do_stop;;
  status) do_status;;
  crash) shift; do_crash "$@";;
  mount) shift; mount_client "${1:?usage: $0 mount N}"; log "client $1 mounted";;
  *) echo "usage: $0 start [MNT_A MNT_B] | stop | status | crash N | mount N" >&2; exit 2;;
esac
