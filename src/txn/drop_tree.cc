// Dropping a whole tree (subvolume or snapshot deletion), with the kernel's
// rules of btrfs_drop_snapshot for blocks other trees still share:
//   - a block with more than one reference keeps its other holders: only
//     the reference of the pointer that led here goes, and nothing below it
//     is visited; when the dropped tree owned it and referenced its children
//     by tree, the children are first given references by parent (the block
//     turns FULL_BACKREF), since the tree those references name goes away;
//   - a block with one reference is visited: its children (or, in a leaf,
//     the data extents of its file extent items) lose the reference this
//     block's pointers held, then the block itself is freed.
// The tree must be committed: every block is read from disk. The whole drop
// is one transaction, so a crash leaves the subvolume either whole or gone.
#include "format/ondisk.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Status TxnManager::DropBlock(uint64_t root, uint64_t bytenr, int level, uint64_t generation, const RefId& via,
                             uint64_t* freed) {
  UB_ASSIGN_OR_RETURN(tree::BlockRef b, dirty_->Read(tree::BlockCheck{bytenr, level, generation, {}}));
  if (b->generation() >= transid()) {
    return Status::Error(EIO, "internal: dropping tree " + std::to_string(root) + " with uncommitted block " +
                                  std::to_string(bytenr));
  }
  const BlockInfo info = InfoOf(bytenr);
  const bool full = info.flags & kBlockFlagFullBackref;
  if (info.refs > 1) {
    if (b->header().owner.get() == root && !full) {
      ReferenceChildrenByParent(*b);
      ChangeChildRefs(*b, root, -1);
    }
    ChangeCommittedRef(bytenr, level, via, -1);
    return Status::Ok();
  }
  if (b->is_leaf()) {
    ChangeChildRefs(*b, full ? 0 : root, -1);
  } else {
    const RefId child_via = full ? RefId{kSharedBlockRefKey, bytenr} : RefId{kTreeBlockRefKey, root};
    for (int i = 0; i < b->nritems(); ++i) {
      UB_RETURN_IF_ERROR(DropBlock(root, b->child_bytenr(i), level - 1, b->child_generation(i), child_via, freed));
    }
  }
  ChangeCommittedRef(bytenr, level, via, -1);
  UB_RETURN_IF_ERROR(space_->Free(bytenr, vol_->nodesize()));
  MarkGroupDirty(bytenr);
  freed_blocks_.push_back(bytenr);
  ++*freed;
  return Status::Ok();
}

Result<uint64_t> TxnManager::DropTree(uint64_t root) {
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * r, vol_->MutableRoot(root));
  if (r->ref.generation >= transid()) {
    return Status::Error(EIO, "internal: dropping tree " + std::to_string(root) + " with uncommitted changes");
  }
  uint64_t freed = 0;
  {
    auto lock = AllocLock();
    UB_RETURN_IF_ERROR(DropBlock(root, r->ref.bytenr, r->ref.level, r->ref.generation,
                                 RefId{kTreeBlockRefKey, root}, &freed));
  }
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, Writer(kRootTreeObjectid));
  UB_RETURN_IF_ERROR(rootw->Delete(r->item_key).WithContext("root item of tree " + std::to_string(root)));
  std::lock_guard lock(vol_->roots_mutex());
  r->deleted = true;
  return freed;
}

}  // namespace ubtrfs::txn
