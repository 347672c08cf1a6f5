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

Status Cursor::Descend(int level, bool leftmost) {
  // Let go of the old blocks below first: the path held is always one chain
  // from the root, so a reader only ever waits for a child of what it holds.
  for (int l = 0; l < level; ++l) Hold(l, nullptr);
  for (int l = level; l > 0; --l) {
    UB_RETURN_IF_ERROR(LoadChild(l));
    slot_[l - 1] = leftmost ? 0 : nodes_[l - 1]->nritems() - 1;
  }
  return Status::Ok();
}

Status Cursor::Seek(const Key& k) {
  UB_RETURN_IF_ERROR(LoadRoot());
  for (int l = root_.level; l > 0; --l) {
    int s = nodes_[l]->LastSlotAtOrBefore(k);
    slot_[l] = s < 0 ? 0 : s;
    UB_RETURN_IF_ERROR(LoadChild(l));
  }
  const TreeBlock& lf = *nodes_[0];
  int s = lf.FirstSlotAtOrAfter(k);
  if (s < lf.nritems()) {
    slot_[0] = s;
    valid_ = true;
    return Status::Ok();
  }
  if (lf.nritems() == 0) return Status::Ok();  // empty tree
  slot_[0] = lf.nritems() - 1;
  valid_ = true;
  return Next();
}

Status Cursor::SeekAtOrBefore(const Key& k) {
  UB_RETURN_IF_ERROR(LoadRoot());
  for (int l = root_.level; l > 0; --l) {
    int s = nodes_[l]->LastSlotAtOrBefore(k);
    if (s < 0) {
      valid_ = false;  // every key in the tree is above k
      return Status::Ok();
    }
    slot_[l] = s;
    UB_RETURN_IF_ERROR(LoadChild(l));
  }
  int s = nodes_[0]->LastSlotAtOrBefore(k);
  if (s < 0) return Status::Ok();  // only possible in a root leaf
  slot_[0] = s;
  valid_ = true;
  return Status::Ok();
}

Status Cursor::Next() {
  if (!valid_) return Status::Ok();
  if (slot_[0] + 1 < nodes_[0]->nritems()) {
    ++slot_[0];
    return Status::Ok();
  }
  for (int l = 1; l <= root_.level; ++l) {
    if (slot_[l] + 1 < nodes_[l]->nritems()) {
      ++slot_[l];
      Status st = Descend(l, true);
      if (!st.ok()) valid_ = false;
      return st;
    }
  }
  valid_ = false;
  return Status::Ok();
}

Status Cursor::Prev() {
  if (!valid_) return Status::Ok();
  if (slot_[0] > 0) {
    --slot_[0];
    return Status::Ok();
  }
  for (int l = 1; l <= root_.level; ++l) {
    if (slot_[l] > 0) {
      --slot_[l];
      Status st = Descend(l, false);
      if (!st.ok()) valid_ = false;
      return st;
    }
  }
  valid_ = false;
  return Status::Ok();
}

Result<std::optional<std::vector<uint8_t>>> LookupItem(BlockSource* reader, const RootPtr& root, const Key& k) {
  Cursor c(reader, root);
  UB_RETURN_IF_ERROR(c.Seek(k));
  if (!c.Valid() || c.key() != k) return std::optional<std::vector<uint8_t>>();
  auto d = c.data();
  return std::optional<std::vector<uint8_t>>(std::vector<uint8_t>(d.begin(), d.end()));
}

}  // namespace ubtrfs::tree
