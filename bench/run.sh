#!/usr/bin/env bash
# One command for every benchmark table in docs/BENCHMARKS.md: installs what
# is missing (scripts/deps.sh: fsmark, dbench, btrfs-progs, gnuplot, ...),
# builds ubtrfs, lib_bench and the do-nothing FUSE file system (bench/nullfs.c)
# in build-bench/ (RelWithDebInfo), then runs bench/run.py, which writes
# docs/bench/*.json, *.png and summary.md (--quick: build-bench/bench-quick/).
#   bench/run.sh [--quick] [--reps N] [--threads T] [create|mkfs|delete|dbench ...]
# Run as root for the kernel rows (loop mounts, tmpfs); they are skipped otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${UBTRFS_BENCH_BUILD:-$here/build-bench}"
"$here/scripts/deps.sh"
cmake -B "$build" -S "$here" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
nice ninja -C "$build" -j2 ubtrfs mkfs.ubtrfs lib_bench >/dev/null
# nullfs needs libfuse3 and not libubtrfs, so it is not one of the bench/*.cc targets.
cc -O2 -Wall -Wextra -o "$build/nullfs" "$here/bench/nullfs.c" $(pkg-config --cflags --libs fuse3) -lpthread
exec python3 "$here/bench/run.py" --build "$build" "$@"
