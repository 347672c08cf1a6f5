#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cc) with clang, ASan and
# UBSan, then runs each for a while. Exits non-zero if any target crashes,
# leaks, hits UB or times out; the reproducer is left in the artifact dir.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#     SECONDS  run time per target (default 30; -max_total_time)
#     TARGET   e.g. tree_block_fuzz (default: every tests/fuzz/*_fuzz.cc)
#
# Environment:
#   UBTRFS_FUZZ_BUILD  build directory (default: build-fuzz in the source tree)
#   FUZZ_JOBS          parallel fuzzing workers per target (default 1)
#   FUZZ_PARALLEL      targets run at once (default: cores / FUZZ_JOBS)
#   FUZZ_ARGS          extra libFuzzer flags (e.g. "-max_len=20000")
#
# Targets: superblock_fuzz, tree_block_fuzz (single structures) and
# image_open_fuzz, image_read_fuzz, image_write_fuzz (whole images in the
# encoding of tests/fuzz/fuzz_image.h; tests/fuzz/make_corpus.sh rebuilds their
# seeds), dir_entry_fuzz (edits of one image's directory items, then readdir
# and a copy out into a scratch sandbox), send_stream_fuzz (the send-stream
# reader and the receive --dump formatter over arbitrary bytes),
# aborted_read_fuzz (changes on a fault-injecting device until a commit
# fails, then every read path over the aborted view, then the image
# reopened). With 20 s per target (./test) the eight take about 1.5 minutes on two cores.
#
# The seed corpora in tests/fuzz/corpus/<target>/ are only read; new inputs go
# to $UBTRFS_FUZZ_BUILD/corpus/<target>/ and crashes to
# $UBTRFS_FUZZ_BUILD/artifacts/<target>/. Reproduce one with
#   $UBTRFS_FUZZ_BUILD/<target> <artifact file>
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-30}
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ $secs =~ ^[0-9]+$ ]]; then
  echo "usage: $0 [SECONDS] [TARGET...]" >&2
  exit 2
fi
build=${UBTRFS_FUZZ_BUILD:-$src/build-fuzz}
jobs=${FUZZ_JOBS:-1}

if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  targets=()
  for f in "$src"/tests/fuzz/*_fuzz.cc; do
    [[ -e $f ]] && targets+=("$(basename "$f" .cc)")
  done
fi
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "no fuzz targets in $src/tests/fuzz" >&2
  exit 2
fi

command -v clang >/dev/null && command -v clang++ >/dev/null || { echo "clang/clang++ not found" >&2; exit 2; }
generator=()
command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]] && generator=(-G Ninja)

# The library must be instrumented for coverage too (fuzzer-no-link), not just
# the fuzz targets; UB must abort so libFuzzer reports it.
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S "$src" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBTRFS_FUZZ=ON \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" >/dev/null
cmake --build "$build" --target "${targets[@]}" -- -j"$(nproc)"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# The targets run side by side, one per core (each is one process; with
# FUZZ_JOBS > 1 each is several): eight 20 s targets take 80 s, not 160.
par_targets=${FUZZ_PARALLEL:-$(( $(nproc) / jobs > 0 ? $(nproc) / jobs : 1 ))}

run_target() {
  local t=$1 bin=$build/$1 work=$build/corpus/$1 art=$build/artifacts/$1 log=$build/$1.log
  mkdir -p "$work" "$art"
  local seeds=() par=()
  [[ -d $src/tests/fuzz/corpus/$t ]] && seeds=("$src/tests/fuzz/corpus/$t")
  # -jobs runs workers in the background with logs in fuzz-N.log (in $build).
  [[ $jobs -gt 1 ]] && par=(-jobs="$jobs" -workers="$jobs")
  # shellcheck disable=SC2086
  (cd "$build" && "$bin" "$work" "${seeds[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
     -print_final_stats=1 -artifact_prefix="$art/" "${par[@]}" ${FUZZ_ARGS:-}) >"$log" 2>&1
}

report() {
  local t=$1 rc=$2 log=$build/$1.log
  if [[ $rc -eq 0 ]]; then
    echo "== $t: ${secs}s $(grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|DONE" "$log" | tr '\n' ' ')"
  else
    echo "!! $t FAILED (log: $log; artifacts: $build/artifacts/$t)" >&2
    tail -n 40 "$log" >&2
    failed+=("$t")
  fi
}

failed=()
declare -A running=()  # pid -> target
for t in "${targets[@]}"; do
  while [[ ${#running[@]} -ge $par_targets ]]; do
    rc=0
    wait -n -p done_pid "${!running[@]}" || rc=$?
    report "${running[$done_pid]}" "$rc"
    unset "running[$done_pid]"
  done
  run_target "$t" &
  running[$!]=$t
done
while [[ ${#running[@]} -gt 0 ]]; do
  rc=0
  wait -n -p done_pid "${!running[@]}" || rc=$?
  report "${running[$done_pid]}" "$rc"
  unset "running[$done_pid]"
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzzing found problems in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzzing: no crashes in ${targets[*]} (${secs}s each)"
