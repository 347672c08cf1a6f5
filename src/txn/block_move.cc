// Moving committed tree blocks to new addresses with their sharing kept
// (relocation, txn/extent_relocation.h).
//
// Copy on write moves a block for one tree: a block that snapshots share
// would be copied once per snapshot. Here each block is copied once, and
// every pointer to it follows the copy: its parents are moved the same way
// (the caller hands over the closure, up to the roots), and a tree whose
// root it is points at the copy. Every reference follows one for one:
//   - the copy gets the references the block had (by tree as they were; by
//     parent naming the parent's copy), and the block loses them all, so it
//     is freed;
//   - a block whose children are referenced by parent (FULL_BACKREF) moves
//     those references to its copy (a child that moves too carries its own);
//   - a file extent item repointed at a data extent's copy moves its
//     reference with it: by the leaf's tree, or by the leaf when the leaf
//     is FULL_BACKREF.
// The kernel's relocation gets the same result with reloc trees that it
// merges back into each subvolume; offline, with every block committed and
// nothing else changing, the pointers can be rewritten directly.
#include <algorithm>
#include <map>

#include "format/ondisk.h"
#include "txn/extent_refs.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

void TxnManager::SetDataOwner(uint64_t bytenr, uint64_t owner) {
  auto lock = AllocLock();
  pending_[bytenr].owner = owner;
}

bool TxnManager::FullBackref(uint64_t bytenr) {
  auto lock = AllocLock();
  return InfoOf(bytenr).flags & kBlockFlagFullBackref;
}

Status TxnManager::MoveTreeBlocks(const std::vector<BlockMove>& moves, const std::map<uint64_t, uint64_t>& data) {
  auto lock = AllocLock();
  const uint64_t gen = transid();
  std::map<uint64_t, const BlockMove*> by_addr;
  for (const BlockMove& m : moves) by_addr[m.bytenr] = &m;
  // Checked before anything changes: a pointer left at a freed block would
  // be a lost subtree.
  for (const BlockMove& m : moves) {
    const std::string what = "moving tree block " + std::to_string(m.bytenr);
    if (dirty_->IsDirty(m.bytenr)) return Status::Error(EIO, "internal: " + what + ": it changed in this transaction");
    for (uint64_t p : m.parents) {
      if (!by_addr.contains(p)) return Status::Error(EIO, "internal: " + what + ": its parent " + std::to_string(p) + " stays");
    }
  }
  struct Copy {
    const BlockMove* m;
    tree::BlockRef old;
    std::shared_ptr<tree::TreeBlock> copy;
    BlockInfo info;
  };
  std::vector<Copy> copies;
  std::map<uint64_t, uint64_t> new_addr;
  copies.reserve(moves.size());
  lock.unlock();  // DirtyBlocks calls AllocTreeBlock, which takes it
  for (const BlockMove& m : moves) {
    UB_ASSIGN_OR_RETURN(tree::BlockRef old, dirty_->Read(tree::BlockCheck{m.bytenr, m.level, 0, {}}));
    UB_ASSIGN_OR_RETURN(auto copy, dirty_->CopyToNew(old, old->owner()));
    new_addr[m.bytenr] = copy->bytenr();
    copies.push_back({&m, std::move(old), std::move(copy), {}});
  }
  lock.lock();
  for (Copy& c : copies) {
    c.info = InfoOf(c.m->bytenr);
    // CopyToNew gave the copy a reference by its owner; it gets the block's
    // own references instead.
    QueueRef(c.copy->bytenr(), true, static_cast<uint64_t>(c.m->level), RefId{kTreeBlockRefKey, c.old->owner()}, -1);
  }
  for (Copy& c : copies) {
    const tree::TreeBlock& old = *c.old;
    tree::TreeBlock& copy = *c.copy;
    const uint64_t to = copy.bytenr();
    const bool full = c.info.flags & kBlockFlagFullBackref;
    if (!old.is_leaf()) {
      for (int i = 0; i < old.nritems(); ++i) {
        const uint64_t child = old.child_bytenr(i);
        if (auto it = new_addr.find(child); it != new_addr.end()) {
          copy.mutable_ptr(i)->blockptr = it->second;
          copy.mutable_ptr(i)->generation = gen;
        } else if (full) {
          // The new reference first: the child's count must not pass zero
          // on the way (its entry would be dropped, FULL_BACKREF with it).
          ChangeCommittedRef(child, old.level() - 1, RefId{kSharedBlockRefKey, to}, +1);
          ChangeCommittedRef(child, old.level() - 1, RefId{kSharedBlockRefKey, old.bytenr()}, -1);
        }
      }
    } else {
      for (int i = 0; i < old.nritems(); ++i) {
        const Key k = old.key(i);
        if (k.type != kExtentDataKey || old.item_size(i) < sizeof(FileExtentItem)) continue;
        auto* fe = reinterpret_cast<FileExtentItem*>(copy.mutable_item_data(i));
        if ((fe->type != kFileExtentReg && fe->type != kFileExtentPrealloc) || fe->disk_bytenr.get() == 0) continue;
        const uint64_t from = fe->disk_bytenr.get(), len = fe->disk_num_bytes.get();
        auto moved = data.find(from);
        const uint64_t dest = moved == data.end() ? from : moved->second;
        if (full) {
          QueueRef(from, false, len, RefId{kSharedDataRefKey, old.bytenr()}, -1);
          QueueRef(dest, false, len, RefId{kSharedDataRefKey, to}, +1);
        } else if (dest != from) {
          const RefId r{kExtentDataRefKey, old.owner(), k.objectid, k.offset - fe->offset.get()};
          QueueRef(from, false, len, r, -1);
          QueueRef(dest, false, len, r, +1);
        }
        fe->disk_bytenr = dest;
      }
    }
    // The block's references, each to the copy.
    for (const RefId& r : c.m->refs) {
      ChangeCommittedRef(old.bytenr(), old.level(), r, -1);
      RefId to_ref = r;
      if (r.type == kSharedBlockRefKey) to_ref.a = new_addr.at(r.a);
      QueueRef(to, true, static_cast<uint64_t>(old.level()), to_ref, +1);
    }
    if (full) pending_[to].set_flags |= kBlockFlagFullBackref;
    if (c.m->refs.size() > 1 || full) {
      shared_info_[to] = BlockInfo{static_cast<int64_t>(c.m->refs.size()), c.info.flags & kBlockFlagFullBackref};
      any_shared_.store(true, std::memory_order_relaxed);
    }
    UB_RETURN_IF_ERROR(space_->Free(old.bytenr(), vol_->nodesize()));
    MarkGroupDirty(old.bytenr());
    freed_blocks_.push_back(old.bytenr());
  }
  lock.unlock();
  for (const Copy& c : copies) {
    for (uint64_t t : c.m->root_of) {
      const tree::RootPtr moved{c.copy->bytenr(), c.m->level, gen, t};
      if (t == kRootTreeObjectid) {
        *vol_->mutable_root_tree() = moved;
        continue;
      }
      UB_ASSIGN_OR_RETURN(Volume::TreeRoot * r, vol_->MutableRoot(t));
      std::lock_guard<std::mutex> roots(vol_->roots_mutex());
      r->ref = moved;
      moved_only_.insert(t);
      // The kernel takes a block newer than the subvolume's last snapshot
      // for its own without asking the extent tree (btrfs_block_can_be_shared);
      // the copies are new and may be shared. Its relocation moves
      // last_snapshot up the same way.
      if ((t == kFsTreeObjectid || t >= kFirstFreeObjectid) && r->item.last_snapshot.get() < gen) {
        r->item.last_snapshot = gen;
      }
    }
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
