// Simple quotas (squota: the SIMPLE_QUOTA incompat flag and the status
// item's SIMPLE_MODE, kernel 6.7+), kept as the kernel keeps them
// (fs/btrfs/qgroup.c btrfs_record_squota_delta and its callers in
// extent-tree.c).
//
// Unlike full qgroups (qgroups.cc) nothing is found by walking back
// references: every extent is charged to one subvolume, its owner, once
// when its extent item is inserted and credited once when the item is
// deleted, whoever holds it in between (snapshots, reflinks). A qgroup's
// referenced and exclusive bytes are therefore both the sum of what it
// owns, in its own qgroup and every qgroup above it; the compressed fields
// are never touched.
//
// Who the owner is, and why:
// - a data extent: the tree of the reference that made it. The extent item
//   records it in an EXTENT_OWNER_REF, the first inline ref, because
//   reflinks and snapshots leave no other trace of it by the time the last
//   reference goes;
// - a tree block: its header owner (the tree that allocated it; a snapshot
//   copying a shared block owns the copy).
// Extents whose item generation is older than the status item's enable_gen
// were there before quotas were enabled: their deletion credits nobody.
// Snapshots and new subvolumes start at zero (only their own new blocks
// count) and join the higher-level qgroups of the subvolume whose directory
// holds them (the kernel's qgroup_auto_inherit).
#include <cstring>
#include <optional>

#include "format/ondisk.h"
#include "txn/extent_refs.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Status TxnManager::SquotaDelta(uint64_t root, uint64_t num_bytes, uint64_t generation, bool add) {
  if (!IsSubvolumeTree(root) || generation < quotas_->enable_gen) return Status::Ok();
  // A subvolume without a qgroup (its qgroup destroyed by hand) is charged
  // nowhere, as kernels since "btrfs: swallow btrfs_record_squota_delta()
  // ENOENT" (2026) do; older ones abort the transaction on a data extent.
  if (!quotas_->groups.count(root)) return Status::Ok();
  for (uint64_t id : QgroupsOf({root})) {
    Qgroup& g = quotas_->groups[id];
    // Unsigned wrap on a credit beyond the count, as the kernel's u64.
    g.rfer = add ? g.rfer + num_bytes : g.rfer - num_bytes;
    g.excl = add ? g.excl + num_bytes : g.excl - num_bytes;
    g.dirty = true;
  }
  return Status::Ok();
}

Result<uint64_t> TxnManager::NewDataOwner(const PendingExtent& p) {
  if (p.owner != 0) return p.owner;
  // Only a reference by parent leaf was queued: the leaf's tree made it.
  for (const auto& [r, delta] : p.refs) {
    if (delta <= 0) continue;
    if (r.type == kExtentDataRefKey) return r.a;
    if (r.type == kSharedDataRefKey) {
      UB_ASSIGN_OR_RETURN(tree::BlockRef leaf, dirty_->Read(tree::BlockCheck{r.a, 0, 0, {}}));
      return leaf->header().owner.get();
    }
  }
  return uint64_t{0};
}

Status TxnManager::SquotaExtentDeleted(uint64_t bytenr, bool tree, int level, uint64_t num_bytes,
                                       const std::vector<uint8_t>* item) {
  std::optional<std::vector<uint8_t>> looked_up;
  if (item == nullptr) {
    UB_ASSIGN_OR_RETURN(Volume::TreeRoot * ext, vol_->MutableRoot(kExtentTreeObjectid));
    const Key key{bytenr, kMetadataItemKey, static_cast<uint64_t>(level)};
    UB_ASSIGN_OR_RETURN(looked_up, tree::LookupItem(dirty_.get(), ext->ref, key));
    if (!looked_up) {  // a block from before skinny-metadata
      UB_ASSIGN_OR_RETURN(looked_up, tree::LookupItem(dirty_.get(), ext->ref, OldTreeBlockKey(bytenr)));
    }
    if (!looked_up) return Status::Corrupt("extent tree: no item " + KeyToString(key));
    item = &*looked_up;
  }
  if (item->size() < sizeof(ExtentItem)) return Status::Corrupt("extent tree: short item of " + std::to_string(bytenr));
  const uint64_t generation = reinterpret_cast<const ExtentItem*>(item->data())->generation.get();
  if (generation < quotas_->enable_gen) return Status::Ok();  // before quotas: read nothing more
  if (tree) {
    if (auto it = quotas_->new_blocks.find(bytenr); it != quotas_->new_blocks.end()) {
      const uint64_t owner = it->second;
      quotas_->new_blocks.erase(it);
      return SquotaDelta(owner, vol_->nodesize(), generation, false);
    }
    // A committed block: still on disk, freed space is reused only after
    // the commit.
    UB_ASSIGN_OR_RETURN(tree::BlockRef b, dirty_->Read(tree::BlockCheck{bytenr, level, 0, {}}));
    return SquotaDelta(b->header().owner.get(), vol_->nodesize(), generation, false);
  }
  const Key key{bytenr, kExtentItemKey, num_bytes};
  UB_ASSIGN_OR_RETURN(auto refs, ParseInlineRefs(*item, sizeof(ExtentItem), key));
  // No owner ref first: written with quotas off, nobody's.
  if (refs.empty() || refs.front().type != kExtentOwnerRefKey) return Status::Ok();
  return SquotaDelta(refs.front().offset, num_bytes, generation, false);
}

Status TxnManager::RemoveDroppedQgroups() {
  if (quotas_->dropped.empty()) return Status::Ok();
  auto dropped = std::move(quotas_->dropped);
  quotas_->dropped.clear();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kQuotaTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * root, vol_->MutableRoot(kQuotaTreeObjectid));
  for (uint64_t id : dropped) {
    auto it = quotas_->groups.find(id);
    if (it == quotas_->groups.end()) continue;
    const Qgroup& g = it->second;
    // Extents it owns outlive it in snapshots and reflinks: their deletion
    // must still find the qgroup to credit.
    if (g.rfer != 0 || g.excl != 0 || g.rfer_cmpr != 0 || g.excl_cmpr != 0) continue;
    std::vector<Key> keys = {Key{0, kQgroupInfoKey, id}, Key{0, kQgroupLimitKey, id}};
    for (uint64_t p : it->second.parents) {
      keys.push_back(Key{id, kQgroupRelationKey, p});
      keys.push_back(Key{p, kQgroupRelationKey, id});
    }
    for (const Key& k : keys) {
      UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(dirty_.get(), root->ref, k));
      if (have) UB_RETURN_IF_ERROR(w->Delete(k));
    }
    quotas_->groups.erase(it);
  }
  return Status::Ok();
}

Status TxnManager::NewSimpleQgroup(uint64_t root, uint64_t dir_root) {
  std::vector<uint64_t> parents;
  {
    auto lock = AllocLock();
    auto dir = quotas_->groups.find(dir_root);
    if (dir == quotas_->groups.end()) {
      return Status::Error(ENOENT, "simple quotas: subvolume " + std::to_string(dir_root) +
                                       ", which would hold the new one, has no qgroup");
    }
    parents = dir->second.parents;
    Qgroup& g = quotas_->groups[root];
    g = Qgroup{};
    g.dirty = true;
    g.parents = parents;
  }
  if (parents.empty()) return Status::Ok();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kQuotaTreeObjectid));
  for (uint64_t p : parents) {
    UB_RETURN_IF_ERROR(w->Insert(Key{root, kQgroupRelationKey, p}, std::vector<uint8_t>{}));
    UB_RETURN_IF_ERROR(w->Insert(Key{p, kQgroupRelationKey, root}, std::vector<uint8_t>{}));
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
