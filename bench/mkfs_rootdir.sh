#!/usr/bin/env bash
# ubtrfs mkfs --rootdir against mkfs.btrfs --rootdir on 200,000 empty files
# in 16 directories (issue 3's target tree): wall time, CPU time and peak
# memory of both, run alternately (the machine may be shared: each pair runs
# under the same load), with the median of the per-pair wall-time ratios;
# then both images of the last pair are checked by btrfs check.
#   bench/mkfs_rootdir.sh [FILES_PER_DIR] [PAIRS]
#   UBTRFS_BIN=build-x/ubtrfs bench/mkfs_rootdir.sh   (default build/ubtrfs)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
per_dir=${1:-12500}
pairs=${2:-5}
bin="${UBTRFS_BIN:-$here/build/ubtrfs}"
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
# One warm-up of each (the host tree's inodes in the page cache for both).
"$bin" mkfs -q --size 2G --rootdir "$work/tree" "$work/u.img"
truncate -s 2G "$work/m.img"
mkfs.btrfs -q -f --rootdir "$work/tree" "$work/m.img" >/dev/null 2>&1
: > "$work/runs"
for i in $(seq 1 "$pairs"); do
  rm -f "$work/u.img" "$work/m.img"
  truncate -s 2G "$work/m.img"
  /usr/bin/time -o "$work/t" -f "%e %U %S %M" "$bin" mkfs -q --size 2G --rootdir "$work/tree" "$work/u.img"
  echo "ubtrfs $(cat "$work/t")" >> "$work/runs"
  /usr/bin/time -o "$work/t" -f "%e %U %S %M" mkfs.btrfs -q -f --rootdir "$work/tree" "$work/m.img" >/dev/null 2>&1
  echo "mkfs.btrfs $(cat "$work/t")" >> "$work/runs"
done
python3 - "$work/runs" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
u = [r for r in rows if r[0] == "ubtrfs"]
m = [r for r in rows if r[0] == "mkfs.btrfs"]
print("pair  ubtrfs wall/cpu/peak        mkfs.btrfs wall/cpu/peak     wall ratio")
ratios, cratios = [], []
for i, (a, b) in enumerate(zip(u, m), 1):
    aw, ac, ak = float(a[1]), float(a[2]) + float(a[3]), int(a[4])
    bw, bc, bk = float(b[1]), float(b[2]) + float(b[3]), int(b[4])
    ratios.append(bw / aw); cratios.append(bc / ac)
    print(f"{i:4d}  {aw:6.2f} s {ac:5.2f} s {ak/1024:5.1f} MB   {bw:6.2f} s {bc:5.2f} s {bk/1024:5.1f} MB   {bw/aw:6.1f}x")
med = lambda xs: statistics.median(xs)
print(f"median: ubtrfs {med([float(a[1]) for a in u]):.2f} s wall, {med([float(a[2])+float(a[3]) for a in u]):.2f} s CPU, "
      f"{max(int(a[4]) for a in u)/1024:.1f} MB peak; mkfs.btrfs {med([float(b[1]) for b in m]):.2f} s wall, "
      f"{med([float(b[2])+float(b[3]) for b in m]):.2f} s CPU, {max(int(b[4]) for b in m)/1024:.1f} MB peak")
print(f"median ratio (mkfs.btrfs / ubtrfs): wall {med(ratios):.1f}x, CPU {med(cratios):.1f}x")
PY
if btrfs check --readonly "$work/u.img" >/dev/null 2>&1; then echo "ubtrfs image: btrfs check clean"; else echo "ubtrfs image: btrfs check FAILED"; exit 1; fi
if btrfs check --readonly "$work/m.img" >/dev/null 2>&1; then echo "mkfs.btrfs image: btrfs check clean"; else echo "mkfs.btrfs image: btrfs check FAILED"; fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
