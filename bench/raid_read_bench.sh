#!/bin/sh
# Reading one large file through `ubtrfs cat` from a single image, a
# two-device RAID0 and a two-device RAID1 (arrays made by mkfs.btrfs, filled
# through a kernel loop mount). Needs root (loop mounts, drop_caches).
# Usage: bench/raid_read_bench.sh [UBTRFS] [SIZE_MIB] [RUNS]
set -eu
UBTRFS=${1:-build/ubtrfs}
SIZE=${2:-1024}
RUNS=${3:-3}
DIR=$(mktemp -d /var/tmp/ubtrfs-raidbench.XXXXXX)
trap 'umount "$DIR/mnt" 2>/dev/null || true; for l in $(losetup -j "$DIR/x" 2>/dev/null | cut -d: -f1); do losetup -d "$l"; done; rm -rf "$DIR"' EXIT
mkdir "$DIR/mnt"
head -c "$((SIZE * 1048576))" /dev/urandom > "$DIR/data"
img=$((SIZE + 512))M
fill() {  # profile, images...
  prof=$1; shift
  for i in "$@"; do truncate -s "$img" "$i"; done
  if [ "$prof" = single ]; then mkfs.btrfs -q -f "$@"; else mkfs.btrfs -q -f -d "$prof" -m "$prof" "$@"; fi
  opts=""; loops=""
  for i in "$@"; do l=$(losetup -f --show "$i"); loops="$loops $l"; opts="$opts,device=$l"; done
  first=$(echo $loops | cut -d' ' -f1)
  mount -o "${opts#,}" "$first" "$DIR/mnt"
  cp "$DIR/data" "$DIR/mnt/big"
  umount "$DIR/mnt"
  for l in $loops; do losetup -d "$l"; done
}
fill single "$DIR/s.img"
fill raid0 "$DIR/r0a.img" "$DIR/r0b.img"
fill raid1 "$DIR/r1a.img" "$DIR/r1b.img"
for what in "single $DIR/s.img" "raid0 $DIR/r0a.img,$DIR/r0b.img" "raid1 $DIR/r1a.img,$DIR/r1b.img"; do
  set -- $what
  best=""
  for r in $(seq "$RUNS"); do
    sync; echo 3 > /proc/sys/vm/drop_caches
    t0=$(date +%s.%N)
    "$UBTRFS" cat "$2" /big > /dev/null
    t1=$(date +%s.%N)
    t=$(echo "$t1 - $t0" | bc)
    if [ -z "$best" ] || [ "$(echo "$t < $best" | bc)" = 1 ]; then best=$t; fi
  done
  echo "$1: best of $RUNS cold reads of $SIZE MiB: ${best}s ($(echo "scale=0; $SIZE / $best" | bc) MiB/s)"
done
