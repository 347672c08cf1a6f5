// Dropping a whole tree (subvolume or snapshot deletion) as the kernel's
// btrfs_drop_snapshot does, in steps that survive a crash.
//
// A deleted tree is first made dead (MarkTreeDead): ROOT_ITEM refs 0 and the
// SUBVOL_DEAD flag, and an ORPHAN_ITEM in the root tree naming it, so that
// whoever opens the image next -- ubtrfs or the kernel -- finishes the drop.
// Each DropTreeStep then walks on from where the last one stopped, the place
// recorded in the ROOT_ITEM as the kernel records it: drop_progress is the
// key of the next pointer to drop in a node at drop_level. Everything left of
// the path that key leads to is dropped already; the nodes on that path are
// not (they go when the walk leaves them), so the key can always be found
// again. The last step removes the ROOT_ITEM and the orphan item. Each step
// is committed on its own; blocks freed by a step are only reused after its
// commit, by when the recorded path no longer leads to them.
//
// Blocks other trees still share follow the kernel's rules:
//   - a block with more than one reference keeps its other holders: only
//     the reference of the pointer that led here goes. When the dropped tree
//     owns it and references its children by tree, those references would
//     name a tree that is gone, so first every block the tree owns from
//     there down is turned to references by parent (FULL_BACKREF), as the
//     kernel's UPDATE_BACKREF stage does: the other holders later copy those
//     blocks as if they were anyone's. A block no newer than the tree's
//     creation (the ROOT_ITEM key's offset) cannot be the tree's own and is
//     not even read;
//   - a block with one reference is visited: its children (or, in a leaf,
//     the data extents of its file extent items) lose the reference this
//     block's pointers held, then the block itself is freed.
// The tree must be committed: every block is read from disk.
#include "format/ondisk.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

namespace {

DiskKey ToDiskKey(const Key& k) {
  DiskKey d{};
  d.objectid = k.objectid;
  d.type = k.type;
  d.offset = k.offset;
  return d;
}

std::span<const uint8_t> ItemBytes(const Volume::TreeRoot& r) {
  return std::span(reinterpret_cast<const uint8_t*>(&r.item), r.item_size);
}

}  // namespace

Status TxnManager::HandOverOwned(uint64_t root, uint64_t created, const tree::TreeBlock& b) {
  if (b.header().owner.get() != root) return Status::Ok();  // another tree's: its references do not name root
  if (!(InfoOf(b.bytenr()).flags & kBlockFlagFullBackref)) {
    ReferenceChildrenByParent(b);
    ChangeChildRefs(b, root, -1);
  }
  if (b.is_leaf()) return Status::Ok();
  for (int i = 0; i < b.nritems(); ++i) {
    if (b.child_generation(i) <= created) continue;
    if (b.level() == 1 && (InfoOf(b.child_bytenr(i)).flags & kBlockFlagFullBackref)) continue;
    UB_ASSIGN_OR_RETURN(tree::BlockRef c, dirty_->Read(tree::BlockCheck{b.child_bytenr(i), b.level() - 1,
                                                                        b.child_generation(i), {}}));
    UB_RETURN_IF_ERROR(HandOverOwned(root, created, *c));
  }
  return Status::Ok();
}

Status TxnManager::FreeDroppedBlock(uint64_t bytenr, int level, const RefId& via, uint64_t* freed) {
  ChangeCommittedRef(bytenr, level, via, -1);
  UB_RETURN_IF_ERROR(space_->Free(bytenr, vol_->nodesize()));
  MarkGroupDirty(bytenr);
  freed_blocks_.push_back(bytenr);
  ++*freed;
  return Status::Ok();
}

Status TxnManager::DropBlock(uint64_t root, uint64_t created, uint64_t bytenr, int level, uint64_t generation,
                             const RefId& via, uint64_t* freed) {
  BlockInfo info = InfoOf(bytenr);
  if (info.refs > 1 && generation <= created) {
    ChangeCommittedRef(bytenr, level, via, -1);
    return TraceDroppedSubtree(bytenr, level, generation);
  }
  UB_ASSIGN_OR_RETURN(tree::BlockRef b, dirty_->Read(tree::BlockCheck{bytenr, level, generation, {}}));
  if (b->generation() >= transid()) {
    return Status::Error(EIO, "internal: dropping tree " + std::to_string(root) + " with uncommitted block " +
                                  std::to_string(bytenr));
  }
  if (info.refs > 1) {
    UB_RETURN_IF_ERROR(HandOverOwned(root, created, *b));
    ChangeCommittedRef(bytenr, level, via, -1);
    return TraceDroppedSubtree(bytenr, level, generation);
  }
  const bool full = info.flags & kBlockFlagFullBackref;
  if (b->is_leaf()) {
    ChangeChildRefs(*b, full ? 0 : root, -1);
  } else {
    const RefId child_via = full ? RefId{kSharedBlockRefKey, bytenr} : RefId{kTreeBlockRefKey, root};
    for (int i = 0; i < b->nritems(); ++i) {
      UB_RETURN_IF_ERROR(
          DropBlock(root, created, b->child_bytenr(i), level - 1, b->child_generation(i), child_via, freed));
    }
  }
  return FreeDroppedBlock(bytenr, level, via, freed);
}

Status TxnManager::MarkTreeDead(uint64_t root) {
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * r, vol_->MutableRoot(root));
  if (r->ref.generation >= transid()) {
    return Status::Error(EIO, "internal: dropping tree " + std::to_string(root) + " with uncommitted changes");
  }
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, Writer(kRootTreeObjectid));
  {
    std::lock_guard lock(vol_->roots_mutex());
    r->item.refs = 0;
    r->item.flags = r->item.flags.get() | kRootSubvolDead;
    r->item.drop_progress = DiskKey{};
    r->item.drop_level = 0;
    r->deleted = true;
  }
  UB_RETURN_IF_ERROR(rootw->Update(r->item_key, ItemBytes(*r)).WithContext("root item of tree " + std::to_string(root)));
  return rootw->Insert(OrphanKey(root), {});
}

