#!/usr/bin/env bash
# ubtrfs mkfs --rootdir against mkfs.btrfs --rootdir on 200,000 empty files
# in 16 directories (issue 3's target tree), time and peak memory, with both
# images checked by btrfs check.
#   bench/mkfs_rootdir.sh [FILES_PER_DIR] [RUNS]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
per_dir=${1:-12500}
runs=${2:-3}
bin="$here/build/ubtrfs"
[ -x "$bin" ] || { echo "build first: ./run (or ninja -C build ubtrfs)" >&2; exit 1; }
work="$(mktemp -d /tmp/ubtrfs-mkfsbench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
python3 - "$work/tree" "$per_dir" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for d in range(16):
    p = os.path.join(root, f"d{d:02d}")
    os.makedirs(p)
    for i in range(n):
        open(os.path.join(p, f"f{i:06d}"), "w").close()
PY
echo "tree: 16 directories x $per_dir empty files; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
hyperfine --runs "$runs" --warmup 1 \
  --prepare "rm -f $work/u.img $work/m.img; truncate -s 2G $work/m.img" \
  -n "ubtrfs mkfs --rootdir" "$bin mkfs -q --size 2G --rootdir $work/tree $work/u.img" \
  -n "mkfs.btrfs --rootdir" "mkfs.btrfs -q -f --rootdir $work/tree $work/m.img" \
  --export-markdown "$work/result.md"
rm -f "$work/u.img" "$work/m.img"; truncate -s 2G "$work/m.img"
/usr/bin/time -f "ubtrfs mkfs --rootdir: peak RSS %M KB, CPU %U+%S s" "$bin" mkfs -q --size 2G --rootdir "$work/tree" "$work/u.img"
/usr/bin/time -f "mkfs.btrfs --rootdir: peak RSS %M KB, CPU %U+%S s" mkfs.btrfs -q -f --rootdir "$work/tree" "$work/m.img" >/dev/null
btrfs check --readonly "$work/u.img" >/dev/null 2>&1 && echo "ubtrfs image: btrfs check clean"
btrfs check --readonly "$work/m.img" >/dev/null 2>&1 && echo "mkfs.btrfs image: btrfs check clean"
cat "$work/result.md"
