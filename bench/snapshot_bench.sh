#!/usr/bin/env bash
# Snapshot and snapshot-delete cost, ubtrfs vs the kernel, on one image with a
# subvolume of N small files (default 200000):
#   bench/snapshot_bench.sh [UBTRFS_BINARY] [N] [LIB_BENCH_BINARY]
# Prints wall times of `ubtrfs subvolume snapshot` (open, commit, copy of one
# root block, commit), of `btrfs subvolume snapshot` on a loop mount (with
# the sync that makes it durable), the tree blocks each wrote, and of the
# deletes; then, in the library (lib_bench snapshot), the snapshot call alone
# and the first write into the new snapshot with the tree blocks each
# commit wrote, and the kernel's first write (4 KiB, then sync) with the
# tree blocks it added. Needs root and loop devices for the kernel side.
set -euo pipefail
cli=${1:-build/ubtrfs}
n=${2:-200000}
lib_bench=${3:-$(dirname "$cli")/lib_bench}
work=$(mktemp -d /tmp/ubtrfs-snapbench.XXXXXX)
trap 'umount "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/src/d" "$work/mnt"
python3 "$(dirname "$0")/tiny_files.py" "$work/src/d" "$n"
truncate -s 8G "$work/img"
"$cli" mkfs --rootdir "$work/src" "$work/img" >/dev/null
"$cli" subvolume snapshot "$work/img:/" "$work/img:/base" >/dev/null   # the files, as a subvolume
blocks() { btrfs inspect-internal dump-tree -t extent "$1" | grep -c "METADATA_ITEM" || true; }
t() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f", b - a }'; }
cp --sparse=always "$work/img" "$work/kimg"
b0=$(blocks "$work/img")
echo "ubtrfs snapshot: $(t "$cli" subvolume snapshot -r "$work/img:/base" "$work/img:/snap") s, tree blocks $b0 -> $(blocks "$work/img")"
echo "ubtrfs delete (all shared): $(t "$cli" subvolume delete "$work/img:/snap") s"
mount -o loop "$work/kimg" "$work/mnt"
s=$(date +%s.%N); btrfs subvolume snapshot -r "$work/mnt/base" "$work/mnt/snap" >/dev/null; sync -f "$work/mnt"; e=$(date +%s.%N)
echo "kernel snapshot + sync: $(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f", b - a }') s"
s=$(date +%s.%N); btrfs subvolume delete "$work/mnt/snap" >/dev/null; btrfs subvolume sync "$work/mnt" >/dev/null; e=$(date +%s.%N)
echo "kernel delete + cleaner: $(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f", b - a }') s"
umount "$work/mnt"
# The first write into a fresh snapshot copies the path to one leaf.
mid=$((n / 2))
file="/base/d/$((mid / 1000))/f$mid"
echo "ubtrfs library: $("$lib_bench" snapshot "$work/img" /base "$file")"
mount -o loop "$work/kimg" "$work/mnt"
btrfs subvolume snapshot "$work/mnt/base" "$work/mnt/wsnap" >/dev/null; sync -f "$work/mnt"
umount "$work/mnt"
k0=$(blocks "$work/kimg")
mount -o loop "$work/kimg" "$work/mnt"
s=$(date +%s.%N)
dd if=/dev/zero of="$work/mnt/wsnap/d/$((mid / 1000))/f$mid" bs=4096 count=1 conv=notrunc status=none; sync -f "$work/mnt"
e=$(date +%s.%N)
umount "$work/mnt"
echo "kernel first write into a snapshot + sync: $(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f", b - a }') s, tree blocks $k0 -> $(blocks "$work/kimg")"
btrfs check --readonly "$work/img" >/dev/null 2>&1 && echo "ubtrfs image: btrfs check clean"
