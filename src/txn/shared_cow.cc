// Copy on write of tree blocks that more than one tree may reach: the
// reference rules of the kernel's update_ref_for_cow.
//
// A committed block has one reference per parent that points at it: keyed
// by the tree (TREE_BLOCK_REF) when the parent belongs to that tree and
// references its children that way, or by the parent's address
// (SHARED_BLOCK_REF) when the parent carries the FULL_BACKREF flag. Data
// extents that leaves point at are referenced the same two ways
// (EXTENT_DATA_REF by root/inode/offset, SHARED_DATA_REF by leaf).
//
// When tree R stops pointing at committed block B (it copies B, or a merge
// moves B's pointers into one of R's blocks), B's pointers live on in R's
// block, so B's children gain a reference for it, and B loses R's:
//   - B shared (refs > 1), owned by R and not FULL_BACKREF: B stays with the
//     other trees; its children keep their TREE_BLOCK_REF(R) for R's copy and
//     gain a reference by parent for B, which becomes FULL_BACKREF;
//   - B shared otherwise: the children gain TREE_BLOCK_REF(R) for R's copy;
//   - B with one reference and FULL_BACKREF: B goes; its children's
//     references by parent become TREE_BLOCK_REF(R);
//   - B with one reference, owned by R: nothing changes below it.
// Then B's TREE_BLOCK_REF(R) is dropped (FreeTreeBlock); B is freed only
// when that was its last reference.
//
// Children are always committed blocks (a committed block points only at
// committed ones), and a tree copies top-down, so B's reference count is
// exact when B is reached: sharing is pushed down one level per copy.
#include <cstring>

#include "format/ondisk.h"
#include "txn/extent_refs.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Status TxnManager::NoteExtentItemForCow(const Key& k, uint64_t refs, uint64_t flags) {
  if (refs == 1 && !(flags & kBlockFlagFullBackref)) return Status::Ok();
  shared_info_[k.objectid] = BlockInfo{static_cast<int64_t>(refs), flags & kBlockFlagFullBackref};
  any_shared_.store(true, std::memory_order_relaxed);
  return Status::Ok();
}

TxnManager::BlockInfo TxnManager::InfoOf(uint64_t bytenr) const {
  auto it = shared_info_.find(bytenr);
  return it == shared_info_.end() ? BlockInfo{} : it->second;
}

void TxnManager::ChangeCommittedRef(uint64_t bytenr, int level, const RefId& r, int delta) {
  PendingExtent& p = pending_[bytenr];
  if (p.base_refs < 0 && !p.fresh) p.base_refs = InfoOf(bytenr).refs;
  QueueRef(bytenr, true, static_cast<uint64_t>(level), r, delta);
  if (!any_shared_.load(std::memory_order_relaxed)) return;  // every block has one reference: nothing to keep
  auto it = shared_info_.try_emplace(bytenr).first;
  it->second.refs += delta;
  if (it->second.refs <= 0 || (it->second.refs == 1 && it->second.flags == 0)) shared_info_.erase(it);
}

void TxnManager::ChangeChildRefs(const tree::TreeBlock& b, uint64_t root, int delta) {
  const uint64_t parent = root == 0 ? b.bytenr() : 0;
  if (!b.is_leaf()) {
    for (int i = 0; i < b.nritems(); ++i) {
      RefId r{root ? kTreeBlockRefKey : kSharedBlockRefKey, root ? root : parent};
      ChangeCommittedRef(b.child_bytenr(i), b.level() - 1, r, delta);
    }
    return;
  }
  ForEachDataExtent(b, [&](const Key& k, const FileExtentItem& fe) {
    const RefId r = root ? RefId{kExtentDataRefKey, root, k.objectid, k.offset - fe.offset.get()}
                         : RefId{kSharedDataRefKey, parent};
    QueueRef(fe.disk_bytenr.get(), false, fe.disk_num_bytes.get(), r, delta);
  });
}

void TxnManager::ReferenceChildrenByParent(const tree::TreeBlock& b) {
  ChangeChildRefs(b, 0, +1);
  PendingExtent& p = pending_[b.bytenr()];
  if (p.base_refs < 0 && !p.fresh) p.base_refs = InfoOf(b.bytenr()).refs;
  p.tree = true;
  p.level = b.level();
  p.set_flags |= kBlockFlagFullBackref;
  shared_info_[b.bytenr()].flags |= kBlockFlagFullBackref;
}

Status TxnManager::RetireCommitted(const tree::TreeBlock& b, uint64_t owner) {
  if (!any_shared_.load(std::memory_order_relaxed)) return Status::Ok();
  auto lock = AllocLock();
  const BlockInfo info = InfoOf(b.bytenr());
  const bool full = info.flags & kBlockFlagFullBackref;
  if (info.refs > 1) {
    if (b.header().owner.get() == owner && !full) {
      ReferenceChildrenByParent(b);
    } else {
      ChangeChildRefs(b, owner, +1);
    }
  } else if (full) {
    ChangeChildRefs(b, owner, +1);
    ChangeChildRefs(b, 0, -1);
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
