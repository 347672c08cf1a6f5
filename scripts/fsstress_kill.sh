#!/bin/bash
# Not in ./test: fsstress (xfstests) through the mount, the daemon killed
# with SIGKILL in the middle, then both replays of the tree log the fsyncs
# left: ubtrfs's (a read-only open, then a writable one; ubtrfs check and
# btrfs check) and the kernel's (a loop mount of a copy; btrfs check), and
# the two trees compared with diff -r (device nodes aside: diff cannot
# compare them).
#   scripts/fsstress_kill.sh [SEED] [MOUNT_OPTIONS]
# Needs root, loop devices and an fsstress binary (FSSTRESS=..., default
# /tmp/xfstests/ltp/fsstress; docs/RELIABILITY.md says how to build it).
set -u
seed=${1:-7}
opts=${2:-}
U=${UBTRFS:-$(dirname "$0")/../build/ubtrfs}
FS=${FSSTRESS:-/tmp/xfstests/ltp/fsstress}
work=$(mktemp -d /tmp/ubtrfs-fsstress.XXXXXX)
img=$work/img mnt=$work/mnt kmnt=$work/kmnt
mkdir -p "$mnt" "$kmnt"
trap 'fusermount3 -u -z "$mnt" 2>/dev/null; umount "$kmnt" 2>/dev/null; rm -rf "$work"' EXIT
"$U" mkfs --size 2G "$img" >/dev/null
"$U" mount -f -o "stats${opts:+,$opts}" "$img" "$mnt" 2>"$work/mount.err" &
mpid=$!
for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.05; done
mkdir "$mnt/dir"
timeout 20 "$FS" -d "$mnt/dir" -n 200000 -p 4 -s "$seed" >"$work/log" 2>&1 &
fpid=$!
sleep 12
kill -9 "$mpid"; wait "$mpid" 2>/dev/null
wait "$fpid" 2>/dev/null
fusermount3 -u -z "$mnt" 2>/dev/null
fail=0
echo "killed; log_root $(btrfs inspect-internal dump-super "$img" | awk '$1=="log_root"{print $2}')"
cp --sparse=always "$img" "$img.k"
"$U" ls "$img" / >/dev/null || fail=1
"$U" mkdir "$img:/after-replay" || fail=1
"$U" check "$img" | tail -1
"$U" check "$img" >/dev/null 2>&1 || fail=1
btrfs check --readonly "$img" >/dev/null 2>&1 || { echo "btrfs check after ubtrfs's replay fails"; fail=1; }
mount -o loop "$img.k" "$kmnt" || { echo "the kernel's replay fails"; exit 1; }
"$U" cp "$img:/" "$work/out" 2>/dev/null
rmdir "$work/out/after-replay"
diff -r --no-dereference "$work/out" "$kmnt" 2>&1 | grep -v "character special\|block special" >"$work/diff.txt"
if [ -s "$work/diff.txt" ]; then echo "the replays differ:"; head "$work/diff.txt"; fail=1; else echo "ubtrfs's replay equals the kernel's"; fi
umount "$kmnt"
btrfs check --readonly "$img.k" >/dev/null 2>&1 || { echo "btrfs check after the kernel's replay fails"; fail=1; }
exit $fail
