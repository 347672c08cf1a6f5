#!/usr/bin/env bash
# Image building (issue 19), each case against its floor and mkfs.btrfs in
# the same run, rounds alternating so every tool runs under the same load:
#   share   /usr/share (or $SHARE): ubtrfs mkfs --rootdir, with --shrink,
#           mkfs.btrfs --rootdir, and the floor: the tree's bytes as one tar
#           file + sync
#   large   1 GiB of incompressible files (8 x 128 MiB): ubtrfs mkfs, and
#           cp -r + sync (the floor), mkfs.btrfs
#   zstd    a compressible text tree: ubtrfs mkfs --compress zstd against a
#           kernel loop mount with compress=zstd + cp -a + umount (mkfs.btrfs
#           6.2 has no --compress), and against a newer mkfs.btrfs
#           --compress zstd given as MKFS_BTRFS_NEW=PATH (one built from
#           btrfs-progs 6.13 or later); the image's data bytes of each
#   empty   200,000 empty files in 16 directories: ubtrfs against mkfs.btrfs
# ubtrfs is mkfs.ubtrfs, the mkfs program (as mkfs.btrfs is btrfs-progs');
# the large case also runs `ubtrfs mkfs` (ubtrfs-verb), whose peak memory is
# that of the whole command.
# Wall time (s) and peak RSS (MB, /usr/bin/time) per run; medians at the end.
#   bench/image_build.sh [ROUNDS] [CASES...]     (default 3, all cases)
#   UBTRFS_BIN=build-x/ubtrfs MKFS_BIN=build-x/mkfs.ubtrfs bench/image_build.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
rounds=${1:-3}
shift || true
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(share large zstd empty)
bin="${UBTRFS_BIN:-$here/build/ubtrfs}"
share="${SHARE:-/usr/share}"
new_mkfs="${MKFS_BTRFS_NEW:-}"
mkfs="${MKFS_BIN:-$(dirname "$bin")/mkfs.ubtrfs}"
[ -x "$bin" ] && [ -x "$mkfs" ] || { echo "build first: ninja -C build ubtrfs mkfs.ubtrfs" >&2; exit 1; }
work="$(mktemp -d /tmp/ubtrfs-imgbench.XXXXXX)"
cleanup() { mountpoint -q "$work/mnt" 2>/dev/null && umount "$work/mnt"; rm -rf "$work"; }
trap cleanup EXIT
runs="$work/runs"
: > "$runs"

# run CASE TOOL CMD...: times CMD, records wall and peak RSS. Each starts
# with the disk quiet: the previous tool's writeback (a loop mount's
# unmount leaves its image dirty in the page cache) would otherwise land
# in the next one's time, and on a virtual disk with a write-back cache
# its final flush persists whatever anyone wrote since the last one.
run() {
  local c=$1 t=$2
  shift 2
  sync
  /usr/bin/time -o "$work/t" -f "%e %M" "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  echo "$c $t $(cat "$work/t")" >> "$runs"
}

echo "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(uname -r); btrfs-progs $(mkfs.btrfs --version | awk '{print $NF}')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

