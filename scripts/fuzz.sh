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
# reopened). With 20 s per target (./test) the eight take about 3.5 minutes.
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

failed=()
for t in "${targets[@]}"; do
  bin=$build/$t
  work=$build/corpus/$t
  art=$build/artifacts/$t
  mkdir -p "$work" "$art"
  seeds=()
  [[ -d $src/tests/fuzz/corpus/$t ]] && seeds=("$src/tests/fuzz/corpus/$t")
  echo "== $t: ${secs}s"
  log=$build/$t.log
  par=()
  # -jobs runs workers in the background with logs in fuzz-N.log (in $build).
  [[ $jobs -gt 1 ]] && par=(-jobs="$jobs" -workers="$jobs")
  # shellcheck disable=SC2086
  if (cd "$build" && "$bin" "$work" "${seeds[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$art/" "${par[@]}" ${FUZZ_ARGS:-}) >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|DONE" "$log" | tr '\n' ' ' | sed 's/$/\n/' || true
  else
    echo "!! $t FAILED (log: $log; artifacts: $art)" >&2
    tail -n 40 "$log" >&2
    failed+=("$t")
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzzing found problems in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzzing: no crashes in ${targets[*]} (${secs}s each)"
