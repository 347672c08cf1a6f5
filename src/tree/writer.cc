#include "tree/writer.h"

#include "stats/stats.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace ubtrfs::tree {

using namespace ubtrfs::format;

namespace {
constexpr uint32_t kItemHeader = sizeof(Item);

// A process-wide counter fed from a per-thread tally, 256 at a time (and the
// rest when the thread ends), so that threads changing one tree do not write
// one shared cache line on every search.
struct Tally {
  stats::Counter& counter;
  uint64_t n = 0;
  ~Tally() {
    if (n) counter.Add(n);
  }
  void Add() {
    if (++n == 256) {
      counter.Add(n);
      n = 0;
    }
  }
};
Tally& LeafOnlySearches() {
  thread_local Tally t{stats::GetCounter("tree.search.leaf_only")};
  return t;
}
Tally& FullPathSearches() {
  thread_local Tally t{stats::GetCounter("tree.search.full_path")};
  return t;
}
Tally& CopyLeafSearches() {  // the parent in intent, the leaf copied (TryCopyLeaf)
  thread_local Tally t{stats::GetCounter("tree.search.copy_leaf")};
  return t;
}
}  // namespace

// ---- Leaf surgery --------------------------------------------------------------

uint32_t LeafUsed(const TreeBlock& leaf) { return leaf.LeafSpace() - leaf.LeafFreeSpace(); }

std::vector<LeafItem> ExtractItems(const TreeBlock& leaf, int from, int to) {
  std::vector<LeafItem> out;
  out.reserve(to - from);
  for (int i = from; i < to; ++i) {
    auto d = leaf.item_data(i);
    out.push_back(LeafItem{leaf.key(i), std::vector<uint8_t>(d.begin(), d.end())});
  }
  return out;
}

// A copy of a block's bytes to read items from while the block itself is
// rewritten: one of a few per-thread buffers reused from call to call, so a
// split or push costs a copy and not an allocation (fresh 16 KiB blocks
// fault their pages in) and a free.
thread_local std::array<std::shared_ptr<TreeBlock>, 3> snapshot_scratch;

const TreeBlock& Snapshot(int which, const TreeBlock& b) {
  auto& s = snapshot_scratch[static_cast<size_t>(which)];
  if (s == nullptr || s->bytes().size() != b.bytes().size()) s = TreeBlock::NewBlank(static_cast<uint32_t>(b.bytes().size()));
  std::memcpy(s->mutable_bytes(), b.bytes().data(), b.bytes().size());
  return *s;
}

void DropThreadScratch() {
  for (auto& s : snapshot_scratch) s.reset();
}

// A per-thread item list for splits, pushes and merges, emptied and reused
// from call to call like the snapshots above (a fresh vector of a leaf's
// ~200 items faulted its pages in too).
static std::vector<ItemRef>& ItemScratch(int which) {
  thread_local std::array<std::vector<ItemRef>, 2> scratch;
  auto& v = scratch[static_cast<size_t>(which)];
  v.clear();
  return v;
}

void RefItems(const TreeBlock& leaf, int from, int to, std::vector<ItemRef>* out) {
  out->reserve(out->size() + (to - from));
  for (int i = from; i < to; ++i) {
    auto d = leaf.item_data(i);
    out->push_back(ItemRef{leaf.key(i), d.data(), static_cast<uint32_t>(d.size())});
  }
}

void WriteLeafRefs(TreeBlock& leaf, std::span<const ItemRef> items) {
  uint8_t* body = leaf.mutable_bytes() + sizeof(Header);
  const uint32_t space = leaf.LeafSpace();
  uint32_t end = space;
  for (size_t i = 0; i < items.size(); ++i) {
    Item* it = reinterpret_cast<Item*>(body) + i;
    items[i].key.To(&it->key);
    end -= items[i].size;
    it->offset = end;
    it->size = items[i].size;
    if (items[i].size) std::memcpy(body + end, items[i].data, items[i].size);
  }
  // Zero the gap between the item headers and the data.
  const size_t headers = items.size() * sizeof(Item);
  std::memset(body + headers, 0, end - headers);
  leaf.set_nritems(static_cast<int>(items.size()));
}

void WriteLeafItems(TreeBlock& leaf, std::span<const LeafItem> items) {
  std::vector<ItemRef> refs;
  refs.reserve(items.size());
  for (const auto& it : items) refs.push_back(ItemRef{it.key, it.data.data(), static_cast<uint32_t>(it.data.size())});
  WriteLeafRefs(leaf, refs);
}

uint32_t TreeWriter::MaxItemSize() const {
  return blocks_->params().nodesize - static_cast<uint32_t>(sizeof(Header)) - kItemHeader;
}

// ---- Locks ----------------------------------------------------------------------------

void WritePath::Set(int level, std::shared_ptr<TreeBlock> b) {
  if (locking) {
    if (held & (1u << level)) {
      nodes[level]->lock.UnlockIntent();
      held &= ~(1u << level);
    }
    if (b != nullptr) {
      b->lock.LockIntent();
      held |= 1u << level;
    }
  }
  nodes[level] = std::move(b);
}

void WritePath::Adopt(int level, std::shared_ptr<TreeBlock> b) {
  if (locking) {
    if (held & (1u << level)) nodes[level]->lock.UnlockIntent();
    held |= 1u << level;
  }
  nodes[level] = std::move(b);
}

void WritePath::ReleaseAbove(int level) {
  if (!locking) return;
  for (int l = level + 1; l < kMaxLevel; ++l) {
    if (held & (1u << l)) {
      nodes[l]->lock.UnlockIntent();
      held &= ~(1u << l);
      nodes[l] = nullptr;  // no longer ours to change
    }
  }
  if (root_lock != nullptr) {
    root_lock->UnlockIntent();
    root_lock = nullptr;
  }
}

void WritePath::Release() {
  ReleaseAbove(-1);
  held = 0;
}

RootPtr TreeWriter::CurrentRoot() const {
  if (!blocks_->Locking()) return *root_;
  root_lock_.LockShared();
  RootPtr r = *root_;
  root_lock_.UnlockShared();
  return r;
}

void TreeWriter::SetRoot(WritePath* path, const RootPtr& r) {
  WriteLocks w(path->locking);
  if (path->locking) w.Add(*path->root_lock);
  std::unique_lock<std::mutex> copy_lock;
  if (root_copy_mu_ != nullptr) copy_lock = std::unique_lock(*root_copy_mu_);
  *root_ = RootPtr{r.bytenr, r.level, r.generation, root_->id};
}

