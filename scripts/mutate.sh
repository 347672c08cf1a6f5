#!/usr/bin/env bash
# Mutation check (not part of ./test): breaks the code on purpose, one small
# bug at a time, and proves that a test named for the broken rule fails.
#
#   scripts/mutate.sh [-j JOBS] [--keep] [NAME ...]
#
# For each mutation (all, or those named): applies it (a sed expression that
# must change the file) in a scratch git worktree of HEAD under /tmp, builds
# the targets it needs (RelWithDebInfo, ninja -j JOBS), runs the gtest filters
# that cover it, records which tests failed (a test that crashed counts as
# failed), and restores the file. A mutation is CAUGHT when at least one
# failing test matches its `expect` pattern (the tests named for the rule);
# otherwise the script reports it as MISSED and exits 1.
#
# The worktree (/tmp/ubtrfs-mutate-<branch>) and its build directory are
# kept between runs, so later runs rebuild only what a mutation touches.
# Prints a Markdown table (the report in docs/RELIABILITY.md comes from it).
set -euo pipefail

JOBS=2
KEEP=0
ONLY=()
while [ $# -gt 0 ]; do
  case "$1" in
    -j) JOBS="$2"; shift 2 ;;
    -j*) JOBS="${1#-j}"; shift ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) ONLY+=("$1"); shift ;;
  esac
done

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
BRANCH=$(git -C "$ROOT" rev-parse --abbrev-ref HEAD | tr '/' '-')
WT=/tmp/ubtrfs-mutate-$BRANCH
LOGDIR=$WT/mutation-logs

if [ -d "$WT/.git" ] || [ -f "$WT/.git" ]; then
  git -C "$WT" checkout -q --detach "$(git -C "$ROOT" rev-parse HEAD)"
  git -C "$WT" reset -q --hard
else
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add -q --detach "$WT" HEAD
fi
mkdir -p "$LOGDIR"
cleanup() {
  git -C "$WT" checkout -q -- . 2>/dev/null || true
  if [ "$KEEP" = 0 ]; then :; fi
}
trap cleanup EXIT

export CCACHE_BASEDIR=$WT CCACHE_NOHASHDIR=1
[ -f "$WT/build/build.ninja" ] ||
  cmake -S "$WT" -B "$WT/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$LOGDIR/cmake.log"

