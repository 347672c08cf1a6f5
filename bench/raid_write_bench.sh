#!/bin/sh
# Writing into arrays of each profile: one large file and many 4 KiB files,
# with `ubtrfs cp` (which commits and flushes) and with the kernel (loop
# mount, cp, umount), side by side. RAID5/6 writes are read-modify-writes
# of whole rows (alloc/chunk_io.cc); this shows what that costs against the
# mirrored profiles and against the kernel's RAID5/6. Needs root (loop
# mounts). Usage: bench/raid_write_bench.sh [UBTRFS] [LARGE_MIB] [SMALL_FILES]
set -eu
UBTRFS=${1:-build/ubtrfs}
SIZE=${2:-512}
SMALL=${3:-5000}
DIR=$(mktemp -d /var/tmp/ubtrfs-raidwrite.XXXXXX)
trap 'umount "$DIR/mnt" 2>/dev/null || true; for l in $(losetup -j "$DIR/x" 2>/dev/null | cut -d: -f1); do losetup -d "$l"; done; rm -rf "$DIR"' EXIT
mkdir "$DIR/mnt" "$DIR/large" "$DIR/small"
head -c "$((SIZE * 1048576))" /dev/urandom > "$DIR/large/big"
i=0
while [ "$i" -lt "$SMALL" ]; do head -c 4096 /dev/urandom > "$DIR/small/f$i"; i=$((i + 1)); done
img=$((SIZE * 2 + 512))M
now() { date +%s.%N; }
images() {  # count -> "$DIR/d1.img ..." fresh sparse files
  out=""
  for n in $(seq "$1"); do rm -f "$DIR/d$n.img"; truncate -s "$img" "$DIR/d$n.img"; out="$out $DIR/d$n.img"; done
  echo $out
}
echo "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(uname -r); $SIZE MiB file, $SMALL x 4 KiB files"
printf '%-8s %-7s %10s %10s\n' profile writer large_s small_s
for spec in "single 1" "raid1 2" "raid5 3" "raid6 4"; do
  set -- $spec
  prof=$1 n=$2
  for what in large small; do
    devs=$(images "$n")
    joined=$(echo $devs | tr ' ' ',')
    "$UBTRFS" mkfs -q -f -d "$prof" -m "$( [ "$prof" = single ] && echo dup || echo "$prof")" $devs
    sync
    t0=$(now); "$UBTRFS" cp "$DIR/$what" "$joined:/$what"; t1=$(now)
    eval "u_$what=$(echo "$t1 - $t0" | bc)"
    devs=$(images "$n")
    mkfs.btrfs -q -f -d "$prof" -m "$( [ "$prof" = single ] && echo dup || echo "$prof")" $devs >/dev/null 2>&1
    opts="" loops=""
    for f in $devs; do l=$(losetup -f --show "$f"); loops="$loops $l"; opts="$opts,device=$l"; done
    mount -o "${opts#,}" $(echo $loops | cut -d' ' -f1) "$DIR/mnt"
    sync
    t0=$(now); cp -r "$DIR/$what" "$DIR/mnt/"; umount "$DIR/mnt"; t1=$(now)
    eval "k_$what=$(echo "$t1 - $t0" | bc)"
    for l in $loops; do losetup -d "$l"; done
  done
  printf '%-8s %-7s %10.2f %10.2f\n' "$prof" ubtrfs "$u_large" "$u_small"
  printf '%-8s %-7s %10.2f %10.2f\n' "$prof" kernel "$k_large" "$k_small"
done