bool TreeWriter::Safe(const TreeBlock& b, int slot, bool found, uint32_t ins_len) {
  if (b.is_leaf()) {
    if (ins_len > 0) return found || (slot > 0 && b.LeafFreeSpace() >= ins_len);
    if (!found) return true;  // nothing to change
    // A delete (or an update, which may delete and reinsert) that leaves the
    // leaf's first key and keeps it from a merge.
    const uint32_t after = LeafUsed(b) - b.item_size(slot) - kItemHeader;
    return slot > 0 && b.nritems() > 1 && after >= b.LeafSpace() / 4;
  }
  if (slot < 1) return false;  // a change of the first key would reach the parent
  if (ins_len > 0) return b.nritems() < b.MaxPtrs() - 5;  // no split, even after a double split below
  return b.nritems() > 2 && static_cast<uint32_t>(b.nritems() - 1) >= static_cast<uint32_t>(b.MaxPtrs()) / 4;
}

// ---- Search ------------------------------------------------------------------------

Status TreeWriter::CowChild(WritePath* path, int level, int slot) {
  TreeBlock& parent = *path->nodes[level];
  UB_ASSIGN_OR_RETURN(BlockRef child, blocks_->Read(BlockCheck{parent.child_bytenr(slot), level - 1,
                                                               parent.child_generation(slot), parent.key(slot)}));
  UB_ASSIGN_OR_RETURN(auto c, blocks_->Cow(child, owner_));
  // A fresh copy is reachable by nobody until the parent points at it, so
  // its intent lock is free; a block already ours may be held by another.
  path->Set(level - 1, c);
  if (c->bytenr() != parent.child_bytenr(slot) || parent.child_generation(slot) != blocks_->transid()) {
    WriteLocks w(path->locking);
    w.Add(parent.lock);
    parent.mutable_ptr(slot)->blockptr = c->bytenr();
    parent.mutable_ptr(slot)->generation = blocks_->transid();
  }
  return Status::Ok();
}

Status TreeWriter::OpenSibling(WritePath* path, int level, int slot, Sibling* sib) {
  TreeBlock& parent = *path->nodes[level + 1];
  if (auto m = blocks_->Get(parent.child_bytenr(slot))) {
    if (path->locking) {
      m->lock.LockIntent();
      sib->locked = true;
    }
    sib->mine = std::move(m);
    return Status::Ok();
  }
  UB_ASSIGN_OR_RETURN(sib->clean, blocks_->Read(BlockCheck{parent.child_bytenr(slot), level,
                                                           parent.child_generation(slot), parent.key(slot)}));
  return Status::Ok();
}

Status TreeWriter::MakeWritable(WritePath* path, int level, int slot, Sibling* sib) {
  if (sib->mine) return Status::Ok();
  TreeBlock& parent = *path->nodes[level + 1];
  UB_ASSIGN_OR_RETURN(sib->mine, blocks_->Cow(sib->clean, owner_));
  if (path->locking) {
    sib->mine->lock.LockIntent();  // a fresh copy: free
    sib->locked = true;
  }
  WriteLocks w(path->locking);
  w.Add(parent.lock);
  parent.mutable_ptr(slot)->blockptr = sib->mine->bytenr();
  parent.mutable_ptr(slot)->generation = blocks_->transid();
  return Status::Ok();
}

namespace {
// Takes `child` in intent while `held` (its parent, shared) is held, then
// lets go of the parent. A child busy in intent is never waited for with the
// parent held (a pessimistic updater may hold the child and wait for the
// parent's readers): the parent goes, the wait happens holding nothing, and
// false tells the caller to start again.
bool IntentUnderShared(NodeLock& held, NodeLock& child) {
  if (!child.TryLockIntent()) {
    held.UnlockShared();
    child.LockIntent();
    child.UnlockIntent();
    return false;
  }
  held.UnlockShared();
  return true;
}
}  // namespace

// The common case first: every block on the path is already this
// transaction's and the leaf can take the change by itself. Shared locks down
// to the leaf's parent (coupling), intent on the leaf alone, so updaters of
// different leaves never wait for each other at the top of the tree. When
// that does not hold (a block to copy, a leaf to split or merge, a first key
// to change) or the leaf is busy, everything is let go of and the caller
// searches again the pessimistic way. Nothing is ever converted between
// modes: a failed attempt releases its locks and takes fresh ones.
Result<TreeWriter::Optimistic> TreeWriter::TryLeafOnly(const Key& key, uint32_t ins_len, WritePath* path) {
  root_lock_.LockShared();
  const RootPtr root = *root_;
  // Inner blocks by lock-free lookup (no reference counts on the blocks all
  // threads pass through); each is checked while its referrer is held.
  TreeBlock* n = root.generation == blocks_->transid() ? blocks_->Peek(root.bytenr) : nullptr;
  if (n == nullptr || n->dropped.load(std::memory_order_acquire) || root.level == 0) {
    root_lock_.UnlockShared();
    return Optimistic::kNo;
  }
  n->lock.LockShared();
  root_lock_.UnlockShared();
  for (int level = root.level; level > 0; --level) {
    int slot = n->LastSlotAtOrBefore(key);
    if (slot < 1 && level == 1) {  // a new first key would reach this node
      n->lock.UnlockShared();
      return Optimistic::kNo;
    }
    if (slot < 0) slot = 0;
    if (level > 1) {
      TreeBlock* inner =
          n->child_generation(slot) == blocks_->transid() ? blocks_->Peek(n->child_bytenr(slot)) : nullptr;
      if (inner == nullptr || inner->dropped.load(std::memory_order_acquire)) {  // committed, or not known yet
        n->lock.UnlockShared();
        return Optimistic::kNo;
      }
      inner->lock.LockShared();
      n->lock.UnlockShared();
      n = inner;
      continue;
    }
    const bool committed = n->child_generation(slot) != blocks_->transid();
    TreeBlock* leaf = committed ? nullptr : blocks_->Peek(n->child_bytenr(slot));
    if (leaf == nullptr || leaf->dropped.load(std::memory_order_acquire)) {  // committed (to be copied), or not known
      n->lock.UnlockShared();
      return committed && root.level >= 2 ? Optimistic::kLeafCommitted : Optimistic::kNo;
    }
    // A block Peek finds is owned until the transaction ends: the reference
    // the path keeps comes from the block itself, without the map's lock.
    std::shared_ptr<TreeBlock> child = leaf->shared_from_this();
    if (!IntentUnderShared(n->lock, child->lock)) return Optimistic::kRetry;
    const int lslot = child->FirstSlotAtOrAfter(key);
    const bool found = lslot < child->nritems() && child->key(lslot) == key;
    if (!Safe(*child, lslot, found, ins_len)) {
      child->lock.UnlockIntent();
      return Optimistic::kNo;
    }
    path->nodes[0] = std::move(child);
    path->slots[0] = lslot;
    path->held = 1;
    path->root_level = root.level;
    return found ? Optimistic::kFound : Optimistic::kNotFound;
  }
  return Optimistic::kNo;
}

