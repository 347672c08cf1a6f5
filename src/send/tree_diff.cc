#include "send/tree_diff.h"

#include <algorithm>
#include <vector>

namespace ubtrfs::send {

namespace {

using format::Key;

// A position in one tree: the path of (block, slot) from the root. The
// current element is the slot of the deepest block: an item in a leaf, or a
// child pointer in a node, which the caller either descends into or skips.
class Walker {
 public:
  Walker(tree::BlockSource* source, DiffStats* stats) : source_(source), stats_(stats) {}

  Status Start(const tree::RootPtr& root) {
    if (root.bytenr == 0) return Status::Ok();
    tree::BlockCheck check;
    check.bytenr = root.bytenr;
    check.level = root.level;
    check.generation = root.generation;
    UB_ASSIGN_OR_RETURN(tree::BlockRef b, source_->Read(check));
    ++stats_->blocks_read;
    path_.push_back(Frame{std::move(b), 0});
    Normalize();
    return Status::Ok();
  }

  bool done() const { return path_.empty(); }
  const tree::TreeBlock& block() const { return *path_.back().block; }
  int slot() const { return path_.back().slot; }
  bool is_item() const { return block().is_leaf(); }
  Key key() const { return block().key(slot()); }
  std::span<const uint8_t> data() const { return block().item_data(slot()); }
  uint64_t child_bytenr() const { return block().child_bytenr(slot()); }
  uint64_t child_generation() const { return block().child_generation(slot()); }
  int child_level() const { return block().level() - 1; }

  // Steps into the child the current pointer names.
  Status Descend() {
    tree::BlockCheck check;
    check.bytenr = child_bytenr();
    check.level = child_level();
    check.generation = child_generation();
    check.first_key = key();
    UB_ASSIGN_OR_RETURN(tree::BlockRef b, source_->Read(check));
    ++stats_->blocks_read;
    path_.push_back(Frame{std::move(b), 0});
    Normalize();
    return Status::Ok();
  }

  // Past the current item or the whole subtree of the current pointer.
  void Advance() {
    ++path_.back().slot;
    Normalize();
  }

 private:
  struct Frame {
    tree::BlockRef block;
    int slot = 0;
  };
  void Normalize() {
    while (!path_.empty() && path_.back().slot >= path_.back().block->nritems()) {
      path_.pop_back();
      if (!path_.empty()) ++path_.back().slot;
    }
  }

  tree::BlockSource* source_;
  DiffStats* stats_;
  std::vector<Frame> path_;
};

}  // namespace

Status CompareTrees(tree::BlockSource* source, const tree::RootPtr& old_root, const tree::RootPtr& new_root,
                    const DiffFn& fn, DiffStats* stats) {
  DiffStats local;
  DiffStats* st = stats ? stats : &local;
  if (old_root.bytenr != 0 && old_root.bytenr == new_root.bytenr && old_root.generation == new_root.generation) {
    ++st->shared_skipped;
    return Status::Ok();
  }
  Walker l(source, st), r(source, st);
  UB_RETURN_IF_ERROR(l.Start(old_root));
  UB_RETURN_IF_ERROR(r.Start(new_root));
  const std::span<const uint8_t> none;
  while (!l.done() || !r.done()) {
    if (l.done()) {
      if (!r.is_item()) {
        UB_RETURN_IF_ERROR(r.Descend());
        continue;
      }
      UB_RETURN_IF_ERROR(fn(DiffKind::kNew, r.key(), none, r.data()));
      r.Advance();
      continue;
    }
    if (r.done()) {
      if (!l.is_item()) {
        UB_RETURN_IF_ERROR(l.Descend());
        continue;
      }
      UB_RETURN_IF_ERROR(fn(DiffKind::kDeleted, l.key(), l.data(), none));
      l.Advance();
      continue;
    }
    const Key lk = l.key(), rk = r.key();
    const bool lp = !l.is_item(), rp = !r.is_item();
    if (lp && rp) {
      if (l.child_bytenr() == r.child_bytenr() && l.child_generation() == r.child_generation() && lk == rk) {
        // The same block in both trees: everything below it is shared.
        ++st->shared_skipped;
        l.Advance();
        r.Advance();
        continue;
      }
      // Into the subtree that starts first; on a tie the taller one, or both.
      if (lk < rk || (lk == rk && l.child_level() > r.child_level())) {
        UB_RETURN_IF_ERROR(l.Descend());
      } else if (rk < lk || r.child_level() > l.child_level()) {
        UB_RETURN_IF_ERROR(r.Descend());
      } else {
        UB_RETURN_IF_ERROR(l.Descend());
        UB_RETURN_IF_ERROR(r.Descend());
      }
      continue;
    }
    if (lp) {
      // Items of the old subtree may precede the new item: look inside.
      if (lk <= rk) {
        UB_RETURN_IF_ERROR(l.Descend());
      } else {
        UB_RETURN_IF_ERROR(fn(DiffKind::kNew, rk, none, r.data()));
        r.Advance();
      }
      continue;
    }
    if (rp) {
      if (rk <= lk) {
        UB_RETURN_IF_ERROR(r.Descend());
      } else {
        UB_RETURN_IF_ERROR(fn(DiffKind::kDeleted, lk, l.data(), none));
        l.Advance();
      }
      continue;
    }
    if (lk < rk) {
      UB_RETURN_IF_ERROR(fn(DiffKind::kDeleted, lk, l.data(), none));
      l.Advance();
    } else if (rk < lk) {
      UB_RETURN_IF_ERROR(fn(DiffKind::kNew, rk, none, r.data()));
      r.Advance();
    } else {
      ++st->items_compared;
      const auto a = l.data(), b = r.data();
      if (a.size() != b.size() || !std::equal(a.begin(), a.end(), b.begin())) {
        UB_RETURN_IF_ERROR(fn(DiffKind::kChanged, lk, a, b));
      }
      l.Advance();
      r.Advance();
    }
  }
  return Status::Ok();
}

}  // namespace ubtrfs::send