for c in "${cases[@]}"; do
  case $c in
    share)
      src="$share"
      echo "share: $src, $(du -sh --apparent-size "$src" 2>/dev/null | cut -f1) apparent, $(find "$src" | wc -l) entries"
      tar -cf /dev/null "$src" 2>/dev/null || true  # warm the page cache for everyone
      for i in $(seq 1 "$rounds"); do
        rm -f "$work"/*.img "$work/floor.tar"
        run share floor sh -c "tar -cf '$work/floor.tar' '$src' 2>/dev/null; sync"
        rm -f "$work/floor.tar"
        run share ubtrfs "$mkfs" -q --size 8G --rootdir "$src" "$work/u.img"
        run share ubtrfs-shrink "$mkfs" -q --shrink --rootdir "$src" "$work/s.img"
        truncate -s 8G "$work/m.img"
        run share mkfs.btrfs mkfs.btrfs -q -f --rootdir "$src" "$work/m.img"
        echo "share sizes: ubtrfs --shrink $(stat -c %s "$work/s.img")" >> "$work/notes"
      done
      btrfs check --readonly "$work/s.img" >/dev/null 2>&1 && echo "share: --shrink image btrfs check clean" \
        || echo "share: --shrink image btrfs check FAILED"
      rm -f "$work"/*.img
      ;;
    large)
      mkdir -p "$work/large"
      for f in $(seq 1 8); do head -c 128M /dev/urandom > "$work/large/f$f"; done
      sync
      for i in $(seq 1 "$rounds"); do
        rm -rf "$work"/*.img "$work/copy"
        run large floor sh -c "cp -r '$work/large' '$work/copy' && sync"
        rm -rf "$work/copy"
        run large ubtrfs "$mkfs" -q --size 2G --rootdir "$work/large" "$work/u.img"
        rm -f "$work/u.img"
        run large ubtrfs-verb "$bin" mkfs -q --size 2G --rootdir "$work/large" "$work/u.img"
        rm -f "$work/u.img"
        truncate -s 2G "$work/m.img"
        run large mkfs.btrfs mkfs.btrfs -q -f --rootdir "$work/large" "$work/m.img"
      done
      rm -rf "$work/large" "$work"/*.img
      ;;
    zstd)
      # Text that compresses about as /usr/share/doc does: words from a
      # dictionary-like vocabulary, 400 files of 64 KiB-1 MiB.
      python3 - "$work/text" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(19)
vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10))) for _ in range(5000)]
for d in range(20):
    p = os.path.join(root, f"d{d:02d}")
    os.makedirs(p)
    for i in range(20):
        size = rng.randint(64 << 10, 1 << 20)
        words, n = [], 0
        while n < size:
            w = rng.choice(vocab)
            words.append(w)
            n += len(w) + 1
        with open(os.path.join(p, f"f{i:03d}.txt"), "w") as f:
            f.write(" ".join(words)[:size])
PY
      echo "zstd: $(du -sh --apparent-size "$work/text" | cut -f1) of text in $(find "$work/text" -type f | wc -l) files"
      mkdir -p "$work/mnt"
      for i in $(seq 1 "$rounds"); do
        rm -f "$work"/*.img
        run zstd ubtrfs "$mkfs" -q --size 2G --compress zstd --rootdir "$work/text" "$work/u.img"
        truncate -s 2G "$work/k.img"
        mkfs.btrfs -q -f "$work/k.img" >/dev/null 2>&1
        run zstd kernel sh -c "mount -o loop,compress=zstd '$work/k.img' '$work/mnt' && cp -a '$work/text/.' '$work/mnt/' && umount '$work/mnt'"
        if [ -n "$new_mkfs" ]; then
          truncate -s 2G "$work/n.img"
          run zstd mkfs.btrfs-new "$new_mkfs" -q -f --compress zstd --rootdir "$work/text" "$work/n.img"
        fi
      done
      [ -n "$new_mkfs" ] && echo "zstd: mkfs.btrfs-new is $new_mkfs ($("$new_mkfs" --version | head -1)); data bytes used" \
           "$(btrfs inspect-internal dump-super "$work/n.img" | awk '/^bytes_used/{print $2}')" >> "$work/notes"
      echo "zstd data bytes used: ubtrfs $(btrfs inspect-internal dump-super "$work/u.img" | awk '/^bytes_used/{print $2}')," \
           "kernel $(btrfs inspect-internal dump-super "$work/k.img" | awk '/^bytes_used/{print $2}') (all trees + data)" >> "$work/notes"
      rm -rf "$work/text" "$work"/*.img
      ;;
    empty)
      python3 - "$work/empty" <<'PY'
import os, sys
for d in range(16):
    p = os.path.join(sys.argv[1], f"d{d:02d}")
    os.makedirs(p)
    for i in range(12500):
        open(os.path.join(p, f"f{i:06d}"), "w").close()
PY
      for i in $(seq 1 "$rounds"); do
        rm -f "$work"/*.img
        run empty ubtrfs "$mkfs" -q --size 2G --rootdir "$work/empty" "$work/u.img"
        truncate -s 2G "$work/m.img"
        run empty mkfs.btrfs mkfs.btrfs -q -f --rootdir "$work/empty" "$work/m.img"
      done
      rm -rf "$work/empty" "$work"/*.img
      ;;
  esac
done

python3 - "$runs" <<'PY'
import statistics, sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c, t, wall, rss = line.split()
    rows[(c, t)].append((float(wall), int(rss)))
print(f"{'case':6} {'tool':14} {'runs':>4} {'median s':>9} {'min s':>7} {'peak MB':>8}  vs floor")
floor = {c: statistics.median(w for w, _ in v) for (c, t), v in rows.items() if t in ("floor", "kernel")}
for (c, t), v in rows.items():
    walls = [w for w, _ in v]
    med = statistics.median(walls)
    ref = floor.get(c)
    rel = f"{med / ref:5.2f}x" if ref and t not in ("floor", "kernel") else ""
    print(f"{c:6} {t:14} {len(v):4d} {med:9.2f} {min(walls):7.2f} {max(r for _, r in v)/1024:8.1f}  {rel}")
for c in sorted({c for c, _ in rows}):
    for other in ("mkfs.btrfs", "mkfs.btrfs-new"):
        if (c, other) in rows and (c, "ubtrfs") in rows:
            u = statistics.median(w for w, _ in rows[(c, "ubtrfs")])
            o = statistics.median(w for w, _ in rows[(c, other)])
            print(f"{c}: ubtrfs {o / u:.2f}x as fast as {other} (medians)")
PY
[ -f "$work/notes" ] && sort -u "$work/notes"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