// The first change of a committed leaf: shared coupling down to the
// grandparent, a try of the parent's intent lock while the grandparent is
// held (never a wait there, as for the leaf in TryLeafOnly), the leaf
// copied and the parent's pointer changed under the parent's write lock,
// then the parent let go of once the change is known to stay in the leaf.
// Two threads copying leaves under different parents no longer queue on the
// root's intent lock.
Result<TreeWriter::Optimistic> TreeWriter::TryCopyLeaf(const Key& key, uint32_t ins_len, WritePath* path) {
  root_lock_.LockShared();
  const RootPtr root = *root_;
  TreeBlock* n = root.generation == blocks_->transid() ? blocks_->Peek(root.bytenr) : nullptr;
  if (n == nullptr || n->dropped.load(std::memory_order_acquire) || root.level < 2) {
    root_lock_.UnlockShared();
    return Optimistic::kNo;
  }
  n->lock.LockShared();
  root_lock_.UnlockShared();
  TreeBlock* parent = nullptr;
  for (int level = root.level; level > 1; --level) {
    int slot = n->LastSlotAtOrBefore(key);
    if (slot < 0) slot = 0;
    TreeBlock* child = n->child_generation(slot) == blocks_->transid() ? blocks_->Peek(n->child_bytenr(slot)) : nullptr;
    if (child == nullptr || child->dropped.load(std::memory_order_acquire)) {
      n->lock.UnlockShared();
      return Optimistic::kNo;
    }
    if (level > 2) {
      child->lock.LockShared();
      n->lock.UnlockShared();
      n = child;
      continue;
    }
    if (!IntentUnderShared(n->lock, child->lock)) return Optimistic::kRetry;
    parent = child;
  }
  // The parent in intent: nobody else changes it or its pointers now.
  path->nodes[1] = parent->shared_from_this();
  path->held = 1u << 1;
  path->root_level = root.level;
  const int pslot = parent->LastSlotAtOrBefore(key);
  if (pslot < 1) {  // a new first key would reach the parent
    path->Release();
    return Optimistic::kNo;
  }
  path->slots[1] = pslot;
  UB_RETURN_IF_ERROR(CowChild(path, 1, pslot));  // the leaf, intent-locked
  TreeBlock& leaf = *path->nodes[0];
  const int lslot = leaf.FirstSlotAtOrAfter(key);
  const bool found = lslot < leaf.nritems() && leaf.key(lslot) == key;
  if (!Safe(leaf, lslot, found, ins_len)) {
    path->Release();  // the copy stays: a valid change the next search finds
    return Optimistic::kNo;
  }
  path->ReleaseAbove(0);
  path->slots[0] = lslot;
  return found ? Optimistic::kFound : Optimistic::kNotFound;
}

Result<bool> TreeWriter::SearchForWrite(const Key& key, uint32_t ins_len, WritePath* path) {
  path->Release();
  path->nodes = {};
  path->slots = {};
  path->locking = blocks_->Locking();
  if (path->locking) {
    for (int attempt = 0; attempt < 4; ++attempt) {
      UB_ASSIGN_OR_RETURN(Optimistic o, TryLeafOnly(key, ins_len, path));
      if (o == Optimistic::kLeafCommitted) {
        UB_ASSIGN_OR_RETURN(o, TryCopyLeaf(key, ins_len, path));
        if (o == Optimistic::kFound || o == Optimistic::kNotFound) {
          CopyLeafSearches().Add();
          return o == Optimistic::kFound;
        }
      }
      if (o == Optimistic::kFound || o == Optimistic::kNotFound) {
        LeafOnlySearches().Add();
        return o == Optimistic::kFound;
      }
      if (o == Optimistic::kNo) break;
    }
    FullPathSearches().Add();
    root_lock_.LockIntent();
    path->root_lock = &root_lock_;
  }
  path->root_level = root_->level;
  UB_ASSIGN_OR_RETURN(BlockRef r, blocks_->Read(BlockCheck{root_->bytenr, root_->level, root_->generation, {}}));
  UB_ASSIGN_OR_RETURN(auto b, blocks_->Cow(r, owner_));
  path->Set(root_->level, b);
  if (root_->bytenr != b->bytenr() || root_->generation != blocks_->transid()) {
    SetRoot(path, RootPtr{b->bytenr(), root_->level, blocks_->transid(), root_->id});
  }
  int level = path->root_level;
  for (;;) {
    TreeBlock& n = *path->nodes[level];
    if (level == 0) {
      int slot = n.FirstSlotAtOrAfter(key);
      path->slots[0] = slot;
      const bool found = slot < n.nritems() && n.key(slot) == key;
      if (path->locking && Safe(n, slot, found, ins_len)) path->ReleaseAbove(0);
      // No room is made for a key that exists: the caller will not insert
      // it, and a split for nothing could leave an empty leaf behind.
      if (!found && ins_len > 0 && n.LeafFreeSpace() < ins_len) {
        UB_ASSIGN_OR_RETURN(bool pushed, PushLeaf(path, key, ins_len));
        if (!pushed) UB_RETURN_IF_ERROR(SplitLeaf(path, key, ins_len));
      }
      return found;
    }
    int slot = n.LastSlotAtOrBefore(key);
    path->slots[level] = slot < 0 ? 0 : slot;
    if (path->locking && Safe(n, slot, false, ins_len)) path->ReleaseAbove(level);
    if (ins_len > 0 && n.nritems() >= n.MaxPtrs() - 3) UB_RETURN_IF_ERROR(SplitNode(path, level));
    UB_RETURN_IF_ERROR(CowChild(path, level, path->slots[level]));
    --level;
  }
}

// ---- Growth and splits ---------------------------------------------------------------

Status TreeWriter::InsertNewRoot(WritePath* path, int level) {
  const TreeBlock& old = *path->nodes[level];
  UB_ASSIGN_OR_RETURN(auto root, blocks_->New(owner_, level + 1));
  root->set_nritems(1);
  KeyPtr* p = root->mutable_ptr(0);
  (old.nritems() > 0 ? old.key(0) : Key{}).To(&p->key);
  p->blockptr = old.bytenr();
  p->generation = old.generation();
  path->Set(level + 1, root);
  path->slots[level + 1] = 0;
  path->root_level = level + 1;
  SetRoot(path, RootPtr{root->bytenr(), level + 1, blocks_->transid(), root_->id});
  ++stats_.root_grows;
  return Status::Ok();
}

Status TreeWriter::InsertPtr(TreeBlock& node, int slot, const Key& key, uint64_t bytenr, uint64_t generation) {
  const int n = node.nritems();
  if (n >= node.MaxPtrs()) return Status::Error(EIO, "internal: node " + std::to_string(node.bytenr()) + " is full");
  std::memmove(node.mutable_ptr(slot + 1), node.mutable_ptr(slot), (n - slot) * sizeof(KeyPtr));
  KeyPtr* p = node.mutable_ptr(slot);
  key.To(&p->key);
  p->blockptr = bytenr;
  p->generation = generation;
  node.set_nritems(n + 1);
  return Status::Ok();
}

