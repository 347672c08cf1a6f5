// The free space tree: checked against the extent tree at open, and built
// from it where an image has none (a v1 space cache, or no cache at all), as
// the kernel does when it mounts such an image with space_cache=v2. Its items
// are rewritten per block group at commit (block_groups.cc).
#include "txn/transaction.h"

#include <cstring>

#include "format/superblock.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

// Writing on top of a free space tree that disagrees with the extent tree
// would make things worse; refuse instead.
Status TxnManager::CheckFreeSpaceTree() {
  UB_ASSIGN_OR_RETURN(auto fst, vol_->FindRoot(kFreeSpaceTreeObjectid));
  const uint32_t ss = vol_->sectorsize();
  std::vector<std::pair<uint64_t, uint64_t>> on_disk;
  Cursor c(vol_->reader(), fst.ref);
  UB_RETURN_IF_ERROR(c.SeekFirst());
  for (; c.Valid();) {
    const Key k = c.key();
    // mkfs.btrfs 6.2 --rootdir leaves entries of block groups it removed
    // again; only groups that exist are compared.
    if (!space_->FindGroup(k.objectid)) {
      stale_fst_keys_.push_back(k);  // removed by the first commit (DropStaleFreeSpaceItems)
    } else if (k.type == kFreeSpaceExtentKey) {
      on_disk.push_back({k.objectid, k.offset});
    } else if (k.type == kFreeSpaceBitmapKey) {
      auto d = c.data();
      for (uint64_t bit = 0; bit < k.offset / ss; ++bit) {
        if (bit / 8 >= d.size()) return Status::Corrupt("free space bitmap " + KeyToString(k) + " is short");
        if (d[bit / 8] & (1u << (bit % 8))) on_disk.push_back({k.objectid + bit * ss, ss});
      }
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  // Merge adjacent ranges: the tree may split a free run across items.
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (auto& r : on_disk) {
    if (!merged.empty() && merged.back().first + merged.back().second == r.first) {
      merged.back().second += r.second;
    } else {
      merged.push_back(r);
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> ours;
  space_->ForEachGroup([&](const alloc::BlockGroup& g) {
    for (auto [s, l] : TreeFreeExtents(g)) {
      if (!ours.empty() && ours.back().first + ours.back().second == s) ours.back().second += l;
      else ours.push_back({s, l});
    }
  });
  if (merged != ours) {
    size_t i = 0;
    while (i < merged.size() && i < ours.size() && merged[i] == ours[i]) ++i;
    std::string where = i < merged.size() ? "free space tree says [" + std::to_string(merged[i].first) + ", +" +
                                                std::to_string(merged[i].second) + ")"
                                          : "free space tree ends early";
    std::string ours_s = i < ours.size() ? "extent tree implies [" + std::to_string(ours[i].first) + ", +" +
                                               std::to_string(ours[i].second) + ")"
                                         : "extent tree implies no more free space";
    return Status::Corrupt("free space tree disagrees with the extent tree: " + where + ", " + ours_s +
                           " (btrfs check --clear-space-cache v2 rebuilds it)");
  }
  return Status::Ok();
}

// mkfs.btrfs 6.2 leaves the free space entries of the temporary chunks it
// removes; the kernel ignores them, newer btrfs check reports them ("has no
// corresponding block group"). The first commit that writes removes them.
Status TxnManager::DropStaleFreeSpaceItems() {
  if (stale_fst_keys_.empty()) return Status::Ok();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kFreeSpaceTreeObjectid));
  for (const Key& k : stale_fst_keys_) UB_RETURN_IF_ERROR(w->Delete(k));
  stale_fst_keys_.clear();
  return Status::Ok();
}

Status TxnManager::DeleteFreeSpaceEntries(uint64_t start, uint64_t len) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kFreeSpaceTreeObjectid));
  std::vector<Key> keys;
  Cursor c(dirty_.get(), w->LiveRef());
  UB_RETURN_IF_ERROR(c.Seek(Key{start, 0, 0}));
  for (; c.Valid() && c.key().objectid < start + len;) {
    keys.push_back(c.key());
    UB_RETURN_IF_ERROR(c.Next());
  }
  for (const Key& k : keys) UB_RETURN_IF_ERROR(w->Delete(k));
  return Status::Ok();
}

