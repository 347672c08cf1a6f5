#!/usr/bin/env bash
# Runs ubtrfs over the images btrfs-progs keeps in its test suite (fuzzed
# images from bug reports, the damage of fsck-tests, misc-tests' odd states):
# every command must end with a clear error or success, never a crash, a
# hang or a sanitizer report; and `ubtrfs check` is compared with
# `btrfs check --readonly` image by image.
#
#   scripts/progs_images.sh [--ubtrfs BIN] [--btrfs BIN] [--progs DIR] [--work DIR] [IMAGE...]
#
# --progs is a btrfs-progs checkout (default: a shallow clone of
# github.com/kdave/btrfs-progs into the work directory); --ubtrfs defaults
# to build-asan/ubtrfs (./test's sanitizer build), --btrfs to the btrfs on
# PATH (a newer one finds more: its checks are the ones compared). Images
# are unpacked with xz and btrfs-image -r. Nothing here is committed or
# copied: the images stay in the work directory (default /tmp/ubtrfs-progs-images).
#
# Output: one line per image, "NAME ubtrfs=RC btrfs=RC find=read|refused
# rescue=read|refused" (the last two: whether `ubtrfs find` lists the files,
# plainly and with --rescue all), then the disagreements and the crashes;
# exit 1 if anything crashed or hung.
# Known, deliberate disagreements (docs/RELIABILITY.md): FREE_SPACE_INFO
# items of block groups that no longer exist, and the old free inode number
# cache, are warnings here and errors for btrfs check 6.19.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
ubtrfs="$here/build-asan/ubtrfs"
btrfs=btrfs
progs=""
work=/tmp/ubtrfs-progs-images
while [ $# -gt 0 ]; do
  case "$1" in
    --ubtrfs) ubtrfs=$2; shift 2 ;;
    --btrfs) btrfs=$2; shift 2 ;;
    --progs) progs=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    --*) echo "progs_images: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ -x "$ubtrfs" ] || { echo "progs_images: no ubtrfs at $ubtrfs (build it, or give --ubtrfs)" >&2; exit 2; }
command -v btrfs-image >/dev/null || { echo "progs_images: btrfs-image (btrfs-progs) is needed" >&2; exit 2; }
mkdir -p "$work/imgs" "$work/logs"
if [ -z "$progs" ]; then
  progs="$work/btrfs-progs"
  [ -d "$progs/tests" ] || git clone -q --depth 1 https://github.com/kdave/btrfs-progs "$progs" ||
    { echo "progs_images: cannot clone btrfs-progs (give --progs DIR)" >&2; exit 2; }
fi

# Unpack: NAME.raw per image, named after its path in the test suite.
if [ $# -eq 0 ]; then
  (cd "$progs/tests" && find fuzz-tests fsck-tests misc-tests -type f \
     \( -name '*.img' -o -name '*.img.xz' -o -name '*.raw' -o -name '*.raw.xz' \) | sort) |
  while read -r f; do
    name=$(echo "$f" | tr '/' '_'); name=${name%.xz}; name=${name%.img}; name=${name%.raw}
    dst="$work/imgs/$name.raw"
    [ -s "$dst" ] && continue
    src="$progs/tests/$f"
    case "$f" in
      *.raw.xz) xz -dc "$src" > "$dst" ;;
      *.raw) cp "$src" "$dst" ;;
      *.img.xz) xz -dc "$src" > "$work/dump" && btrfs-image -r "$work/dump" "$dst" >/dev/null 2>&1 || rm -f "$dst" ;;
      *.img) btrfs-image -r "$src" "$dst" >/dev/null 2>&1 || rm -f "$dst" ;;
    esac
  done
  set -- "$work"/imgs/*.raw
fi

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
bad=0
summary="$work/summary"
: > "$summary"
for img in "$@"; do
  n=$(basename "$img" .raw)
  w="$work/work.img"
  log="$work/logs/$n.log"
  : > "$log"
  cp --sparse=always "$img" "$w"
  crashed=""
  step() {
    local name=$1; shift
    echo "== $name: $*" >> "$log"
    timeout 120 "$@" >> "$log" 2>&1
    local rc=$?
    echo "rc=$rc" >> "$log"
    if [ $rc -ge 124 ] || grep -q 'AddressSanitizer\|LeakSanitizer\|runtime error\|terminate called' "$log"; then
      crashed="$crashed $name(rc=$rc)"
    fi
    return $rc
  }
  step check "$ubtrfs" check "$w"; ours=$?
  theirs=$(timeout 120 "$btrfs" check --readonly "$img" > "$log.btrfs" 2>&1; echo $?)
  step info "$ubtrfs" info "$w"
  read=read
  step find "$ubtrfs" find "$w:/" || read=refused
  rm -rf "$work/out"
  step cp-out "$ubtrfs" cp "$w:/" "$work/out"
  # Every rescue fallback at once (the kernel's rescue=all), read-only.
  rescued=refused
  step rescue-find "$ubtrfs" find --rescue all "$w:/" && rescued=read
  rm -rf "$work/out"
  step rescue-cp-out "$ubtrfs" cp --rescue all "$w:/" "$work/out"
  step dump "$ubtrfs" dump-tree "$w"
  # What looks below the files: every superblock copy, older roots (and a
  # read of the oldest), which files hold the first data extents.
  step dump-super "$ubtrfs" inspect dump-super -f -a "$w"
  step find-root "$ubtrfs" inspect find-root "$w"
  oldest=$(grep -o 'root at [0-9]*' "$log" | tail -1 | awk '{print $3}')
  [ -n "$oldest" ] && step older-find "$ubtrfs" find --tree-root "$oldest" "$w:/"
  for a in $("$ubtrfs" dump-tree -t fs "$w" 2>/dev/null | grep -o 'disk byte [0-9]*' | awk '$3 > 0 {print $3}' | head -3); do
    step resolve "$ubtrfs" inspect logical-resolve "$w" "$a"
  done
  step mkdir "$ubtrfs" mkdir "$w:/ubtrfs-new"
  step put sh -c "head -c 300000 /dev/urandom | '$ubtrfs' put '$w:/ubtrfs-new/f'"
  step rm "$ubtrfs" rm -r "$w:/ubtrfs-new"
  step balance "$ubtrfs" balance -dusage=100 -musage=100 "$w"
  step scrub "$ubtrfs" scrub "$w"
  step check-after "$ubtrfs" check "$w"
  echo "$n ubtrfs=$ours btrfs=$theirs find=$read rescue=$rescued${crashed:+ CRASHED:$crashed}" | tee -a "$summary"
  [ -n "$crashed" ] && bad=1
done
rm -f "$work/work.img" "$work/dump"
rm -rf "$work/out"
echo
echo "ubtrfs check exit vs btrfs check exit (0 clean, 1 errors, 8 could not check):"
awk '{print $2, $3}' "$summary" | sort | uniq -c
echo "disagreements (logs in $work/logs):"
awk '($2 == "ubtrfs=0" && $3 != "btrfs=0") || ($2 != "ubtrfs=0" && $3 == "btrfs=0")' "$summary"
echo "listing the files (find) without and with --rescue all:"
awk '{print $4, $5}' "$summary" | sort | uniq -c
grep CRASHED "$summary" || echo "no crashes, hangs or sanitizer reports"
exit $bad
