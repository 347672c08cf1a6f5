#!/usr/bin/env bash
# A throwaway single-node Ceph cluster on 127.0.0.1 for the RBD tests and
# benchmarks: one monitor, one OSD (memstore: the data lives in the OSD's
# memory), no manager, no authentication, and a pool `rbd` of size 1.
#
#   scripts/ceph-cluster.sh start [DIR]   prints the path of its ceph.conf
#   scripts/ceph-cluster.sh env CONF      prints `export CEPH_CONF=...` lines
#   scripts/ceph-cluster.sh stop CONF     stops its daemons, removes its dir
#   scripts/ceph-cluster.sh kill-osd CONF      kill -9 of the OSD (a crash)
#   scripts/ceph-cluster.sh start-osd CONF     starts it again, waits until it serves
#
# DIR (default: a new mktemp -d under ${TMPDIR:-/tmp}) holds everything; stop
# kills only the daemons whose pid files are in it. Settings from the
# environment: UBTRFS_CEPH_STORE=memstore|bluestore (bluestore on a sparse
# file survives kill -9 of the OSD; memstore does not),
# UBTRFS_CEPH_STORE_BYTES (default 4 GiB), UBTRFS_CEPH_TIMEOUT (seconds
# start may take, default 60).
set -euo pipefail

die() { echo "ceph-cluster: $*" >&2; exit 1; }