// Space used is already known from the extent tree (LoadBlockGroups), so the
// tree follows from marking every group dirty: the commit writes each
// group's FREE_SPACE_INFO and extents. Whatever an invalid tree held goes
// first, as the kernel's clear does.
Status TxnManager::RebuildFreeSpaceTree() {
  const uint64_t ro = vol_->super().compat_ro_flags.get();
  if (vol_->FindRoot(kFreeSpaceTreeObjectid).ok()) {
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kFreeSpaceTreeObjectid));
    UB_ASSIGN_OR_RETURN(Volume::TreeRoot * root, vol_->MutableRoot(kFreeSpaceTreeObjectid));
    std::vector<Key> keys;
    Cursor c(dirty_.get(), root->ref);
    UB_RETURN_IF_ERROR(c.SeekFirst());
    while (c.Valid()) {
      keys.push_back(c.key());
      UB_RETURN_IF_ERROR(c.Next());
    }
    for (const Key& k : keys) UB_RETURN_IF_ERROR(w->Delete(k));
  } else {
    RootItem item{};
    item.refs = 1;
    UB_RETURN_IF_ERROR(CreateTree(kFreeSpaceTreeObjectid, item, 0).status());
  }
  space_->ForEachGroup([&](const alloc::BlockGroup& g) { dirty_groups_.insert(g.start()); });
  UB_ASSIGN_OR_RETURN(int v1_inodes, DropSpaceCacheV1());
  SuperBlock& sb = vol_->mutable_super();
  sb.compat_ro_flags = ro | kCompatRoFreeSpaceTree | kCompatRoFreeSpaceTreeValid;
  // The kernel's mark that no v1 cache is to be trusted.
  sb.cache_generation = 0;
  std::string why = (ro & kCompatRoFreeSpaceTree) ? "its free space tree was marked invalid"
                    : v1_inodes > 0 ? "it had the v1 space cache (" + std::to_string(v1_inodes) + " cache files)"
                                    : "it had no free space cache";
  vol_->AddWarning("built the free space tree from the extent tree (" + why +
                   (v1_inodes > 0 ? "; the v1 cache was dropped" : "") +
                   "), as the kernel does when mounting with space_cache=v2");
  return Status::Ok();
}

// The v1 cache is one hidden inode per block group in the root tree, found
// through a FREE_SPACE header item (objectid -11, offset = the group's
// start) whose location names the inode. Each inode's items go, and its
// data extents lose their reference by the root tree (freed at commit).
Result<int> TxnManager::DropSpaceCacheV1() {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, Writer(kRootTreeObjectid));
  const tree::RootPtr root = *vol_->mutable_root_tree();
  std::vector<std::pair<Key, uint64_t>> headers;  // header key, inode
  {
    Cursor c(dirty_.get(), root);
    UB_RETURN_IF_ERROR(c.Seek(Key{kFreeSpaceObjectid, 0, 0}));
    while (c.Valid() && c.key().objectid == kFreeSpaceObjectid) {
      if (c.key().type == 0) {
        if (c.data().size() < sizeof(DiskKey)) {
          return Status::Corrupt("free space cache header " + KeyToString(c.key()) + " is short");
        }
        Key loc = Key::From(*reinterpret_cast<const DiskKey*>(c.data().data()));
        if (loc.objectid < kFirstFreeObjectid || loc.objectid >= kFreeInoObjectid) {
          return Status::Corrupt("free space cache header " + KeyToString(c.key()) + " names inode " +
                                 std::to_string(loc.objectid));
        }
        headers.push_back({c.key(), loc.objectid});
      }
      UB_RETURN_IF_ERROR(c.Next());
    }
  }
  int inodes = 0;
  for (const auto& [hkey, ino] : headers) {
    std::vector<Key> keys;
    Cursor c(dirty_.get(), *vol_->mutable_root_tree());
    UB_RETURN_IF_ERROR(c.Seek(Key{ino, 0, 0}));
    while (c.Valid() && c.key().objectid == ino) {
      const Key k = c.key();
      keys.push_back(k);
      if (k.type == kExtentDataKey) {
        auto d = c.data();
        if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt("short file extent " + KeyToString(k));
        const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
        if (fe->type != kFileExtentInline) {
          if (d.size() < sizeof(FileExtentItem)) return Status::Corrupt("short file extent " + KeyToString(k));
          if (fe->disk_bytenr.get() != 0) {
            UB_RETURN_IF_ERROR(DropDataRef(fe->disk_bytenr.get(), fe->disk_num_bytes.get(), kRootTreeObjectid, ino,
                                           k.offset - fe->offset.get()));
          }
        }
      }
      UB_RETURN_IF_ERROR(c.Next());
    }
    for (const Key& k : keys) UB_RETURN_IF_ERROR(rootw->Delete(k));
    UB_RETURN_IF_ERROR(rootw->Delete(hkey));
    if (!keys.empty()) ++inodes;
  }
  return inodes;
}

}  // namespace ubtrfs::txn
