#!/usr/bin/env bash
# The ubtrfs mount against the do-nothing FUSE file system (bench/nullfs.c),
# alternating round by round so both see the same load: fs_mark creates
# through each, a fresh image and mount every round. For checking a FUSE
# ratio by hand where bench/run.py's two repetitions are too few to tell a
# gap from the round trip's noise.
#   sudo bench/fuse_ab.sh [SIZE] [FILES_PER_THREAD] [ROUNDS] [LOOPS]   (default 0 20000 3 1)
# Needs fs_mark, fusermount3, and build/nullfs (bench/run.sh builds it).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
size=${1:-0} n=${2:-20000} rounds=${3:-3} loops=${4:-1}
bin="${UBTRFS_BIN:-$here/build/ubtrfs}"
nullfs="${NULLFS_BIN:-$here/build/nullfs}"
for p in "$bin" "$nullfs"; do [ -x "$p" ] || { echo "fuse_ab: $p missing (bench/run.sh builds both)" >&2; exit 1; }; done
command -v fs_mark >/dev/null || { echo "fuse_ab: fs_mark missing (scripts/deps.sh installs it)" >&2; exit 1; }
work="$(mktemp -d /tmp/ubtrfs-fuseab.XXXXXX)"
mnt="$work/mnt"
mkdir -p "$mnt"
trap 'fusermount3 -u -z "$mnt" 2>/dev/null; rm -rf "$work"' EXIT
wait_mounted() { for _ in $(seq 200); do mountpoint -q "$mnt" && return 0; sleep 0.05; done; echo "mount failed" >&2; exit 1; }
# One fs_mark run; prints each loop's files/s.
fsm() {
  fs_mark -S 0 -s "$size" -n "$n" -t 2 -L "$loops" -k -d "$mnt/d0" -d "$mnt/d1" 2>&1 |
    awk '/^ +[0-9]+ +[0-9]+ +[0-9]+/{printf "%s ", $4}'
}
echo "fs_mark -S 0 -s $size -n $n -t 2 -L $loops; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(uname -r)"
for r in $(seq "$rounds"); do
  "$bin" mkfs -q --size 8G "$work/img"
  "$bin" mount "$work/img" "$mnt" -f 2>"$work/mount.err" &
  pid=$!
  wait_mounted
  u=$(fsm)
  fusermount3 -u "$mnt"
  wait "$pid"
  rm -f "$work/img"
  "$nullfs" "$mnt" -f -o default_permissions 2>/dev/null &
  pid=$!
  wait_mounted
  z=$(fsm)
  fusermount3 -u "$mnt"
  wait "$pid"
  # The ratio of the runs' rates: files over the sum of the loops' times.
  ratio=$(awk -v a="$u" -v b="$z" 'BEGIN {
    na = split(a, x, " "); nb = split(b, y, " "); sa = 0; sb = 0
    for (i = 1; i <= na; i++) sa += 1 / x[i]
    for (i = 1; i <= nb; i++) sb += 1 / y[i]
    ra = na / sa; rb = nb / sb
    printf "%.2f", ra / rb }')
  echo "round $r: ubtrfs $u| do-nothing $z| ratio $ratio"
done
