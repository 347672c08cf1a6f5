#!/usr/bin/env bash
# The library on a Ceph RBD image against the same on a local image file
# (issue 20): fs_mark-style create, small commits (time and the requests each
# sends), a 1 GiB file written and read back (bench/rbd_bench.cc), each on
#   file   a sparse image file in $TMPDIR (page cache, fdatasync at commits)
#   rbd    rbd:rbd/IMAGE in a throwaway one-OSD memstore cluster on 127.0.0.1
#          (scripts/ceph-cluster.sh), asynchronous writes (the default)
#   rbd-sync  the same with UBTRFS_RBD_SYNC_WRITES=1: each write waits for
#          its acknowledgement, one round trip per write
# plus the round-trip time of one 4 KiB write to the cluster (rbd bench).
# With UBTRFS_CEPH_CONF set, uses that cluster instead of starting one.
#   bench/rbd_bench.sh [FILES=20000] [WRITE_MIB=1024]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
files=${1:-20000}
mib=${2:-1024}
bin="$here/build/ubtrfs"
bench="$here/build/rbd_bench"
[ -x "$bin" ] && [ -x "$bench" ] || { echo "build first: ninja -C build ubtrfs rbd_bench" >&2; exit 1; }
work="$(mktemp -d "${TMPDIR:-/tmp}/ubtrfs-rbdbench.XXXXXX")"
conf=${UBTRFS_CEPH_CONF:-}
started=""
cleanup() {
  [ -n "$started" ] && "$here/scripts/ceph-cluster.sh" stop "$conf"
  rm -rf "$work"
}
trap cleanup EXIT
if [ -z "$conf" ]; then
  conf=$("$here/scripts/ceph-cluster.sh" start)
  started=1
fi
size=$((mib + 3072))M
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; kernel $(uname -r); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "Ceph: $(ceph --version | cut -d' ' -f1-3), one memstore OSD on 127.0.0.1; $files files, $mib MiB"
lat=$(rbd -c "$conf" create --size 64M rbd/lat && rbd -c "$conf" bench --io-type write --io-size 4K --io-threads 1 \
        --io-total 8M --io-pattern rand rbd/lat 2>/dev/null | awk '/elapsed/ {print $0}')
echo "rbd bench, 4 KiB writes one at a time: $lat"
rbd -c "$conf" rm --no-progress rbd/lat >/dev/null
# fs_mark through `ubtrfs mount -f` of the image: -S 0 (no fsync) and -S 1
# (fsync before close: each fsync commits, so this is commit latency).
mount_fsmark() {  # image [env...]
  local image=$1
  shift
  [ -e /dev/fuse ] && command -v fs_mark >/dev/null || { echo "mount: skipped (no /dev/fuse or fs_mark)"; return; }
  local mnt=$work/mnt
  mkdir -p "$mnt"
  env "$@" "$bin" mount -f "$image" "$mnt" &
  local pid=$!
  for _ in $(seq 1 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
  for sync in 0 1; do
    local n=$files
    [ "$sync" = 1 ] && n=$((files / 20))
    local fps
    fps=$(fs_mark -S "$sync" -s 4096 -n "$n" -t 1 -L 1 -k -d "$mnt/fsm$sync" 2>&1 | awk 'h {print $4; exit} /Files\/sec/ {h=1}')
    echo "mount: fs_mark -S $sync -s 4096 -n $n: $fps files/s"
  done
  fusermount3 -u "$mnt"
  wait "$pid"
}
run() {  # name image [env...]
  local name=$1 image=$2
  shift 2
  echo "== $name"
  "$bin" mkfs -q --size "$size" "$image"  # (creates the RBD image)
  env "$@" "$bench" "$image" --files "$files" --write-mib "$mib"
  mount_fsmark "$image" "$@"
  "$bin" check "$image" >/dev/null || { echo "check failed on $image" >&2; exit 1; }
}
run file "$work/img"
rm -f "$work/img"
run rbd "rbd:rbd/bench-aio:conf=$conf"
rbd -c "$conf" rm --no-progress rbd/bench-aio >/dev/null
run rbd-sync "rbd:rbd/bench-sync:conf=$conf" UBTRFS_RBD_SYNC_WRITES=1
rbd -c "$conf" rm --no-progress rbd/bench-sync >/dev/null