Status TreeWriter::SplitNode(WritePath* path, int level) {
  if (IsRootLevel(path, level)) UB_RETURN_IF_ERROR(InsertNewRoot(path, level));
  TreeBlock& node = *path->nodes[level];
  TreeBlock& parent = *path->nodes[level + 1];
  const int pslot = path->slots[level + 1];
  const int n = node.nritems(), mid = (n + 1) / 2;
  UB_ASSIGN_OR_RETURN(auto right, blocks_->New(owner_, level));
  const bool go_right = path->slots[level] >= mid;
  // The path's next block is locked before the parent points at it: no other
  // updater may slip in between.
  if (go_right && path->locking) right->lock.LockIntent();
  {
    WriteLocks w(path->locking);
    w.Add(parent.lock);
    w.Add(node.lock);
    std::memcpy(right->mutable_ptr(0), node.mutable_ptr(mid), (n - mid) * sizeof(KeyPtr));
    right->set_nritems(n - mid);
    std::memset(node.mutable_ptr(mid), 0, (n - mid) * sizeof(KeyPtr));
    node.set_nritems(mid);
    UB_RETURN_IF_ERROR(InsertPtr(parent, pslot + 1, right->key(0), right->bytenr(), blocks_->transid()));
  }
  if (go_right) {
    path->Adopt(level, right);
    path->slots[level] -= mid;
    path->slots[level + 1] = pslot + 1;
  }
  ++stats_.node_splits;
  return Status::Ok();
}

// Makes room for ins_len bytes at the path's slot by moving items to the
// neighbouring leaves (the kernel's push_leaf_right/left) instead of a
// split: items after the slot go to the right sibling, items before it to
// the left one, as few as make the room. Nothing moves unless the plan makes
// the room and leaves this leaf non-empty. Returns whether it did.
Result<bool> TreeWriter::PushLeaf(WritePath* path, const Key& key, uint32_t ins_len) {
  if (IsRootLevel(path, 0) || path->nodes[1] == nullptr) return false;
  TreeBlock& leaf = *path->nodes[0];
  TreeBlock& parent = *path->nodes[1];
  const int n = leaf.nritems(), slot = path->slots[0], pslot = path->slots[1];
  if (ins_len > leaf.LeafSpace()) return false;
  const uint32_t need = ins_len - leaf.LeafFreeSpace();
  auto item_bytes = [&](int i) { return leaf.item_size(i) + kItemHeader; };
  const bool locking = path->locking;
  Sibling right_sib, left_sib;
  // A push rewrites two or three leaves; it pays only when the sibling can
  // take enough for several more inserts here.
  const uint32_t min_room = std::max(need, leaf.LeafSpace() / 8);
  // Plan: items [kr, n) to the right sibling, [0, kl) to the left one.
  int kr = n, kl = 0;
  uint32_t moved = 0;
  if (pslot + 1 < parent.nritems()) {
    UB_RETURN_IF_ERROR(OpenSibling(path, 0, pslot + 1, &right_sib));
    uint32_t rfree = right_sib.block().LeafFreeSpace();
    if (rfree < min_room) rfree = 0;  // not worth rewriting two leaves for
    // As much as evens out the free space of the two, and at least the need,
    // so that the next inserts here find room without another push.
    const uint32_t target = std::max(need, rfree > leaf.LeafFreeSpace() ? (rfree - leaf.LeafFreeSpace()) / 2 : 0u);
    uint32_t to_right = 0;
    while (kr > slot && moved < target && to_right + item_bytes(kr - 1) <= rfree) {
      to_right += item_bytes(kr - 1);
      moved += item_bytes(kr - 1);
      --kr;
    }
  }
  if (moved < need && pslot > 0) {
    UB_RETURN_IF_ERROR(OpenSibling(path, 0, pslot - 1, &left_sib));
    uint32_t lfree = left_sib.block().LeafFreeSpace();
    if (lfree < min_room) lfree = 0;
    const uint32_t have = leaf.LeafFreeSpace() + moved;
    const uint32_t target = std::max(need, lfree > have ? moved + (lfree - have) / 2 : 0u);
    uint32_t to_left = 0;
    while (kl < slot && moved < target && to_left + item_bytes(kl) <= lfree) {
      to_left += item_bytes(kl);
      moved += item_bytes(kl);
      ++kl;
    }
  }
  if (moved < need || kl >= kr) return false;
  // Copy committed siblings that take items.
  if (kr < n) UB_RETURN_IF_ERROR(MakeWritable(path, 0, pslot + 1, &right_sib));
  if (kl > 0) UB_RETURN_IF_ERROR(MakeWritable(path, 0, pslot - 1, &left_sib));
  WriteLocks w(locking);
  w.Add(parent.lock);
  if (kl > 0) w.Add(left_sib.mine->lock);
  w.Add(leaf.lock);
  if (kr < n) w.Add(right_sib.mine->lock);
  const TreeBlock& snap = Snapshot(0, leaf);  // the items' bytes while the leaves are rewritten
  std::vector<ItemRef>& items = ItemScratch(0);
  RefItems(snap, 0, n, &items);
  if (kr < n) {
    TreeBlock& right = *right_sib.mine;
    const TreeBlock& rsnap = Snapshot(1, right);
    std::vector<ItemRef>& merged = ItemScratch(1);
    merged.assign(items.begin() + kr, items.end());
    RefItems(rsnap, 0, rsnap.nritems(), &merged);
    WriteLeafRefs(right, merged);
    parent.SetKey(pslot + 1, right.key(0));
  }
  if (kl > 0) {
    TreeBlock& left = *left_sib.mine;
    const TreeBlock& lsnap = Snapshot(2, left);
    std::vector<ItemRef>& merged = ItemScratch(1);
    RefItems(lsnap, 0, lsnap.nritems(), &merged);
    merged.insert(merged.end(), items.begin(), items.begin() + kl);
    WriteLeafRefs(left, merged);
  }
  WriteLeafRefs(leaf, std::span(items).subspan(kl, kr - kl));
  // When the insert will land at the leaf's slot 0 the parent gets the new
  // key now, under this write lock. Left at leaf.key(0) until the insert's
  // FixupLowKeys, it would be too high for a moment: another writer would
  // route a key between the new one and the old first key to the left leaf
  // (its leaf-only path needs just a shared lock here) and put it after
  // keys that the new one then precedes.
  if (kl > 0) parent.SetKey(pslot, kl == slot ? key : leaf.key(0));
  path->slots[0] = slot - kl;
  ++stats_.leaf_pushes;
  return true;
}