Result<std::vector<uint64_t>> TxnManager::DeadTrees() {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, Writer(kRootTreeObjectid));
  std::vector<uint64_t> out;
  tree::Cursor c(dirty_.get(), rootw->LiveRef());
  UB_RETURN_IF_ERROR(c.Seek(OrphanKey(0)));
  for (; c.Valid() && c.key().objectid == kOrphanObjectid && c.key().type == kOrphanItemKey;) {
    out.push_back(c.key().offset);
    UB_RETURN_IF_ERROR(c.Next());
  }
  return out;
}

Result<bool> TxnManager::DropTreeStep(uint64_t root, uint64_t max_blocks, uint64_t* freed) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, Writer(kRootTreeObjectid));
  auto r_or = vol_->MutableRoot(root, /*even_deleted=*/true);
  if (!r_or.ok() || r_or.value()->item.refs.get() != 0) {
    // An orphan item whose tree is gone (or alive again): nothing to drop.
    UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(dirty_.get(), rootw->LiveRef(), OrphanKey(root)));
    if (have) UB_RETURN_IF_ERROR(rootw->Delete(OrphanKey(root)));
    if (r_or.ok()) return Status::Corrupt("tree " + std::to_string(root) + " has an orphan item but is referenced");
    return true;
  }
  Volume::TreeRoot* r = *r_or;
  const std::string what = "dropping tree " + std::to_string(root);
  const uint64_t created = r->item_key.offset;
  auto lock = AllocLock();
  struct Frame {
    tree::BlockRef b;
    int slot;
  };
  std::vector<Frame> path;
  UB_ASSIGN_OR_RETURN(tree::BlockRef top, dirty_->Read(tree::BlockCheck{r->ref.bytenr, r->ref.level, r->ref.generation, {}}));
  if (top->generation() >= transid()) return Status::Error(EIO, "internal: " + what + " with uncommitted changes");
  const RefId root_via{kTreeBlockRefKey, root};
  auto via_of = [&](const tree::TreeBlock& parent) {
    return (InfoOf(parent.bytenr()).flags & kBlockFlagFullBackref) ? RefId{kSharedBlockRefKey, parent.bytenr()}
                                                                     : root_via;
  };
  if (top->is_leaf()) {
    UB_RETURN_IF_ERROR(DropBlock(root, created, top->bytenr(), 0, top->generation(), root_via, freed));
  } else {
    const Key progress = Key::From(r->item.drop_progress);
    const int drop_level = r->item.drop_level;
    if (progress.objectid == 0 && progress.type == 0 && progress.offset == 0) {
      path.push_back({top, 0});
    } else {
      if (drop_level < 1 || drop_level > top->level()) {
        return Status::Corrupt(what + ": drop_level " + std::to_string(drop_level) + " in a tree of level " +
                               std::to_string(top->level()));
      }
      tree::BlockRef b = top;
      for (;;) {
        const int s = std::max(0, b->LastSlotAtOrBefore(progress));
        path.push_back({b, s});
        if (b->level() == drop_level) break;
        if (InfoOf(b->child_bytenr(s)).refs != 1) {
          return Status::Corrupt(what + ": the block on the drop_progress path at level " +
                                 std::to_string(b->level() - 1) + " is shared");
        }
        UB_ASSIGN_OR_RETURN(b, dirty_->Read(tree::BlockCheck{b->child_bytenr(s), b->level() - 1,
                                                             b->child_generation(s), {}}));
      }
    }
    const uint64_t start = *freed;
    while (!path.empty()) {
      Frame& f = path.back();
      if (f.slot >= f.b->nritems()) {
        const RefId via = path.size() == 1 ? root_via : via_of(*path[path.size() - 2].b);
        UB_RETURN_IF_ERROR(FreeDroppedBlock(f.b->bytenr(), f.b->level(), via, freed));
        path.pop_back();
        if (!path.empty()) ++path.back().slot;
        continue;
      }
      if (*freed - start >= max_blocks) break;
      const uint64_t child = f.b->child_bytenr(f.slot), gen = f.b->child_generation(f.slot);
      if (f.b->level() == 1 || InfoOf(child).refs != 1) {
        UB_RETURN_IF_ERROR(DropBlock(root, created, child, f.b->level() - 1, gen, via_of(*f.b), freed));
        ++f.slot;
        continue;
      }
      UB_ASSIGN_OR_RETURN(tree::BlockRef c, dirty_->Read(tree::BlockCheck{child, f.b->level() - 1, gen, {}}));
      path.push_back({c, 0});
    }
  }
  if (!path.empty()) {
    const Frame& f = path.back();
    {
      std::lock_guard roots(vol_->roots_mutex());
      r->item.drop_progress = ToDiskKey(f.b->key(f.slot));
      r->item.drop_level = static_cast<uint8_t>(f.b->level());
    }
    UB_RETURN_IF_ERROR(rootw->Update(r->item_key, ItemBytes(*r)).WithContext(what));
    return false;
  }
  UB_RETURN_IF_ERROR(rootw->Delete(r->item_key).WithContext("root item of tree " + std::to_string(root)));
  UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(dirty_.get(), rootw->LiveRef(), OrphanKey(root)));
  if (have) UB_RETURN_IF_ERROR(rootw->Delete(OrphanKey(root)));
  if (simple_quotas()) quotas_->dropped.push_back(root);
  return true;
}

}  // namespace ubtrfs::txn
