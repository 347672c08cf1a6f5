#!/usr/bin/env bash
# fsync cost, side by side in one run, on one kind of image (a 1 GiB image
# file written in full first, so that no run pays for the host file
# system's block allocation):
#   1. the library: 4 KiB append + Fsync (tree log) against 4 KiB append +
#      Commit (a full commit: what fsync was before the log), fsync_bench;
#   2. through the mount, a 4 KiB append + fsync loop and a SQLite insert
#      loop (one row per transaction, synchronous=FULL, journal_mode DELETE:
#      every transaction fsyncs the journal, its directory and the database):
#      ubtrfs mount (tree log), ubtrfs mount -o notreelog (full commits),
#      and the kernel's btrfs on a loop mount of the same kind of image;
#   3. the floor: the writes of an fsync and its two flushes on a host file
#      of the same disk, with no file system work (what no design that the
#      kernel can replay gets under).
# Each case runs REPS times in turn (default 3); the median is printed.
#   bench/fsync_bench.sh [BUILD_DIR] [REPS]
# Needs root and loop devices for the kernel's figures (skipped otherwise).
set -euo pipefail
build=${1:-build}
reps=${2:-3}
cli=$build/ubtrfs
work=$(mktemp -d /work/ubtrfs-fsyncbench.XXXXXX 2>/dev/null || mktemp -d /tmp/ubtrfs-fsyncbench.XXXXXX)
cleanup() {
  fusermount3 -u "$work/mnt" 2>/dev/null || umount "$work/mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/mnt"

fresh() {  # a fully written 1 GiB image with a filesystem
  dd if=/dev/zero of="$1" bs=1M count=1024 status=none conv=fsync
  if [ "$2" = kernel ]; then mkfs.btrfs -q -f "$1" >/dev/null 2>&1; else "$cli" mkfs --force "$1" >/dev/null; fi
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

loop_py=$(cat <<'PY'
import os, sys, time
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
buf = b"x" * 4096
t = time.perf_counter()
for i in range(n):
    os.write(fd, buf)
    os.fsync(fd)
print("%.1f" % (n / (time.perf_counter() - t)))
os.close(fd)
PY
)
sqlite_py=$(cat <<'PY'
import sqlite3, sys, time
path, n = sys.argv[1], int(sys.argv[2])
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)")
t = time.perf_counter()
for i in range(n):
    db.execute("BEGIN")
    db.execute("INSERT INTO t (v) VALUES (?)", ("row %d " % i * 4,))
    db.execute("COMMIT")
print("%.1f" % (n / (time.perf_counter() - t)))
db.close()
PY
)

# The floor of any fsync that a kernel can replay: the file's bytes and the
# log's blocks, a flush, the superblock that points at them, a flush. Here
# as a host file on the same disk: a 4 KiB append and a 16 KiB block write,
# fdatasync, a 4 KiB write at 64 KiB, fdatasync (no file system work at all).
floor_py=$(cat <<'PY'
import os, sys, time
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)
buf, blk, sb = b"x" * 4096, b"b" * 16384, b"s" * 4096
t = time.perf_counter()
for i in range(n):
    os.pwrite(fd, buf, (256 << 20) + i * 4096)
    os.pwrite(fd, blk, (512 << 20) + (i % 64) * 16384)
    os.fdatasync(fd)
    os.pwrite(fd, sb, 65536)
    os.fdatasync(fd)
print("%.1f" % (n / (time.perf_counter() - t)))
os.close(fd)
PY
)

have_kernel=1
if ! losetup -f >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then have_kernel=0; fi

mount_side() {  # $1 = ubtrfs|notreelog|kernel, $2 = workload (loop|sqlite), $3 = count
  local img=$work/img
  if [ "$1" = kernel ]; then
    fresh "$img" kernel
    mount -o loop "$img" "$work/mnt"
  else
    fresh "$img" ubtrfs
    local opts=rw
    [ "$1" = notreelog ] && opts=notreelog
    "$cli" mount -o "$opts" "$img" "$work/mnt" &
    for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.05; done
  fi
  local r
  if [ "$2" = loop ]; then
    r=$(python3 -c "$loop_py" "$work/mnt/f" "$3")
  else
    r=$(python3 -c "$sqlite_py" "$work/mnt/db.sqlite" "$3")
  fi
  if [ "$1" = kernel ]; then umount "$work/mnt"; else fusermount3 -u "$work/mnt"; wait; fi
  echo "$r"
}

lscpu | sed -n 's/^Model name: *//p' | head -1 | sed 's/^/cpu: /'
echo "kernel: $(uname -r); load before: $(cut -d' ' -f1-3 /proc/loadavg)"

declare -A res
for rep in $(seq "$reps"); do
  dd if=/dev/zero of="$work/floor" bs=1M count=1024 status=none conv=fsync
  res[floor-2-flushes]+="$(python3 -c "$floor_py" "$work/floor" 1000) "
  rm -f "$work/floor"
  for mode in fsync commit; do
    fresh "$work/lib.img" ubtrfs
    v=$("$build/fsync_bench" "$work/lib.img" --mode "$mode" --count 1000 | sed -n 's/.*"per_second": \([0-9.]*\).*/\1/p')
    res[lib-$mode]+="$v "
  done
  for side in ubtrfs notreelog kernel; do
    [ "$side" = kernel ] && [ "$have_kernel" = 0 ] && continue
    res[loop-$side]+="$(mount_side "$side" loop 1000) "
    res[sqlite-$side]+="$(mount_side "$side" sqlite 300) "
  done
done

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-44s %12s   %s\n' "case (median of $reps)" "per second" "runs"
for k in floor-2-flushes lib-fsync lib-commit loop-ubtrfs loop-notreelog loop-kernel sqlite-ubtrfs sqlite-notreelog sqlite-kernel; do
  [ -n "${res[$k]:-}" ] || continue
  m=$(echo "${res[$k]}" | tr ' ' '\n' | grep . | median)
  printf '%-44s %12s   %s\n' "$k" "$m" "${res[$k]}"
done