Status TreeWriter::SplitLeaf(WritePath* path, const Key& key, uint32_t ins_len) {
  if (ins_len > blocks_->params().nodesize - sizeof(Header)) {
    return Status::Invalid("item of " + std::to_string(ins_len) + " bytes does not fit in a leaf");
  }
  if (IsRootLevel(path, 0)) UB_RETURN_IF_ERROR(InsertNewRoot(path, 0));
  TreeBlock& leaf = *path->nodes[0];
  const int n = leaf.nritems(), slot = path->slots[0];
  const uint32_t space = leaf.LeafSpace();
  std::vector<uint32_t> prefix(n + 1, 0);  // bytes of items [0, i)
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + leaf.item_size(i) + kItemHeader;
  // Pick the split point and the side of the new item that balances the two
  // leaves best while both fit and neither is left empty.
  int best_mid = -1;
  bool best_right = true;
  uint64_t best_diff = UINT64_MAX;
  for (int mid = 0; mid <= n; ++mid) {
    for (bool right : {false, true}) {
      if (right ? slot < mid : slot > mid) continue;  // the item must land next to its neighbours
      uint64_t l = prefix[mid] + (right ? 0 : ins_len), r = prefix[n] - prefix[mid] + (right ? ins_len : 0);
      if (l > space || r > space) continue;
      if ((mid == 0 && right) || (mid == n && !right)) continue;  // an empty leaf
      uint64_t diff = l > r ? l - r : r - l;
      if (diff < best_diff) best_diff = diff, best_mid = mid, best_right = right;
    }
  }
  if (slot == n && n > 0 && prefix[n] <= space && ins_len <= space) {
    // Appending after the leaf's last item (ascending inode numbers, dir
    // index runs): the new item starts a new leaf and this one stays full,
    // as the kernel splits for appends, instead of two half-empty leaves.
    best_mid = n;
    best_right = true;
  }
  TreeBlock& parent = *path->nodes[1];
  const int pslot = path->slots[1];
  // Neither side can take the new item with its neighbours (best_mid < 0): a
  // double split, the item alone in a new middle leaf between [0, slot) and
  // [slot, n).
  const bool double_split = best_mid < 0;
  const int cut = double_split ? slot : best_mid;
  std::shared_ptr<TreeBlock> middle;
  if (double_split) {
    UB_ASSIGN_OR_RETURN(middle, blocks_->New(owner_, 0));
  }
  UB_ASSIGN_OR_RETURN(auto right, blocks_->New(owner_, 0));
  // The leaf the path moves to is locked before the parent points at it.
  std::shared_ptr<TreeBlock> next = double_split ? middle : best_right ? right : nullptr;
  if (next && path->locking) next->lock.LockIntent();
  {
    WriteLocks w(path->locking);
    w.Add(parent.lock);
    if (cut < n) {  // an append split (cut == n) leaves the leaf as it is and the new one empty
      w.Add(leaf.lock);
      const TreeBlock& snap = Snapshot(0, leaf);
      std::vector<ItemRef>& items = ItemScratch(0);
      RefItems(snap, 0, n, &items);
      WriteLeafRefs(leaf, std::span(items).subspan(0, cut));
      WriteLeafRefs(*right, std::span(items).subspan(cut));
    }
    int at = pslot + 1;
    if (double_split) {
      UB_RETURN_IF_ERROR(InsertPtr(parent, at++, key, middle->bytenr(), blocks_->transid()));
    }
    // The new item goes first in the right leaf when it lands at the cut:
    // the parent takes its key now, for the reason given in PushLeaf.
    const bool first_in_right = !double_split && best_right && slot == cut;
    const Key right_key = right->nritems() > 0 && !first_in_right ? right->key(0) : key;
    UB_RETURN_IF_ERROR(InsertPtr(parent, at, right_key, right->bytenr(), blocks_->transid()));
  }
  if (next) {
    path->Adopt(0, next);
    path->slots[0] = double_split ? 0 : slot - best_mid;
    path->slots[1] = pslot + 1;
  }
  stats_.leaf_splits += double_split ? 2 : 1;
  return Status::Ok();
}

// ---- Insertion ---------------------------------------------------------------------------

Status TreeWriter::InsertEmptyItems(WritePath* path, std::span<const Key> keys, std::span<const uint32_t> sizes,
                                    std::span<const std::span<const uint8_t>> data) {
  TreeBlock& leaf = *path->nodes[0];
  uint32_t total = 0;
  for (uint32_t s : sizes) total += s;
  if (leaf.LeafFreeSpace() < total + static_cast<uint32_t>(keys.size()) * kItemHeader) {
    return Status::Error(EIO, "internal: leaf " + std::to_string(leaf.bytenr()) + " has no room for the batch");
  }
  thread_local std::vector<int> pos;
  pos.assign(keys.size(), path->slots[0]);  // all between the slot's neighbours
  MergeIntoLeaf(path, keys, sizes, data, pos);
  return Status::Ok();
}

void TreeWriter::FixupLowKeys(WritePath* path, const Key& key, int level) {
  for (int l = level; l < kMaxLevel && path->nodes[l]; ++l) {
    {
      WriteLocks w(path->locking);
      w.Add(path->nodes[l]->lock);
      path->nodes[l]->SetKey(path->slots[l], key);
    }
    if (path->slots[l] != 0) break;
  }
}

Status TreeWriter::Insert(const Key& key, std::span<const uint8_t> data) {
  if (data.size() > MaxItemSize()) return Status::Invalid("item of " + std::to_string(data.size()) + " bytes is too big");
  WritePath path;
  UB_ASSIGN_OR_RETURN(bool found, SearchForWrite(key, static_cast<uint32_t>(data.size()) + kItemHeader, &path));
  if (found) return Status::Error(EEXIST, "item " + KeyToString(key) + " exists");
  const uint32_t size = static_cast<uint32_t>(data.size());
  return InsertEmptyItems(&path, std::span(&key, 1), std::span(&size, 1), std::span(&data, 1));
}

Result<bool> TreeWriter::InsertOrAppendRun(const Key& key, std::span<const uint8_t> data, uint32_t entry_size,
                                           uint64_t stride, uint32_t max_size) {
  if (data.size() > MaxItemSize()) return Status::Invalid("item of " + std::to_string(data.size()) + " bytes is too big");
  if (entry_size == 0 || data.size() % entry_size) return Status::Invalid("run item of a partial entry");
  WritePath path;
  const uint32_t size = static_cast<uint32_t>(data.size());
  UB_ASSIGN_OR_RETURN(bool found, SearchForWrite(key, size + kItemHeader, &path));
  if (found) return Status::Error(EEXIST, "item " + KeyToString(key) + " exists");
  TreeBlock& leaf = path.leaf();
  const int slot = path.slot();
  if (slot > 0) {
    // Only this operation may change the leaf (it holds its intent lock),
    // so what is read here still holds when the write lock is taken.
    const Key prev = leaf.key(slot - 1);
    const uint32_t prev_size = leaf.item_size(slot - 1);
    if (prev.objectid == key.objectid && prev.type == key.type && prev_size % entry_size == 0 &&
        prev.offset + prev_size / entry_size * stride == key.offset && prev_size + size <= max_size) {
      path.slots[0] = slot - 1;
      WriteLocks w(path.locking);
      w.Add(leaf.lock);
      UB_RETURN_IF_ERROR(ResizeItem(&path, prev_size + size));
      std::memcpy(leaf.mutable_item_data(slot - 1) + prev_size, data.data(), size);
      return true;
    }
  }
  UB_RETURN_IF_ERROR(InsertEmptyItems(&path, std::span(&key, 1), std::span(&size, 1), std::span(&data, 1)));
  return false;
}

