#include "tree/cursor.h"

namespace ubtrfs::tree {

void Cursor::Hold(int level, BlockRef b) {
  if (locked_[level]) {
    nodes_[level]->lock.UnlockShared();
    locked_[level] = false;
  }
  if (b != nullptr && reader_->NeedsLock(*b)) {
    b->lock.LockShared();
    locked_[level] = true;
  }
  nodes_[level] = std::move(b);
}

void Cursor::ReleaseAll() {
  // Leaf first: a block is let go of only while its parent is still held.
  for (int l = 0; l < format::kMaxLevel; ++l) Hold(l, nullptr);
}

Status Cursor::LoadRoot() {
  valid_ = false;
  ReleaseAll();
  NodeLock* live_lock = nullptr;
  if (root_.live != nullptr) {
    // The root may move (copy on write, growth, shrink) while we look: hold
    // the root pointer's lock until the root block itself is held.
    if (reader_->Locking()) {
      live_lock = root_.live->lock;
      live_lock->LockShared();
    }
    const RootPtr& cur = *root_.live->ptr;
    root_.bytenr = cur.bytenr;
    root_.level = cur.level;
    root_.generation = cur.generation;
  }
  Status st = Status::Ok();
  if (root_.level < 0 || root_.level >= format::kMaxLevel) {
    st = Status::Corrupt("tree " + std::to_string(root_.id) + ": root level " + std::to_string(root_.level));
  } else {
    auto b = reader_->Read(BlockCheck{root_.bytenr, root_.level, root_.generation, {}});
    if (b.ok()) {
      Hold(root_.level, std::move(*b));
    } else {
      st = b.status();
    }
  }
  if (live_lock != nullptr) live_lock->UnlockShared();
  return st;
}

Status Cursor::LoadChild(int level) {
  const TreeBlock& n = *nodes_[level];
  const int s = slot_[level];
  UB_ASSIGN_OR_RETURN(BlockRef child,
                      reader_->Read(BlockCheck{n.child_bytenr(s), level - 1, n.child_generation(s), n.key(s)}));
  Hold(level - 1, std::move(child));
  return Status::Ok();
}

bool Cursor::Skip(int level, const Status& why) {
  if (skipped_ == nullptr) return false;
  const TreeBlock& n = *nodes_[level];
  const int s = slot_[level];
  skipped_->push_back(Skipped{n.key(s), s + 1 < n.nritems() ? n.key(s + 1) : Key::Max(), why});
  return true;
}

// Steps from the position at `level` (slot_[level] and the path above it)
// to the next (forward) or previous item. Blocks with no items are stepped
// over: a tree has them only for a moment, while a concurrent writer fills a
// new leaf of a split or removes an emptied block, and a reader may see them.
Status Cursor::Step(int level, bool forward) {
  for (int l = level;;) {
    if (forward) {
      while (l <= root_.level && slot_[l] + 1 >= nodes_[l]->nritems()) ++l;
    } else {
      while (l <= root_.level && slot_[l] <= 0) ++l;
    }
    if (l > root_.level) {
      valid_ = false;
      return Status::Ok();
    }
    slot_[l] += forward ? 1 : -1;
    // Let go of the old blocks below first: the path held is always one chain
    // from the root, so a reader only ever waits for a child of what it holds.
    for (int m = 0; m < l; ++m) Hold(m, nullptr);
    int m = l;
    for (; m > 0; --m) {
      Status st = LoadChild(m);
      if (!st.ok()) {
        if (Skip(m, st)) break;
        valid_ = false;
        return st;
      }
      const int n = nodes_[m - 1]->nritems();
      if (n == 0) break;
      slot_[m - 1] = forward ? 0 : n - 1;
    }
    if (m == 0) {
      valid_ = true;
      return Status::Ok();
    }
    l = m;  // an empty (or skipped) block at m - 1: go on from its parent
  }
}

Status Cursor::Seek(const Key& k) {
  UB_RETURN_IF_ERROR(LoadRoot());
  for (int l = root_.level; l >= 0; --l) {
    const TreeBlock& b = *nodes_[l];
    if (b.nritems() == 0) {
      slot_[l] = -1;  // nothing here: the first item after it
      return Step(l, true);
    }
    if (l == 0) {
      int s = b.FirstSlotAtOrAfter(k);
      if (s < b.nritems()) {
        slot_[0] = s;
        valid_ = true;
        return Status::Ok();
      }
      slot_[0] = b.nritems() - 1;
      return Step(0, true);
    }
    int s = b.LastSlotAtOrBefore(k);
    slot_[l] = s < 0 ? 0 : s;
    if (Status st = LoadChild(l); !st.ok()) {
      if (!Skip(l, st)) return st;
      return Step(l, true);  // the next subtree's keys are all above k
    }
  }
  return Status::Ok();
}

Status Cursor::SeekAtOrBefore(const Key& k) {
  UB_RETURN_IF_ERROR(LoadRoot());
  for (int l = root_.level; l >= 0; --l) {
    const TreeBlock& b = *nodes_[l];
    if (b.nritems() == 0) {
      slot_[l] = 0;  // nothing here: the last item before it
      return Step(l, false);
    }
    int s = b.LastSlotAtOrBefore(k);
    if (s < 0) {
      if (l == root_.level) {
        valid_ = false;  // every key in the tree is above k
        return Status::Ok();
      }
      slot_[l] = 0;
      return Step(l, false);
    }
    slot_[l] = s;
    if (l == 0) {
      valid_ = true;
      return Status::Ok();
    }
    if (Status st = LoadChild(l); !st.ok()) {
      if (!Skip(l, st)) return st;
      return Step(l, false);
    }
  }
  return Status::Ok();
}

Status Cursor::Next() {
  if (!valid_) return Status::Ok();
  return Step(0, true);
}

Status Cursor::Prev() {
  if (!valid_) return Status::Ok();
  return Step(0, false);
}

Result<std::optional<std::vector<uint8_t>>> LookupItem(BlockSource* reader, const RootPtr& root, const Key& k) {
  Cursor c(reader, root);
  UB_RETURN_IF_ERROR(c.Seek(k));
  if (!c.Valid() || c.key() != k) return std::optional<std::vector<uint8_t>>();
  auto d = c.data();
  return std::optional<std::vector<uint8_t>>(std::vector<uint8_t>(d.begin(), d.end()));
}

}  // namespace ubtrfs::tree
