// Unused block groups: a data or metadata block group that a transaction
// leaves with nothing in it is deleted with its chunk in that
// transaction's commit, as the kernel's btrfs_delete_unused_bgs does (its
// cleaner, and once more at unmount). Without this, device space that once
// went to a chunk is never given back: a device that held a large file
// keeps its data chunks after the file is gone, and metadata (or a resize)
// cannot have that space.
//
// Kept, as the kernel keeps them: the last group of each type and profile
// (its space_info's list for that profile) and read-only ones (here: a
// seed device's; one being emptied by relocation, read-only meanwhile, goes
// as the kernel's relocation removes its group). Kept here besides: system
// groups (the superblock's chunk array would have to follow), mixed groups
// (an empty one serves data and metadata alike; one a balance empties goes),
// chunks made in the running transaction (an early
// metadata chunk for the reserve would otherwise come and go with every
// commit), chunks with a stripe on a missing device, metadata groups whose
// loss would leave less free metadata than twice the global reserve and a
// commit's worth of blocks (the kernel keeps a group that reservations may
// still count on), and a group whose items are not where the chunk map says.
//
// Crash safety. The group may hold space this very transaction freed
// (pinned): the last committed trees may still point there. Nothing is
// written to its device space before this commit's superblocks are on disk
// (ChunkAllocator::ReleaseRemoved), so a crash before that finds the
// committed state whole, and after it nothing refers to the group.
#include <algorithm>
#include <map>

#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Status TxnManager::DeleteUnusedGroups(bool* changed) {
  struct Candidate {
    uint64_t start, length, flags;
  };
  std::vector<Candidate> found;
  std::map<uint64_t, int> per_profile;  // groups by type and profile bits
  space_->ForEachGroup([&](const alloc::BlockGroup& g) {
    ++per_profile[g.flags()];
    const uint64_t kind = g.flags() & kBlockGroupTypeMask;
    const bool mixed = kind == (kBlockGroupData | kBlockGroupMetadata);
    if (kind != kBlockGroupData && kind != kBlockGroupMetadata && !(mixed && relocating_.contains(g.start()))) return;
    if ((g.read_only() && !relocating_.contains(g.start())) || g.used_bytes() != ExcludedIn(g.start())) return;
    found.push_back({g.start(), g.length(), g.flags()});
  });
  for (const Candidate& c : found) {
    if (per_profile[c.flags] <= 1) continue;
    const alloc::ChunkInfo* ci = vol_->chunks().Find(c.start);
    if (ci == nullptr || ci->logical != c.start || ci->length != c.length || !chunk_alloc_->Removable(*ci)) continue;
    // Deleting an earlier one copied tree blocks, which may have gone here.
    const auto g = space_->FindGroup(c.start);
    if (!g || g->used_bytes != ExcludedIn(c.start)) continue;
    // A group being relocated counts no free space already.
    if ((c.flags & kBlockGroupMetadata) && !relocating_.contains(c.start)) {
      const alloc::SpaceManager::Totals meta = space_->TotalsFor(kBlockGroupMetadata);
      // Not CommitReserve(): it counts the blocks this commit has dirtied
      // already, and a large deletion would then never give a group back.
      const uint64_t keep =
          2 * (ChunkAllocator::kCommitReserveBlocks * vol_->nodesize() +
               GlobalReserveBytes(chunk_alloc_->ReserveBase(meta.total_bytes - c.length), vol_->nodesize()));
      if (meta.free_bytes < g->free_bytes + keep) continue;
    }
    const alloc::ChunkInfo chunk = *ci;
    UB_ASSIGN_OR_RETURN(bool present, GroupItemsPresent(chunk));
    if (!present) continue;
    UB_RETURN_IF_ERROR(DeleteGroup(chunk).WithContext("deleting the unused " + alloc::SpaceManager::KindName(c.flags) +
                                                      " block group at " + std::to_string(c.start)));
    --per_profile[c.flags];
    *changed = true;
  }
  return Status::Ok();
}

// An image whose trees disagree with its chunk map here keeps the group
// (`ubtrfs check` names what is wrong) rather than failing the commit that
// would delete it.
Result<bool> TxnManager::GroupItemsPresent(const alloc::ChunkInfo& c) {
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * bg_root, vol_->MutableRoot(bg_tree_));
  UB_ASSIGN_OR_RETURN(auto bg, tree::LookupItem(dirty_.get(), bg_root->ref, Key{c.logical, kBlockGroupItemKey, c.length}));
  if (!bg) return false;
  UB_ASSIGN_OR_RETURN(auto chunk,
                      tree::LookupItem(dirty_.get(), vol_->chunk_tree(), Key{kFirstChunkTreeObjectid, kChunkItemKey, c.logical}));
  if (!chunk) return false;
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * dev_root, vol_->MutableRoot(kDevTreeObjectid));
  for (const alloc::StripeLoc& st : c.stripes) {
    UB_ASSIGN_OR_RETURN(auto de, tree::LookupItem(dirty_.get(), dev_root->ref, Key{st.devid, kDevExtentKey, st.physical}));
    if (!de || de->size() < sizeof(DevExtent) ||
        reinterpret_cast<const DevExtent*>(de->data())->chunk_offset.get() != c.logical) {
      return false;
    }
  }
  return true;
}

// The group leaves the space manager first, so that the tree changes below
// cannot allocate in it.
Status TxnManager::DeleteGroup(const alloc::ChunkInfo& c) {
  UB_RETURN_IF_ERROR(space_->RemoveGroup(c.logical, ExcludedIn(c.logical)));
  excluded_.erase(c.logical);
  std::erase_if(excluded_ranges_, [&](const auto& r) { return r.first >= c.logical && r.first < c.logical + c.length; });
  dirty_groups_.erase(c.logical);
  relocating_.erase(c.logical);
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * bgw, Writer(bg_tree_));
  UB_RETURN_IF_ERROR(bgw->Delete(Key{c.logical, kBlockGroupItemKey, c.length}).WithContext("block group item"));
  UB_RETURN_IF_ERROR(DeleteFreeSpaceEntries(c.logical, c.length));
  UB_RETURN_IF_ERROR(chunk_alloc_->RemoveChunk(c));
  return vol_->mutable_chunks()->RemoveChunk(c.logical);
}

Status TxnManager::SetRelocating(uint64_t start, bool on) {
  UB_RETURN_IF_ERROR(space_->SetReadOnly(start, on));
  if (on) {
    relocating_.insert(start);
  } else {
    relocating_.erase(start);
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