# name @@ file @@ sed -E expression @@ targets @@ binary:filter[,binary:filter] @@ expect (ERE on test names) @@ rule
# (fields separated by " @@ "; sed expressions use # as their delimiter)
MUTATIONS=$(cat <<'EOF'
dir-index-batch-one-short @@ src/inode/delayed_index.cc @@ s#const bool full = !keys.empty\(\) && bytes \+ need > leaf_space_;#const bool full = !keys.empty() \&\& bytes + 2 * need > leaf_space_;#  @@ unit_tests @@ unit_tests:DelayedIndex* @@ ^DelayedIndexBatchSize\. @@ a batch is what an empty leaf holds (issue 25 table)
dir-index-batch-across-gap @@ src/inode/delayed_index.cc @@ s#const bool gap = !keys.empty\(\) && keys.back\(\).offset \+ 1 != index;#const bool gap = false \&\& index;# @@ unit_tests @@ unit_tests:DelayedIndex* @@ ^DelayedIndexBatchSize\.RunsOfSuccessors @@ a batch is a run of consecutive indexes
dir-index-cancel-kept @@ src/inode/delayed_index.cc @@ s#^  q.erase\(at\);#  (void)at;# @@ unit_tests @@ unit_tests:DelayedIndex* @@ ^DelayedIndexCancel\. @@ cancelled items never reach the tree
dir-index-freed-before-copy @@ src/inode/delayed_index.cc @@ s#^  UB_RETURN_IF_ERROR\(w->InsertBatch\(keys, data\)\);#  for (auto\& d : data) std::vector<uint8_t>().swap(d);\n  UB_RETURN_IF_ERROR(w->InsertBatch(keys, data));# @@ unit_tests @@ unit_tests:DelayedIndex* @@ ^DelayedIndexRelease\. @@ queued items are freed only after the batch is copied in and its path released
clone-bitmap-ignored @@ src/alloc/block_group.cc @@ s#pos = FindNext<View::kUnavailable>\(pos, end, false\);#pos = FindNext<View::kBitmap>(pos, end, false);#;s#const uint64_t taken = FindNext<View::kUnavailable>\(pos, pos \+ n, true\);#const uint64_t taken = FindNext<View::kBitmap>(pos, pos + n, true);# @@ unit_tests @@ unit_tests:BlockGroup* @@ ^BlockGroup\.CloneBitmap @@ the free-run search honours the clone bitmap (issue 25 table)
clone-bitmap-late-free-not-pinned @@ src/alloc/block_group.cc @@ s#^    clone_\[w\] \|= m;#    (void)w;# @@ unit_tests @@ unit_tests:BlockGroup* @@ ^BlockGroup\.CloneBitmapPinsSpaceAllocatedAfterTheCloneWasMade @@ space freed after the clone was made is pinned too
radix-reserve-too-few @@ src/inode/radix_tree.h @@ s#return std::max\(\{h, 2 \* h - 2, size_t\{kMaxHeight - 1\}\}\);#return std::max({h, h, size_t{kMaxHeight - 1}});# @@ unit_tests @@ unit_tests:RadixTree* @@ ^RadixTreeTest\.(WorstCaseShapesUseTheWholeReservation|StoreReservedNeverAllocates) @@ a reservation covers every node StoreReserved may need
node-lock-write-ignores-readers @@ src/tree/node_lock.cc @@ s#^  if \(\(s & kReaderMask\) == 0\) return;#  return;# @@ unit_tests @@ unit_tests:NodeLock* @@ ^NodeLock\.WriteWaitsForReadersToDrain @@ intent -> write waits for the readers to drain
rename-sets-mtime @@ src/fs/write_ops.cc @@ s#^  SetTime\(src_ii.ctime, now\);#  SetTime(src_ii.ctime, now);\n  SetTime(src_ii.mtime, now);# @@ ubtrfs suite_tests @@ suite_tests:TimestampRules.*:FusePosix.TimesUpdatedByEachCall:WriteModel.RandomOpsSeed1Node16K:Fuse.PosixOperationsMatchAHostDirectory @@ ^(TimestampRules\.|FusePosix\.TimesUpdatedByEachCall|WriteModel\.|Fuse\.PosixOperations) @@ rename changes the renamed inode's ctime, not its mtime (issue 25 table)
truncate-same-size-stamps @@ src/fs/write_ops.cc @@ s#const bool same_size = cur.size.get\(\) == \*change.size;#const bool same_size = cur.size.get() != cur.size.get();# @@ ubtrfs suite_tests @@ suite_tests:TimestampRules.*:FusePosix.TimesUpdatedByEachCall:WriteModel.RandomOpsSeed1Node16K @@ ^(TimestampRules\.|FusePosix\.TimesUpdatedByEachCall|WriteModel\.) @@ truncate(2) to the file's size changes no time
drop-hand-over-top-only @@ src/txn/drop_tree.cc @@ s#^  if \(b.is_leaf\(\)\) return Status::Ok\(\);#  return Status::Ok();# @@ ubtrfs suite_tests @@ suite_tests:SubvolumeDrop.* @@ ^SubvolumeDrop\.OwnedBlocksBelowASharedOne @@ a dropped tree's own blocks below a shared one all turn FULL_BACKREF
EOF
)

