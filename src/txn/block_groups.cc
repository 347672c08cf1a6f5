// Block groups: loading them (and the space they use) at open, the 64 KiB
// stripes that hold superblock copies, and rewriting block group items and
// the free space tree at commit for the groups whose space changed. Block
// group items live in the extent tree, or in the block group tree where the
// image has the block-group-tree feature (mkfs.btrfs's default since 6.19).
#include "txn/transaction.h"

#include <algorithm>
#include <cstring>

#include "format/superblock.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

namespace {

std::vector<uint8_t> Bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

}  // namespace

Status TxnManager::LoadBlockGroups() {
  for (const auto& [logical, c] : vol_->chunks().chunks()) {
    UB_RETURN_IF_ERROR(space_->AddGroup(logical, c.length, c.type & (kBlockGroupTypeMask | kBlockGroupProfileMask)));
    for (const alloc::StripeLoc& st : c.stripes) {
      if (vol_->IsSeedDevice(st.devid)) {
        UB_RETURN_IF_ERROR(space_->SetReadOnly(logical));
        break;
      }
    }
  }
  UB_RETURN_IF_ERROR(ExcludeSuperStripes());
  UB_ASSIGN_OR_RETURN(auto extent, vol_->FindRoot(kExtentTreeObjectid));
  const uint32_t nodesize = vol_->nodesize();
  std::set<uint64_t> groups_seen;
  Cursor c(vol_->reader(), extent.ref);
  UB_RETURN_IF_ERROR(c.SeekFirst());
  for (; c.Valid();) {
    const Key k = c.key();
    auto d = c.data();
    if (k.type == kExtentItemKey || k.type == kMetadataItemKey) {
      if (d.size() < sizeof(ExtentItem)) return Status::Corrupt("extent tree: short item " + KeyToString(k));
      const auto* ei = reinterpret_cast<const ExtentItem*>(d.data());
      const bool tree_block = ei->flags.get() & kExtentFlagTreeBlock;
      if (tree_block) UB_RETURN_IF_ERROR(NoteExtentItemForCow(k, ei->refs.get(), ei->flags.get()));
      const uint64_t len = k.type == kMetadataItemKey ? nodesize : k.offset;
      if (tree_block && k.type == kExtentItemKey && len != nodesize) {
        return Status::Corrupt("extent tree: tree block item " + KeyToString(k) + " is not one node long");
      }
      UB_RETURN_IF_ERROR(space_->MarkUsed(k.objectid, len).WithContext("extent tree item " + KeyToString(k)));
    } else if (k.type == kTreeBlockRefKey || k.type == kSharedBlockRefKey) {
      tree_ref_items_[k.objectid].push_back(k);  // a tree block's reference as an item of its own
    } else if (k.type == kBlockGroupItemKey && bg_tree_ == kExtentTreeObjectid) {
      UB_RETURN_IF_ERROR(NoteBlockGroupItem(k, &groups_seen));
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  if (bg_tree_ != kExtentTreeObjectid) {
    UB_ASSIGN_OR_RETURN(auto bgt, vol_->FindRoot(bg_tree_));
    Cursor b(vol_->reader(), bgt.ref);
    UB_RETURN_IF_ERROR(b.SeekFirst());
    while (b.Valid()) {
      if (b.key().type != kBlockGroupItemKey) {
        return Status::Corrupt("block group tree: unexpected item " + KeyToString(b.key()));
      }
      UB_RETURN_IF_ERROR(NoteBlockGroupItem(b.key(), &groups_seen));
      UB_RETURN_IF_ERROR(b.Next());
    }
  }
  if (groups_seen.size() != vol_->chunks().chunks().size()) {
    return Status::Corrupt(std::string(bg_tree_ == kExtentTreeObjectid ? "extent tree" : "block group tree") +
                           " has " + std::to_string(groups_seen.size()) + " block groups for " +
                           std::to_string(vol_->chunks().chunks().size()) + " chunks");
  }
  return Status::Ok();
}

Status TxnManager::NoteBlockGroupItem(const Key& k, std::set<uint64_t>* seen) {
  const alloc::ChunkInfo* ci = vol_->chunks().Find(k.objectid);
  if (!ci || ci->logical != k.objectid || ci->length != k.offset) {
    return Status::Corrupt("block group " + KeyToString(k) + " has no matching chunk");
  }
  if (!seen->insert(k.objectid).second) return Status::Corrupt("block group " + KeyToString(k) + " listed twice");
  return Status::Ok();
}

// The kernel never allocates the 64 KiB stripe of a chunk that holds a
// superblock copy; neither may we, and those bytes are neither free (free
// space tree) nor used (block group items).
Status TxnManager::ExcludeSuperStripes() {
  std::set<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [logical, c] : vol_->chunks().chunks()) {
    for (auto r : alloc::SuperblockRanges(c)) ranges.insert(r);
  }
  for (const auto& [start, len] : ranges) {
    UB_RETURN_IF_ERROR(space_->MarkUsed(start, len).WithContext("superblock stripe"));
    auto g = space_->FindGroup(start);
    excluded_[g->start] += len;
    excluded_ranges_.push_back({start, len});
  }
  return Status::Ok();
}

// Free extents as the free space tree records them: the bitmap's free space
// (pinned counts: it is free once this transaction commits) plus the
// superblock stripes, which the kernel also lists as free and only skips in
// memory when it loads the tree.
std::vector<std::pair<uint64_t, uint64_t>> TxnManager::TreeFreeExtents(const alloc::BlockGroup& g) const {
  std::vector<std::pair<uint64_t, uint64_t>> raw;
  g.ForEachFreeExtent([&](uint64_t s, uint64_t l) { raw.push_back({s, l}); });
  for (auto [s, l] : excluded_ranges_) {
    if (g.Contains(s)) raw.push_back({s, l});
  }
  std::sort(raw.begin(), raw.end());
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (auto [s, l] : raw) {
    if (!out.empty() && out.back().first + out.back().second >= s) {
      out.back().second = std::max(out.back().first + out.back().second, s + l) - out.back().first;
    } else {
      out.push_back({s, l});
    }
  }
  return out;
}

uint64_t TxnManager::ExcludedIn(uint64_t group_start) const {
  auto it = excluded_.find(group_start);
  return it == excluded_.end() ? 0 : it->second;
}
Status TxnManager::UpdateBlockGroups(bool* changed) {
  auto groups = std::move(dirty_groups_);
  dirty_groups_.clear();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * bgw, Writer(bg_tree_));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * fstw, Writer(kFreeSpaceTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * bg_root, vol_->MutableRoot(bg_tree_));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * fst_root, vol_->MutableRoot(kFreeSpaceTreeObjectid));
  for (uint64_t start : groups) {
    auto g = space_->FindGroup(start);
    if (!g) continue;
    // Block group item: bytes used, superblock stripes not counted.
    const Key bg_key{start, kBlockGroupItemKey, g->length};
    UB_ASSIGN_OR_RETURN(auto bg_item, tree::LookupItem(dirty_.get(), bg_root->ref, bg_key));
    if (!bg_item || bg_item->size() < sizeof(BlockGroupItem)) {
      return Status::Corrupt("block group item " + KeyToString(bg_key) + " missing");
    }
    auto* bgi = reinterpret_cast<BlockGroupItem*>(bg_item->data());
    const uint64_t used = g->used_bytes - ExcludedIn(start);
    if (bgi->used.get() != used) {
      bgi->used = used;
      UB_RETURN_IF_ERROR(bgw->Update(bg_key, *bg_item));
      *changed = true;
    }
    // Free space tree: the group's free extents as they will be once this
    // transaction is committed (pinned space is free then).
    std::vector<std::pair<Key, std::vector<uint8_t>>> want;
    std::vector<std::pair<uint64_t, uint64_t>> extents;
    space_->ForEachGroup([&](const alloc::BlockGroup& bg) {
      if (bg.start() == start) extents = TreeFreeExtents(bg);
    });
    FreeSpaceInfo info{};
    info.extent_count = static_cast<uint32_t>(extents.size());
    info.flags = 0;
    want.push_back({Key{start, kFreeSpaceInfoKey, g->length}, Bytes(&info, sizeof info)});
    for (auto [s, l] : extents) want.push_back({Key{s, kFreeSpaceExtentKey, l}, {}});
    std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    // Compare with what is there; rewrite only on a difference, so that the
    // commit loop settles.
    std::vector<std::pair<Key, std::vector<uint8_t>>> have;
    Cursor c(dirty_.get(), fst_root->ref);
    UB_RETURN_IF_ERROR(c.Seek(Key{start, 0, 0}));
    for (; c.Valid() && c.key().objectid < start + g->length;) {
      have.push_back({c.key(), std::vector<uint8_t>(c.data().begin(), c.data().end())});
      UB_RETURN_IF_ERROR(c.Next());
    }
    if (have == want) continue;
    *changed = true;
    // Change only the entries that differ. Deleting and reinserting them all
    // merges and splits leaves anew every round (new blocks each time, as
    // blocks freed in a transaction stay pinned), so a group with more free
    // extents than a leaf holds would never let the commit loop settle.
    const std::map<Key, std::vector<uint8_t>> have_map(have.begin(), have.end()), want_map(want.begin(), want.end());
    for (auto& [k, d] : have) {
      if (!want_map.count(k)) UB_RETURN_IF_ERROR(fstw->Delete(k));
    }
    for (auto& [k, d] : want) {
      auto h = have_map.find(k);
      if (h == have_map.end()) {
        UB_RETURN_IF_ERROR(fstw->Insert(k, d));
      } else if (h->second != d) {
        UB_RETURN_IF_ERROR(fstw->Update(k, d));
      }
    }
  }
  return Status::Ok();
}
}  // namespace ubtrfs::txn