Status TreeWriter::InsertBatch(std::span<const Key> keys, std::span<const std::vector<uint8_t>> data,
                               bool nothing_between) {
  constexpr size_t kInline = 8;  // small batches (a new inode's items) without allocating
  std::array<std::span<const uint8_t>, kInline> inline_spans;
  std::vector<std::span<const uint8_t>> heap_spans;
  std::span<std::span<const uint8_t>> spans;
  if (data.size() <= kInline) {
    spans = std::span(inline_spans).first(data.size());
  } else {
    heap_spans.resize(data.size());
    spans = heap_spans;
  }
  for (size_t i = 0; i < data.size(); ++i) spans[i] = data[i];
  return InsertBatch(keys, std::span<const std::span<const uint8_t>>(spans), nothing_between);
}

Status TreeWriter::InsertBatch(std::span<const Key> keys, std::span<const std::span<const uint8_t>> spans,
                               bool nothing_between) {
  if (keys.empty()) return Status::Ok();
  if (spans.size() != keys.size()) return Status::Invalid("batch of " + std::to_string(keys.size()) + " keys and " +
                                                          std::to_string(spans.size()) + " items");
  constexpr size_t kInline = 8;
  std::array<uint32_t, kInline> inline_sizes;
  std::vector<uint32_t> heap_sizes;
  std::span<uint32_t> sizes;
  if (keys.size() <= kInline) {
    sizes = std::span(inline_sizes).first(keys.size());
  } else {
    heap_sizes.resize(keys.size());
    sizes = heap_sizes;
  }
  uint32_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0 && !(keys[i - 1] < keys[i])) return Status::Invalid("batch keys are not ascending");
    sizes[i] = static_cast<uint32_t>(spans[i].size());
    total += sizes[i] + kItemHeader;
  }
  if (total <= blocks_->params().nodesize - sizeof(Header)) {
    // The batch goes in one leaf only if no existing key falls inside it.
    // Checked before searching for write: a split made for a batch that
    // then is not inserted would leave an empty leaf behind. (The caller
    // keeps other writers out of this key range.)
    bool fits = true;
    if (!nothing_between) {
      Cursor c(blocks_, LiveRef());  // let go of before the search below locks
      UB_RETURN_IF_ERROR(c.Seek(keys[0]));
      if (c.Valid() && c.key() == keys[0]) return Status::Error(EEXIST, "item " + KeyToString(keys[0]) + " exists");
      fits = !c.Valid() || keys.back() < c.key();
    }
    if (fits) {
      WritePath path;
      UB_ASSIGN_OR_RETURN(bool found, SearchForWrite(keys[0], total, &path));
      if (found) return Status::Error(EIO, "internal: batch key appeared");
      return InsertEmptyItems(&path, keys, sizes, spans);
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) UB_RETURN_IF_ERROR(Insert(keys[i], spans[i]));
  return Status::Ok();
}

Status TreeWriter::InsertSorted(std::span<const Key> keys, std::span<const std::span<const uint8_t>> data) {
  if (data.size() != keys.size()) return Status::Invalid("batch of " + std::to_string(keys.size()) + " keys and " +
                                                         std::to_string(data.size()) + " items");
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0 && !(keys[i - 1] < keys[i])) return Status::Invalid("batch keys are not ascending");
    if (data[i].size() > MaxItemSize()) {
      return Status::Invalid("item of " + std::to_string(data[i].size()) + " bytes is too big");
    }
  }
  thread_local std::vector<int> pos;
  thread_local std::vector<uint32_t> sizes;
  for (size_t i = 0; i < keys.size();) {
    WritePath path;
    const uint32_t first = static_cast<uint32_t>(data[i].size()) + kItemHeader;
    UB_ASSIGN_OR_RETURN(bool found, SearchForWrite(keys[i], first, &path));
    if (found) return Status::Error(EEXIST, "item " + KeyToString(keys[i]) + " exists");
    // Our intent lock keeps other writers off this leaf, so it can be read
    // without the write lock. Keys after the first join it while they fall
    // before its last item (beyond it they might belong to the next leaf)
    // and fit in its free space.
    const TreeBlock& leaf = path.leaf();
    const int n = leaf.nritems();
    uint32_t room = leaf.LeafFreeSpace() - first;
    pos.assign(1, path.slot());
    sizes.assign(1, first - kItemHeader);
    size_t j = i + 1;
    if (path.slot() < n) {
      const Key last = leaf.key(n - 1);
      for (; j < keys.size() && keys[j] < last; ++j) {
        const uint32_t need = static_cast<uint32_t>(data[j].size()) + kItemHeader;
        if (need > room) break;
        const int p = leaf.FirstSlotAtOrAfter(keys[j]);
        if (leaf.key(p) == keys[j]) break;  // the next search reports it
        room -= need;
        pos.push_back(p);
        sizes.push_back(need - kItemHeader);
      }
    }
    MergeIntoLeaf(&path, keys.subspan(i, j - i), sizes, data.subspan(i, j - i), pos);
    i = j;
  }
  return Status::Ok();
}

void TreeWriter::MergeIntoLeaf(WritePath* path, std::span<const Key> keys, std::span<const uint32_t> sizes,
                               std::span<const std::span<const uint8_t>> data, std::span<const int> pos) {
  if (keys.empty()) return;
  TreeBlock& leaf = *path->nodes[0];
  const int n = leaf.nritems(), m = static_cast<int>(keys.size());
  uint32_t shift = 0;  // bytes of new data below old item `hi` and after: all of it at first
  for (uint32_t size : sizes) shift += size;
  {
    WriteLocks w(path->locking);
    w.Add(leaf.lock);
    uint8_t* body = leaf.mutable_bytes() + sizeof(Header);
    // From the last new item down: old items [pos[k], hi) go up k + 1 slots
    // and their data down by the new data of items 0..k, then new item k
    // takes slot pos[k] + k, its data right below its left neighbour's.
    // Every move goes to where items already moved (or free space) were, and
    // items below pos[k] are untouched until their turn.
    int hi = n;
    for (int k = m - 1; k >= 0; --k) {
      const int p = pos[k];
      const uint32_t top = p == 0 ? leaf.LeafSpace() : leaf.item_offset(p - 1);
      if (p < hi) {
        const uint32_t bottom = leaf.item_offset(hi - 1);
        std::memmove(body + bottom - shift, body + bottom, top - bottom);
        for (int s = p; s < hi; ++s) leaf.mutable_item(s)->offset = leaf.item_offset(s) - shift;
        std::memmove(leaf.mutable_item(p + k + 1), leaf.mutable_item(p), (hi - p) * sizeof(Item));
        hi = p;
      }
      const uint32_t size = sizes[k];
      shift -= size;
      Item* it = leaf.mutable_item(p + k);
      keys[k].To(&it->key);
      it->offset = top - shift - size;
      it->size = size;
      if (k < static_cast<int>(data.size()) && size > 0) {
        std::memcpy(body + top - shift - size, data[k].data(), size);
      } else {
        std::memset(body + top - shift - size, 0, size);
      }
    }
    leaf.set_nritems(n + m);
  }
  // The leaf is unlocked; only the parents' low keys are left.
  if (pos[0] == 0) FixupLowKeys(path, keys[0], 1);
  if (!path->locking) {  // per-call counters on a line threads would share: single-threaded only
    stats_.batch_inserts.fetch_add(1, std::memory_order_relaxed);
    stats_.items_inserted.fetch_add(m, std::memory_order_relaxed);
  }
}

