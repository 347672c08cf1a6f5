#!/usr/bin/env bash
# `ubtrfs cp` of a 10,000-file image against a read-only kernel loop mount
# plus `cp -a`, both from a cold page cache. Needs root (loop mount, drop
# caches); without it, only the ubtrfs side is measured.
#   bench/cp_vs_kernel.sh [FILES] [RUNS]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
files=${1:-10000}
runs=${2:-5}
bin="$here/build/ubtrfs"
[ -x "$bin" ] || { echo "build first: ./run (or ninja -C build ubtrfs)" >&2; exit 1; }
work="$(mktemp -d /tmp/ubtrfs-bench.XXXXXX)"
mnt="$work/mnt"
cleanup() { mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"; rm -rf "$work"; }
trap cleanup EXIT

python3 "$here/bench/make_small_files.py" "$work/src" "$files"
truncate -s 2G "$work/img"
mkfs.btrfs -q -f --rootdir "$work/src" "$work/img" >/dev/null
echo "image: $files files, $(du -sh "$work/src" | cut -f1) of data; $(nproc) cores; kernel $(uname -r)"

drop="sync"
if [ "$(id -u)" -eq 0 ]; then drop="sync; echo 3 > /proc/sys/vm/drop_caches"; fi
mkdir -p "$mnt"
cmds=("$bin cp $work/img:/ $work/out")
names=("ubtrfs cp")
if [ "$(id -u)" -eq 0 ] && mount -o loop,ro "$work/img" "$mnt" 2>/dev/null; then
  umount "$mnt"
  cmds+=("mount -o loop,ro $work/img $mnt && cp -a $mnt/. $work/out && umount $mnt")
  names+=("kernel mount + cp -a")
else
  echo "loop mounts unavailable here: measuring ubtrfs only" >&2
fi
args=()
for i in "${!cmds[@]}"; do args+=(-n "${names[$i]}" "${cmds[$i]}"); done
hyperfine --runs "$runs" --warmup 1 --prepare "rm -rf $work/out; $drop" "${args[@]}" \
  --export-markdown "$work/result.md"
# Correctness of what was timed.
rm -rf "$work/out"; "$bin" cp "$work/img:/" "$work/out"; diff -r "$work/src" "$work/out" && echo "copy verified"
cat "$work/result.md"