# A port nothing listens on: the kernel picks one, and the short gap before
# the monitor binds it is harmless for a test machine.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Kills the daemons whose pid files are in $1/run (only those), then waits
# for them to go so the directory can be removed. SIGKILL: the cluster is
# thrown away, and a memstore OSD given SIGTERM first saves all its objects
# to its directory (seconds, for nothing).
stop_daemons() {
  local dir=$1 pidf pid
  for pidf in "$dir"/run/*.pid; do
    [ -e "$pidf" ] || continue
    pid=$(cat "$pidf" 2>/dev/null || true)
    [ -n "$pid" ] || continue
    kill -9 "$pid" 2>/dev/null || true
  done
  # (a killed ceph daemon takes about 2 s to go)
  for pidf in "$dir"/run/*.pid; do
    [ -e "$pidf" ] || continue
    pid=$(cat "$pidf" 2>/dev/null || true)
    [ -n "$pid" ] || continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  done
}

cmd_start() {
  for t in ceph-mon ceph-osd ceph monmaptool rados rbd uuidgen python3; do
    command -v "$t" >/dev/null || die "$t not found (scripts/deps.sh installs ceph-mon ceph-osd ceph-common)"
  done
  local dir=${1:-}
  if [ -z "$dir" ]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/ubtrfs-ceph.XXXXXX")
  else
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
  fi
  local store=${UBTRFS_CEPH_STORE:-memstore}
  local bytes=${UBTRFS_CEPH_STORE_BYTES:-$((4 << 30))}
  local limit=${UBTRFS_CEPH_TIMEOUT:-60}
  local port fsid osd_uuid conf=$dir/ceph.conf
  port=$(free_port)
  fsid=$(uuidgen)
  osd_uuid=$(uuidgen)
  mkdir -p "$dir/run" "$dir/log" "$dir/mon/ceph-a" "$dir/osd/ceph-0"
  # paxos propose interval: without it each osdmap step waits about a
  # second and start-up takes 8 s instead of 2-5.
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$port]
mon initial members = a
public addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
paxos propose interval = 0.05
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
mon data = $dir/mon/\$cluster-\$id
osd data = $dir/osd/\$cluster-\$id
osd objectstore = $store
memstore device bytes = $bytes
bluestore block path = $dir/osd/block
bluestore block create = true
bluestore block size = $bytes
# A client killed with -9 holds its watch (and so an RBD image's exclusive
# lock) until the OSD times the watch out: 15 s instead of 30 here.
osd client watch timeout = 15
osd max object name len = 256
osd max object namespace len = 64
[client]
log file = /dev/null
admin socket =
EOF
  local t0=$SECONDS
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" >"$dir/log/mkfs-mon.out" 2>&1 ||
    { cat "$dir/log/mkfs-mon.out" >&2; die "ceph-mon --mkfs failed (dir $dir)"; }
  ceph-mon -c "$conf" -i a >"$dir/log/mon.out" 2>&1 ||
    { cat "$dir/log/mon.out" >&2; stop_daemons "$dir"; die "ceph-mon did not start (dir $dir)"; }
  local id
  id=$(timeout "$limit" ceph -c "$conf" --connect-timeout 20 osd new "$osd_uuid" 2>"$dir/log/osd-new.err") ||
    { cat "$dir/log/osd-new.err" >&2; stop_daemons "$dir"; die "the monitor does not answer (dir $dir)"; }
  ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$osd_uuid" >"$dir/log/mkfs-osd.out" 2>&1 ||
    { cat "$dir/log/mkfs-osd.out" >&2; stop_daemons "$dir"; die "ceph-osd --mkfs failed (dir $dir)"; }
  ceph-osd -c "$conf" -i "$id" >"$dir/log/osd.out" 2>&1 ||
    { cat "$dir/log/osd.out" >&2; stop_daemons "$dir"; die "ceph-osd did not start (dir $dir)"; }
  timeout "$limit" ceph -c "$conf" osd pool create rbd 8 8 >/dev/null 2>&1 ||
    { stop_daemons "$dir"; die "pool create failed (dir $dir)"; }
  # Without a manager there are no PG statistics to wait on: an object
  # write returns once the OSD is up and the pool's placement groups active.
  timeout "$limit" rados -c "$conf" -p rbd put ubtrfs-probe "$conf" 2>"$dir/log/probe.err" ||
    { cat "$dir/log/probe.err" >&2; stop_daemons "$dir"; die "the OSD did not come up in ${limit}s (dir $dir)"; }
  rados -c "$conf" -p rbd rm ubtrfs-probe
  timeout "$limit" rbd -c "$conf" pool init rbd || { stop_daemons "$dir"; die "rbd pool init failed (dir $dir)"; }
  echo "ceph-cluster: started in $((SECONDS - t0)) s (mon 127.0.0.1:$port, $store), dir $dir" >&2
  echo "$conf"
}

conf_dir() {
  local conf=${1:-}
  [ -n "$conf" ] || die "usage: $0 ${2} CONF"
  [ -f "$conf" ] || die "$conf: no such file"
  local dir
  dir=$(cd "$(dirname "$conf")" && pwd)
  # stop removes the directory: make sure it is one this script made.
  [ -d "$dir/run" ] && [ -d "$dir/mon" ] && grep -q '^osd objectstore' "$conf" ||
    die "$dir does not look like a cluster started by this script"
  echo "$dir"
}

cmd_stop() {
  local dir
  dir=$(conf_dir "${1:-}" stop)
  stop_daemons "$dir"
  rm -rf "$dir"
}

cmd_env() {
  local conf=${1:-}
  conf_dir "$conf" env >/dev/null
  echo "export CEPH_CONF=$conf UBTRFS_CEPH_CONF=$conf"
}

cmd_kill_osd() {
  local dir pid
  dir=$(conf_dir "${1:-}" kill-osd)
  pid=$(cat "$dir/run/osd.0.pid")
  kill -9 "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
}

cmd_start_osd() {
  local dir conf=${1:-}
  dir=$(conf_dir "$conf" start-osd)
  ceph-osd -c "$conf" -i 0 >>"$dir/log/osd.out" 2>&1 || die "ceph-osd did not start (dir $dir)"
  timeout "${UBTRFS_CEPH_TIMEOUT:-60}" rados -c "$conf" -p rbd put ubtrfs-probe "$conf" ||
    die "the OSD does not serve (dir $dir)"
  rados -c "$conf" -p rbd rm ubtrfs-probe
}

case "${1:-}" in
  kill-osd) shift; cmd_kill_osd "$@" ;;
  start-osd) shift; cmd_start_osd "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  env) shift; cmd_env "$@" ;;
  *) die "usage: $0 start [DIR] | stop CONF | env CONF | kill-osd CONF | start-osd CONF" ;;
esac