selected() {
  [ ${#ONLY[@]} -eq 0 ] && return 0
  local n
  for n in "${ONLY[@]}"; do [ "$n" = "$1" ] && return 0; done
  return 1
}

# Failing tests of one gtest run (crashed ones included), one per line.
failures_of() {
  local log=$1
  awk '/^\[ RUN      \] /{run=$4} /^\[       OK \] /{run=""} /^\[  SKIPPED \] /{run=""}
       /^\[  FAILED  \] .*(\(|, where)/{t=$4; sub(/,$/, "", t); print t; run=""}
       END{if (run != "") print run " (crashed)"}' "$log" | sort -u
}

REPORT=()
MISSED=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  fields=()
  rest=$line
  while [[ "$rest" == *" @@ "* ]]; do
    fields+=("${rest%% @@ *}")
    rest=${rest#* @@ }
  done
  fields+=("$rest")
  trim() { local v="$1"; v="${v#"${v%%[![:space:]]*}"}"; printf '%s' "${v%"${v##*[![:space:]]}"}"; }
  name=$(trim "${fields[0]}"); file=$(trim "${fields[1]}"); expr=$(trim "${fields[2]}"); targets=$(trim "${fields[3]}")
  filters=$(trim "${fields[4]}"); expect=$(trim "${fields[5]}"); rule=$(trim "${fields[6]}")
  selected "$name" || continue
  echo "== $name: $rule" >&2
  git -C "$WT" checkout -q -- .
  sed -E -i "$expr" "$WT/$file"
  if git -C "$WT" diff --quiet -- "$file"; then
    echo "   the mutation did not apply to $file" >&2
    REPORT+=("| \`$name\` | $rule | NOT APPLIED (the code moved: update the sed expression) | |")
    MISSED=1
    continue
  fi
  git -C "$WT" diff -- "$file" >"$LOGDIR/$name.diff"
  # shellcheck disable=SC2086
  if ! ninja -C "$WT/build" -j "$JOBS" $targets >"$LOGDIR/$name.build.log" 2>&1; then
    echo "   build failed (see $LOGDIR/$name.build.log)" >&2
    REPORT+=("| \`$name\` | $rule | BUILD FAILED | |")
    MISSED=1
    continue
  fi
  caught=""
  all=""
  start=$(date +%s)
  IFS=',' read -r -a runs <<<"$filters"
  for r in "${runs[@]}"; do
    bin=${r%%:*}
    filter=${r#*:}
    # A test that crashes takes the rest of the run with it: run again
    # without it until the filter's tests have all had their say.
    excluded=""
    for attempt in 1 2 3 4 5 6; do
      log="$LOGDIR/$name.$bin.$attempt.log"
      (cd "$WT/build" && timeout 1200 "./$bin" --gtest_filter="$filter${excluded:+-$excluded}" >"$log" 2>&1) || true
      crashed=""
      while IFS= read -r t; do
        [ -z "$t" ] && continue
        all+="${all:+, }$t"
        if printf '%s\n' "${t%% *}" | grep -Eq "$expect"; then caught+="${caught:+, }\`${t}\`"; fi
        case "$t" in *" (crashed)") crashed=${t%% *} ;; esac
      done < <(failures_of "$log")
      [ -z "$crashed" ] && break
      excluded+="${excluded:+:}$crashed"
    done
  done
  secs=$(( $(date +%s) - start ))
  if [ -n "$caught" ]; then
    verdict="caught by $caught"
    others=""
    for t in ${all//, / }; do
      case "$caught" in *"$t"*) ;; *) others+="${others:+, }$t" ;; esac
    done
    [ -n "$others" ] && verdict+=" (also failing: $others)"
  else
    verdict="MISSED${all:+ (failing, but not named for the rule: $all)}"
    MISSED=1
  fi
  echo "   $verdict (${secs} s)" >&2
  REPORT+=("| \`$name\` | $rule | $verdict | ${secs} s |")
  git -C "$WT" checkout -q -- "$file"
done <<<"$MUTATIONS"

# Leave the scratch build at HEAD again (the next run starts from it).
git -C "$WT" checkout -q -- .
echo
echo "Mutation check of $(git -C "$ROOT" rev-parse --short HEAD) ($(date -u +%Y-%m-%d)):"
echo
echo "| mutation | rule it breaks | result | tests run for |"
echo "|---|---|---|---|"
printf '%s\n' "${REPORT[@]}"
exit $MISSED
