#!/usr/bin/env bash
# Receiving a full send stream: `ubtrfs receive` into an image file against
# the kernel's `btrfs receive` on a loop mount, side by side in one run, on a
# stream of a subvolume of N small files (default 200000) in directories of
# 1000, made by the kernel's `btrfs send`; and `ubtrfs send` of the received
# snapshot against the kernel's `btrfs send` of the original.
#   bench/receive_bench.sh [UBTRFS_BINARY] [N]
# Needs root and loop devices.
set -euo pipefail
cli=${1:-build/ubtrfs}
n=${2:-200000}
work=$(mktemp -d /tmp/ubtrfs-recvbench.XXXXXX)
cleanup() {
  umount "$work/mnt" 2>/dev/null || true
  umount "$work/rmnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/mnt" "$work/rmnt"
t() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); awk -v a="$s" -v b="$e" 'BEGIN { printf "%.2f", b - a }'; }

truncate -s 8G "$work/src.img"
mkfs.btrfs -q "$work/src.img"
mount -o loop "$work/src.img" "$work/mnt"
btrfs subvolume create "$work/mnt/sv" >/dev/null
python3 "$(dirname "$0")/tiny_files.py" "$work/mnt/sv" "$n"
btrfs subvolume snapshot -r "$work/mnt/sv" "$work/mnt/snap" >/dev/null
sync -f "$work/mnt"
btrfs send -q -f "$work/stream" "$work/mnt/snap"
ksend=$(t btrfs send -q -f "$work/stream2" "$work/mnt/snap")
umount "$work/mnt"
echo "stream: $(stat -c %s "$work/stream") bytes, $n files"

truncate -s 8G "$work/u.img"
"$cli" mkfs "$work/u.img" >/dev/null
urecv=$(t "$cli" receive -f "$work/stream" "$work/u.img")
truncate -s 8G "$work/k.img"
mkfs.btrfs -q "$work/k.img"
mount -o loop "$work/k.img" "$work/rmnt"
s=$(date +%s.%N); btrfs receive -q -f "$work/stream" "$work/rmnt" >/dev/null; sync -f "$work/rmnt"; e=$(date +%s.%N)
umount "$work/rmnt"
krecv=$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.2f", b - a }')
usend=$(t "$cli" send -f "$work/ustream" "$work/u.img:/snap")
echo "receive: ubtrfs $urecv s, kernel (btrfs receive + sync) $krecv s, ratio $(awk -v a="$urecv" -v b="$krecv" 'BEGIN { printf "%.1f", b / a }')x"
echo "full send: ubtrfs $usend s, kernel $ksend s"
btrfs check --readonly "$work/u.img" >/dev/null 2>&1 && echo "ubtrfs image: btrfs check clean"
