#!/usr/bin/env bash
# Rebuilds the seed corpora of the whole-image fuzz targets
# (corpus/image_{open,read,write}_fuzz/) from a few small images:
#   ubtrfs mkfs --rootdir and mkfs.btrfs --rootdir of the same small tree, with
#   different node sizes and checksum types, an empty ubtrfs mkfs image, and
#   (when loop mounts work) a kernel-written image with compressed extents.
#
#   tests/fuzz/make_corpus.sh UBTRFS_BINARY
#
# Seeds are the images in the encoding of fuzz_image.h (make_seed.py); the
# write target's seeds also carry a short operation script.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
ubtrfs=${1:?usage: $0 UBTRFS_BINARY}
tmp=$(mktemp -d /tmp/ubtrfs-corpus-XXXXXX)
mnt=""
cleanup() {
  if [[ -n $mnt ]] && mountpoint -q "$mnt"; then umount "$mnt"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# The host tree: small files (inline), a few-page file, an empty file, a
# nested directory, a symlink, a hard link and xattrs.
src=$tmp/src
mkdir -p "$src/dir/sub" "$src/empty-dir"
printf 'hello\n' >"$src/hello.txt"
head -c 300 /dev/zero | tr '\0' 'a' >"$src/dir/inline"
awk 'BEGIN { for (i = 0; i < 700; i++) printf "line %04d of a file\n", i }' >"$src/dir/pages.txt"  # ~14 KiB
: >"$src/empty"
printf 'deep\n' >"$src/dir/sub/deep"
ln -s dir/pages.txt "$src/link"
ln "$src/hello.txt" "$src/dir/hardlink"
setfattr -n user.color -v blue "$src/hello.txt" 2>/dev/null || true
setfattr -n user.note -v "a directory" "$src/dir" 2>/dev/null || true

# Write script (see image_write_fuzz.cc): create, write, mkdir, setxattr,
# rename, commit, unlink, symlink, truncate.
ops=000000000002010000044101000300000500011000030000000200
ops+=0c040001070004050000090201000b0001

mk() {  # name, then the command that creates $tmp/$name
  local name=$1
  shift
  "$@" >/dev/null
  for t in open read write; do
    mkdir -p "$here/corpus/image_${t}_fuzz"
    local extra=()
    [[ $t == write ]] && extra=(--ops "$ops")
    python3 "$here/make_seed.py" "$tmp/$name" "$here/corpus/image_${t}_fuzz/$name" "${extra[@]}"
  done
  echo "$name: $(stat -c %s "$here/corpus/image_open_fuzz/$name") bytes"
}

truncate -s 128M "$tmp/ub_4k_crc32c"
mk ub_4k_crc32c "$ubtrfs" mkfs -q -f -n 4096 --csum crc32c --rootdir "$src" "$tmp/ub_4k_crc32c"
truncate -s 128M "$tmp/ub_16k_xxhash"
mk ub_16k_xxhash "$ubtrfs" mkfs -q -f -n 16384 --csum xxhash --rootdir "$src" "$tmp/ub_16k_xxhash"
truncate -s 128M "$tmp/ub_empty_sha256"
mk ub_empty_sha256 "$ubtrfs" mkfs -q -f -n 4096 --csum sha256 "$tmp/ub_empty_sha256"
# fs-verity files: one block, two levels with SHA-512 and a salt.
truncate -s 128M "$tmp/ub_4k_verity"
mk_verity() {
  "$ubtrfs" mkfs -q -f -n 4096 --rootdir "$src" "$tmp/ub_4k_verity" &&
    "$ubtrfs" fsverity enable "$tmp/ub_4k_verity:/hello.txt" &&
    "$ubtrfs" fsverity enable --hash-alg sha512 --block-size 1024 --salt 0102 "$tmp/ub_4k_verity:/dir/pages.txt"
}
mk ub_4k_verity mk_verity
truncate -s 128M "$tmp/progs_4k_crc32c"
mk progs_4k_crc32c mkfs.btrfs -q -f -n 4096 --csum crc32c --rootdir "$src" "$tmp/progs_4k_crc32c"
truncate -s 128M "$tmp/progs_16k_blake2_single"
mk progs_16k_blake2_single mkfs.btrfs -q -f -n 16384 --csum blake2 -m single --rootdir "$src" "$tmp/progs_16k_blake2_single"
# The format of mkfs.btrfs before 3.12: no no-holes (explicit hole items),
# no skinny-metadata (old tree block extent items), no extended-iref, no
# free space tree (the writable open builds one).
truncate -s 128M "$tmp/progs_4k_old_format"
mk progs_4k_old_format mkfs.btrfs -q -f -n 4096 -O ^no-holes,^skinny-metadata,^extref -R ^free-space-tree \
  --rootdir "$src" "$tmp/progs_4k_old_format"

# The same images opened with every rescue fallback (fuzz_image.h kRescueAll).
for name in ub_4k_crc32c progs_4k_crc32c; do
  for t in open read; do
    python3 "$here/make_seed.py" "$tmp/$name" "$here/corpus/image_${t}_fuzz/${name}_rescue" --flags 4
  done
done

# Kernel-written: compressed extents (zstd, zlib, lzo), an inline compressed
# file, a deleted file, written through a loop mount.
if [[ $(id -u) == 0 ]] && truncate -s 128M "$tmp/kernel_compressed" &&
   mkfs.btrfs -q -f -n 4096 "$tmp/kernel_compressed" >/dev/null 2>&1 && mkdir -p "$tmp/mnt" &&
   mount -o loop,compress=zstd "$tmp/kernel_compressed" "$tmp/mnt" 2>/dev/null; then
  mnt=$tmp/mnt
  awk 'BEGIN { for (i = 0; i < 2000; i++) printf "zstd line %05d\n", i }' >"$mnt/zstd.txt"
  head -c 1500 "$mnt/zstd.txt" >"$mnt/inline-zstd"
  mkdir "$mnt/d"
  chattr +c "$mnt/d" 2>/dev/null || true
  setfattr -n btrfs.compression -v zlib "$mnt/d" 2>/dev/null || true
  awk 'BEGIN { for (i = 0; i < 1000; i++) printf "zlib line %05d\n", i }' >"$mnt/d/zlib.txt"
  setfattr -n btrfs.compression -v lzo "$mnt/d" 2>/dev/null || true
  awk 'BEGIN { for (i = 0; i < 1000; i++) printf "lzo line %05d\n", i }' >"$mnt/d/lzo.txt"
  printf 'gone\n' >"$mnt/deleted"
  sync
  rm "$mnt/deleted"
  umount "$mnt"
  mnt=""
  mk kernel_compressed true
else
  echo "kernel_compressed: skipped (needs root and a working loop mount)" >&2
fi