Result<size_t> TreeWriter::InsertPrefixInLeaf(std::span<const Key> keys, std::span<const std::vector<uint8_t>> data) {
  if (keys.empty()) return size_t{0};
  // Every inserted key must stay below the next existing key.
  bool bounded;
  Key bound{};
  {
    Cursor c(blocks_, LiveRef());
    UB_RETURN_IF_ERROR(c.Seek(keys[0]));
    if (c.Valid() && c.key() == keys[0]) return Status::Error(EEXIST, "item " + KeyToString(keys[0]) + " exists");
    bounded = c.Valid();
    if (bounded) bound = c.key();
  }
  WritePath path;
  UB_ASSIGN_OR_RETURN(bool found, SearchForWrite(keys[0], static_cast<uint32_t>(data[0].size()) + kItemHeader, &path));
  if (found) return Status::Error(EIO, "internal: batch key appeared");
  const uint32_t room = path.leaf().LeafFreeSpace();
  std::vector<uint32_t> sizes;
  std::vector<std::span<const uint8_t>> spans;
  uint32_t used = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t need = static_cast<uint32_t>(data[i].size()) + kItemHeader;
    if (used + need > room || (bounded && !(keys[i] < bound)) || (i > 0 && !(keys[i - 1] < keys[i]))) break;
    used += need;
    sizes.push_back(static_cast<uint32_t>(data[i].size()));
    spans.emplace_back(data[i]);
  }
  const size_t n = sizes.size();
  UB_RETURN_IF_ERROR(InsertEmptyItems(&path, keys.first(n), sizes, spans));
  return n;
}

// ---- Resize and update -------------------------------------------------------------------

Status TreeWriter::ResizeItem(WritePath* path, uint32_t new_size) {
  TreeBlock& leaf = *path->nodes[0];
  const int slot = path->slots[0], n = leaf.nritems();
  const uint32_t old_size = leaf.item_size(slot), off = leaf.item_offset(slot);
  if (new_size == old_size) return Status::Ok();
  uint8_t* body = leaf.mutable_bytes() + sizeof(Header);
  const uint32_t data_end = leaf.item_offset(n - 1);
  if (new_size > old_size) {
    const uint32_t d = new_size - old_size;
    if (leaf.LeafFreeSpace() < d) return Status::Error(EIO, "internal: no room to grow item");
    // Data of items [slot, n) moves down by d; the item's end stays put.
    std::memmove(body + data_end - d, body + data_end, off + old_size - data_end);
    for (int i = slot; i < n; ++i) leaf.mutable_item(i)->offset = leaf.item_offset(i) - d;
    std::memset(body + off - d + old_size, 0, d);
  } else {
    const uint32_t d = old_size - new_size;
    // Keep the leading new_size bytes: data below them moves up by d.
    std::memmove(body + data_end + d, body + data_end, off + new_size - data_end);
    for (int i = slot; i < n; ++i) leaf.mutable_item(i)->offset = leaf.item_offset(i) + d;
    std::memset(body + data_end, 0, d);
  }
  leaf.mutable_item(slot)->size = new_size;
  return Status::Ok();
}

Status TreeWriter::Update(const Key& key, std::span<const uint8_t> data) {
  if (data.size() > MaxItemSize()) return Status::Invalid("item of " + std::to_string(data.size()) + " bytes is too big");
  WritePath path;
  UB_ASSIGN_OR_RETURN(bool found, SearchForWrite(key, 0, &path));
  if (!found) return Status::NotFound("item " + KeyToString(key) + " does not exist");
  const uint32_t size = static_cast<uint32_t>(data.size());
  const uint32_t old = path.leaf().item_size(path.slot());
  if (size > old && path.leaf().LeafFreeSpace() < size - old) {
    UB_RETURN_IF_ERROR(DeleteItems(&path, path.slot(), 1));
    path.Release();  // the insert searches again
    return Insert(key, data);
  }
  WriteLocks w(path.locking);
  w.Add(path.leaf().lock);
  UB_RETURN_IF_ERROR(ResizeItem(&path, size));
  if (size) std::memcpy(path.leaf().mutable_item_data(path.slot()), data.data(), size);
  return Status::Ok();
}

Status TreeWriter::UpdateSorted(std::span<const Key> keys, std::span<const std::span<const uint8_t>> data) {
  if (data.size() != keys.size()) return Status::Invalid("update of " + std::to_string(keys.size()) + " keys and " +
                                                         std::to_string(data.size()) + " items");
  size_t i = 0;
  while (i < keys.size()) {
    const size_t first = i;
    {
      WritePath path;
      UB_ASSIGN_OR_RETURN(bool found, SearchForWrite(keys[i], 0, &path));
      if (!found) return Status::NotFound("item " + KeyToString(keys[i]) + " does not exist");
      TreeBlock& leaf = path.leaf();
      WriteLocks w(path.locking);
      w.Add(leaf.lock);
      for (int slot = path.slot(); i < keys.size(); ++i) {
        if (i > first && !(keys[i - 1] < keys[i])) return Status::Invalid("keys of a sorted update not ascending");
        while (slot < leaf.nritems() && leaf.key(slot) < keys[i]) ++slot;
        // Past this leaf, absent, or changing size: a search of its own.
        if (slot >= leaf.nritems() || leaf.key(slot) != keys[i] || leaf.item_size(slot) != data[i].size()) break;
        if (!data[i].empty()) std::memcpy(leaf.mutable_item_data(slot), data[i].data(), data[i].size());
      }
    }
    if (i == first) {
      UB_RETURN_IF_ERROR(Update(keys[i], data[i]));
      ++i;
    }
  }
  return Status::Ok();
}

// ---- Deletion ------------------------------------------------------------------------------

Status TreeWriter::Delete(const Key& key) {
  WritePath path;
  UB_ASSIGN_OR_RETURN(bool found, SearchForWrite(key, 0, &path));
  if (!found) return Status::NotFound("item " + KeyToString(key) + " does not exist");
  return DeleteItems(&path, path.slot(), 1);
}

