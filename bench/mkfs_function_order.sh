#!/bin/bash
# Writes src/cli/mkfs_function_order.txt: the functions mkfs.ubtrfs runs,
# in the order it first runs them, for the link to place side by side
# (CMakeLists.txt, lld's --symbol-ordering-file).
#
# Why: image builders hold mkfs to mkfs.btrfs's peak memory, and a third of
# mkfs.ubtrfs's is its own code. The kernel maps file pages 64 KiB around
# each fault, and the 0.9 MB of functions a build runs lay spread over the
# 3.4 MB the program links, so nearly all of it was mapped: 3.3 MB. Side by
# side they map 1.7 MB (session 31).
#
# The list is a profile, not a contract: a function renamed since is left
# where the link puts it, so regenerate it when the import path changes
# much. Needs valgrind (callgrind records every function run, once).
#
# Usage: bench/mkfs_function_order.sh [BUILD_DIR]   (default: build)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
mkfs=$build/mkfs.ubtrfs
out=$here/src/cli/mkfs_function_order.txt
command -v valgrind >/dev/null || { echo "mkfs_function_order: needs valgrind" >&2; exit 1; }
[ -x "$mkfs" ] || { echo "mkfs_function_order: no $mkfs (build it first)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The trees of bench/image_build.sh, small: text for --compress, empty
# files, large incompressible files, and all together for --shrink; in an
# image small enough that each build adds chunks as the larger ones do.
mkdir "$work/trees"
python3 - "$work/trees" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(31)
vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10))) for _ in range(2000)]
for d in range(4):
    p = os.path.join(root, "text", f"d{d}")
    os.makedirs(p)
    for i in range(6):
        words = [rng.choice(vocab) for _ in range(rng.randint(200000, 600000))]
        with open(os.path.join(p, f"f{i}.txt"), "w") as f:
            f.write(" ".join(words))
for d in range(4):
    p = os.path.join(root, "empty", f"d{d}")
    os.makedirs(p)
    for i in range(3000):
        open(os.path.join(p, f"e{i}"), "w").close()
p = os.path.join(root, "large")
os.makedirs(p)
for i in range(2):
    with open(os.path.join(p, f"big{i}"), "wb") as f:
        f.write(os.urandom(24 << 20))
os.symlink("big0", os.path.join(p, "link"))
os.link(os.path.join(p, "big1"), os.path.join(p, "hard"))
PY

run() {  # name, mkfs arguments...
  local name=$1
  shift
  # UBTRFS_HUGE_PAGES=0: no restart with the huge-page heap, which valgrind
  # cannot follow.
  UBTRFS_HUGE_PAGES=0 valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/$name.cg" "$mkfs" -q --size "${UBTRFS_SIZE:-256M}" "$@" \
    "$work/$name.img" >/dev/null 2>"$work/$name.log" || { cat "$work/$name.log" >&2; exit 1; }
}
# The zstd build at bench/image_build.sh's image size: a 256M image took
# other paths at its end, whose functions then lay past the zstd block.
UBTRFS_SIZE=2G run zstd --compress zstd --rootdir "$work/trees/text"
run empty --rootdir "$work/trees/empty"
run large --rootdir "$work/trees/large"
run shrink --shrink --rootdir "$work/trees"

# Static helpers of the static archives linked in (zstd's, zlib's ...):
# those are built without a section per function, and lld places by name,
# so a static helper named in the list pulls every object that has a copy
# of it into the hot block whole (ZSTD_safecopyLiterals brought 220 KB of
# zstd's unused match finders). Their objects are placed by the global
# functions the list names anyway.
: > "$work/archive_locals"
for a in $(sed -n 's/^UBTRFS_STATIC_[a-z0-9]*:FILEPATH=//p' "$build/CMakeCache.txt"); do
  [ -f "$a" ] && nm "$a" 2>/dev/null | awk '$2 == "t" {print $3}' >> "$work/archive_locals"
done

python3 - "$out" "$work/archive_locals" "$work"/zstd.cg "$work"/empty.cg "$work"/large.cg "$work"/shrink.cg <<'PY'
import re, sys
order, seen = [], set(l.strip() for l in open(sys.argv[2]))
for path in sys.argv[3:]:
    names = {}
    for line in open(path, errors="replace"):
        m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if not m:
            continue
        if m.group(3):
            names[m.group(2)] = m.group(3)
        name = names.get(m.group(2), "")
        # Functions with a symbol of their own (not addresses of code
        # without one), each once, in the order first run.
        if m.group(1) == "fn" and name and not name.startswith("0x") and name not in seen:
            seen.add(name)
            order.append(name)
with open(sys.argv[1], "w") as f:
    f.write("# The functions mkfs.ubtrfs runs, in the order first run (bench/mkfs_function_order.sh).\n")
    f.write("\n".join(order) + "\n")
print(f"mkfs_function_order: {len(order)} functions -> {sys.argv[1]}")
PY
