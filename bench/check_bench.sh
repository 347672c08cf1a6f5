#!/bin/bash
# `ubtrfs check` against `btrfs check --readonly`: wall time and peak memory
# on an image the kernel made (root, loop mount): a subvolume with N small
# files (bench/make_small_files.py), a snapshot of it, a few changes to the
# snapshot so that some blocks are shared and some not.
#   bench/check_bench.sh UBTRFS [N=200000] [WORKDIR=/tmp/ubtrfs-check-bench]
# Reuses WORKDIR/snap.img when it exists. Prints one line per checker.
set -euo pipefail
ubtrfs=$(realpath "$1"); n=${2:-200000}; work=${3:-/tmp/ubtrfs-check-bench}
here=$(dirname "$(realpath "$0")")
img=$work/snap.img; mnt=$work/mnt
mkdir -p "$work" "$mnt"
if [ ! -e "$img" ]; then
  truncate -s 8G "$img.tmp"
  mkfs.btrfs -q "$img.tmp"
  mount -o loop "$img.tmp" "$mnt"
  btrfs -q subvolume create "$mnt/sv"
  python3 "$here/make_small_files.py" "$mnt/sv" "$n"
  sync
  btrfs -q subvolume snapshot "$mnt/sv" "$mnt/snap"
  for i in $(seq 0 100 $((n - 1))); do echo changed > "$mnt/snap/d$(printf %04d $((i / 100)))/f$(printf %06d $i)"; done
  sync
  umount "$mnt"
  mv "$img.tmp" "$img"
fi
cat "$img" > /dev/null  # page cache warm for both
measure() {  # name cmd...
  local out; out=$(mktemp)
  /usr/bin/time -f "%e %M" -o "$out" "${@:2}" > /dev/null 2>&1 || true
  read -r secs kib < "$out"; rm -f "$out"
  printf '%-24s %8.2f s %8d MiB\n' "$1" "$secs" $((kib / 1024))
}
echo "image: $n files in a subvolume + snapshot; $(du -h --apparent-size "$img" | cut -f1) apparent, $(du -h "$img" | cut -f1) used; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
"$ubtrfs" check "$img" | grep -E 'tree_blocks|file_extent_refs|inodes|errors' | tr '\n' ' '; echo
for run in 1 2; do
  measure "ubtrfs check ($run)" "$ubtrfs" check "$img"
  measure "btrfs check ($run)" btrfs check --readonly "$img"
done