Status TreeWriter::DeleteItems(WritePath* path, int slot, int nr) {
  TreeBlock& leaf = *path->nodes[0];
  const int n = leaf.nritems();
  if (nr <= 0) return Status::Ok();
  if (slot < 0 || slot + nr > n) return Status::Invalid("delete range outside the leaf");
  {
    WriteLocks w(path->locking);
    w.Add(leaf.lock);
    uint8_t* body = leaf.mutable_bytes() + sizeof(Header);
    const uint32_t data_end = leaf.item_offset(n - 1);
    const uint32_t gone_start = leaf.item_offset(slot + nr - 1);
    const uint32_t gone_end = leaf.item_offset(slot) + leaf.item_size(slot);
    const uint32_t d = gone_end - gone_start;
    std::memmove(body + data_end + d, body + data_end, gone_start - data_end);
    std::memset(body + data_end, 0, d);
    for (int i = slot + nr; i < n; ++i) leaf.mutable_item(i)->offset = leaf.item_offset(i) + d;
    std::memmove(leaf.mutable_item(slot), leaf.mutable_item(slot + nr), (n - slot - nr) * sizeof(Item));
    std::memset(leaf.mutable_item(n - nr), 0, nr * sizeof(Item));
    leaf.set_nritems(n - nr);
  }
  // The leaf is unlocked; what follows changes the blocks above it.
  if (IsRootLevel(path, 0)) return Status::Ok();  // a root leaf may be empty
  if (leaf.nritems() == 0) {
    UB_RETURN_IF_ERROR(DelPtr(path, 1, path->slots[1]));
    return blocks_->Free(leaf, owner_);
  }
  if (slot == 0) FixupLowKeys(path, leaf.key(0), 1);
  return MaybeMerge(path, 0);
}

namespace {
void RemovePtr(TreeBlock& node, int slot) {
  const int n = node.nritems();
  std::memmove(node.mutable_ptr(slot), node.mutable_ptr(slot + 1), (n - slot - 1) * sizeof(KeyPtr));
  std::memset(node.mutable_ptr(n - 1), 0, sizeof(KeyPtr));
  node.set_nritems(n - 1);
}
}  // namespace

Status TreeWriter::DelPtr(WritePath* path, int level, int slot) {
  TreeBlock& node = *path->nodes[level];
  {
    WriteLocks w(path->locking);
    w.Add(node.lock);
    RemovePtr(node, slot);
  }
  return AfterPtrRemoved(path, level, slot);
}

// What a node that lost the pointer at `slot` needs: a root shrinks, an
// empty node goes, a new first key goes up, an underfull node merges.
Status TreeWriter::AfterPtrRemoved(WritePath* path, int level, int slot) {
  TreeBlock& node = *path->nodes[level];
  if (IsRootLevel(path, level)) {
    if (node.nritems() == 0) {
      // Every item is gone: the tree becomes one empty leaf.
      UB_ASSIGN_OR_RETURN(auto leaf, blocks_->New(owner_, 0));
      SetRoot(path, RootPtr{leaf->bytenr(), 0, blocks_->transid(), root_->id});
      ++stats_.root_shrinks;
      return blocks_->Free(node, owner_);
    }
    if (node.nritems() == 1) {
      // A root with one child is one level too tall.
      SetRoot(path, RootPtr{node.child_bytenr(0), level - 1, node.child_generation(0), root_->id});
      ++stats_.root_shrinks;
      return blocks_->Free(node, owner_);
    }
    return Status::Ok();
  }
  if (node.nritems() == 0) {
    UB_RETURN_IF_ERROR(DelPtr(path, level + 1, path->slots[level + 1]));
    return blocks_->Free(node, owner_);
  }
  if (slot == 0) FixupLowKeys(path, node.key(0), level + 1);
  return MaybeMerge(path, level);
}

// Folds an underfull block into a sibling when the two fit in one block.
Status TreeWriter::MaybeMerge(WritePath* path, int level) {
  if (IsRootLevel(path, level)) return Status::Ok();
  TreeBlock& self = *path->nodes[level];
  const bool leaf = level == 0;
  const uint32_t cap = leaf ? self.LeafSpace() : static_cast<uint32_t>(self.MaxPtrs());
  auto used = [&](const TreeBlock& b) { return leaf ? LeafUsed(b) : static_cast<uint32_t>(b.nritems()); };
  if (used(self) >= cap / 4) return Status::Ok();
  TreeBlock& parent = *path->nodes[level + 1];
  const int pslot = path->slots[level + 1];
  // Nodes keep headroom so the next insert does not split them at once.
  const uint32_t limit = leaf ? cap : cap - 4;
  for (int side : {-1, 1}) {
    const int sib_slot = pslot + side;
    if (sib_slot < 0 || sib_slot >= parent.nritems()) continue;
    Sibling sib;
    UB_RETURN_IF_ERROR(OpenSibling(path, level, sib_slot, &sib));
    if (used(sib.block()) + used(self) > limit) continue;
    // Only a left sibling needs to be writable; a right one is read and dropped.
    if (side < 0) UB_RETURN_IF_ERROR(MakeWritable(path, level, sib_slot, &sib));
    TreeBlock& left = side < 0 ? *sib.mine : self;
    const TreeBlock& right = side < 0 ? self : sib.block();
    const int right_slot = side < 0 ? pslot : sib_slot;
    {
      // The merge and the parent's loss of the right block's pointer are one
      // change to readers: no reader sees the items twice.
      WriteLocks w(path->locking);
      w.Add(parent.lock);
      w.Add(left.lock);
      if (side < 0 || sib.mine) w.Add(right.lock);  // a committed block has no readers to wait for
      if (leaf) {
        const TreeBlock& lsnap = Snapshot(0, left);
        std::vector<ItemRef>& items = ItemScratch(0);
        RefItems(lsnap, 0, lsnap.nritems(), &items);
        RefItems(right, 0, right.nritems(), &items);  // right is not the block rewritten
        WriteLeafRefs(left, items);
      } else {
        const int ln = left.nritems(), rn = right.nritems();
        for (int i = 0; i < rn; ++i) {
          KeyPtr* p = left.mutable_ptr(ln + i);
          right.key(i).To(&p->key);
          p->blockptr = right.child_bytenr(i);
          p->generation = right.child_generation(i);
        }
        left.set_nritems(ln + rn);
      }
      RemovePtr(parent, right_slot);
    }
    ++stats_.merges;
    // The path continues through the left block; the right one is dropped
    // (kept alive until its pointer is gone, which it is).
    BlockRef gone = side < 0 ? BlockRef(path->nodes[level]) : (sib.mine ? BlockRef(sib.mine) : sib.clean);
    if (side < 0) {
      // The path takes over the sibling's intent lock; its own block's is let go.
      std::shared_ptr<TreeBlock> old = path->nodes[level];
      path->nodes[level] = sib.mine;
      if (sib.locked) {
        sib.locked = false;
        old->lock.UnlockIntent();
      }
      path->slots[level + 1] = pslot - 1;
    }
    UB_RETURN_IF_ERROR(blocks_->Free(*gone, owner_));
    return AfterPtrRemoved(path, level + 1, right_slot);
  }
  return Status::Ok();
}

}  // namespace ubtrfs::tree
