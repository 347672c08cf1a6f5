#!/usr/bin/env bash
# Incremental send: `ubtrfs send -p` from an image file against the kernel's
# `btrfs send -p` on a loop mount of the same image, one run each, on a
# subvolume of N small files (default 200000, 1000 per directory) of which
# 1% were changed between two read-only snapshots (every 100th file
# rewritten; plus, per directory, one file renamed and one new). The kernel
# makes the image and the snapshots; both sides read the same committed
# image (its blocks warm in the page cache for both: the kernel's run comes
# first, right after the mount). Both streams are then received by the
# kernel's btrfs receive on top of the full stream of the first snapshot and
# compared with diff -r.
#   bench/send_bench.sh [UBTRFS_BINARY] [N]
# Needs root and loop devices.
set -euo pipefail
cli=${1:-build/ubtrfs}
n=${2:-200000}
work=$(mktemp -d /tmp/ubtrfs-sendbench.XXXXXX)
cleanup() {
  umount "$work/mnt" 2>/dev/null || true
  umount "$work/rmnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/mnt" "$work/rmnt"
t() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f", b - a }'; }

lscpu | sed -n 's/^Model name: *//p' | head -1 | sed 's/^/cpu: /'
truncate -s 8G "$work/src.img"
mkfs.btrfs -q "$work/src.img"
mount -o loop "$work/src.img" "$work/mnt"
btrfs subvolume create "$work/mnt/sv" >/dev/null
python3 "$(dirname "$0")/tiny_files.py" "$work/mnt/sv" "$n"
btrfs subvolume snapshot -r "$work/mnt/sv" "$work/mnt/s1" >/dev/null
python3 - "$work/mnt/sv" "$n" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(0, n, 100):
    with open(os.path.join(root, str(i // 1000), "f%d" % i), "w") as f:
        f.write("changed %d\n" % i)
for d in range(0, (n + 999) // 1000):
    base = os.path.join(root, str(d))
    os.rename(os.path.join(base, "f%d" % (d * 1000 + 1)), os.path.join(base, "renamed"))
    with open(os.path.join(base, "new"), "w") as f:
        f.write("new in %d\n" % d)
PY
btrfs subvolume snapshot -r "$work/mnt/sv" "$work/mnt/s2" >/dev/null
sync -f "$work/mnt"
btrfs send -q -f "$work/full.stream" "$work/mnt/s1"
ksend=$(t btrfs send -q -p "$work/mnt/s1" -f "$work/k.stream" "$work/mnt/s2")
umount "$work/mnt"
usend=$(t "$cli" send -p /s1 -f "$work/u.stream" "$work/src.img:/s2")
"$cli" send -v -p /s1 -f "$work/u2.stream" "$work/src.img:/s2" 2>&1 | sed 's/^/ubtrfs /'
echo "incremental stream: ubtrfs $(stat -c %s "$work/u.stream") bytes, kernel $(stat -c %s "$work/k.stream") bytes; full stream of s1 $(stat -c %s "$work/full.stream") bytes"
for side in u k; do
  echo "$side commands: $("$cli" receive --dump -f "$work/$side.stream" | awk '{print $1}' | sort | uniq -c | awk '{printf "%s %s, ", $2, $1}')"
done
echo "incremental send (1% of $n files changed): ubtrfs $usend s, kernel $ksend s, ratio $(awk -v a="$usend" -v b="$ksend" 'BEGIN { printf "%.1f", b / a }')x"

# Both streams give the same tree.
truncate -s 8G "$work/k.img"
mkfs.btrfs -q "$work/k.img"
mount -o loop "$work/k.img" "$work/rmnt"
mkdir "$work/rmnt/k" "$work/rmnt/u"
for side in k u; do
  btrfs receive -q -f "$work/full.stream" "$work/rmnt/$side"
  btrfs receive -q -f "$work/$side.stream" "$work/rmnt/$side"
done
diff -r "$work/rmnt/k/s2" "$work/rmnt/u/s2" && echo "kernel receive of both streams: equal trees"
umount "$work/rmnt"
