#include "txn/transaction.h"

#include "stats/stats.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <thread>

#include "format/checksum.h"
#include "format/superblock.h"
#include "txn/chunk_alloc.h"
#include "txn/extent_refs.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

namespace {

constexpr uint64_t kStripeLen = 64 * 1024;
constexpr int kMaxCommitLoops = 64;

std::vector<uint8_t> Bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

}  // namespace

TxnManager::~TxnManager() {
  if (vol_ && vol_->source() == dirty_.get()) vol_->SetSource(nullptr);
  if (vol_) vol_->SetLiveRoots(nullptr);
}

Result<std::unique_ptr<TxnManager>> TxnManager::Open(Volume* vol, bool allow_log) {
  std::unique_ptr<TxnManager> t(new TxnManager(vol));
  UB_RETURN_IF_ERROR(t->Load(allow_log));
  return t;
}

Status TxnManager::Load(bool allow_log) {
  const SuperBlock& sb = vol_->super();
  if (!vol_->writable()) return Status::Error(EROFS, "the image was opened read-only");
  const uint64_t incompat = sb.incompat_flags.get(), ro = sb.compat_ro_flags.get();
  if (!(incompat & kIncompatSkinnyMetadata)) {
    return Status::Unsupported("writing needs skinny-metadata (the mkfs.btrfs default)");
  }
  if (incompat & (kIncompatMixedGroups | kIncompatRaid56 | kIncompatRaid1c34 | kIncompatSimpleQuota)) {
    return Status::Unsupported("writing to an image with features " + IncompatNames(incompat & (kIncompatMixedGroups | kIncompatRaid56 | kIncompatRaid1c34 | kIncompatSimpleQuota)));
  }
  if (!(ro & kCompatRoFreeSpaceTree) || !(ro & kCompatRoFreeSpaceTreeValid)) {
    return Status::Unsupported("writing needs the free space tree (the mkfs.btrfs default since 5.15)");
  }
  if (uint64_t extra = ro & ~(kCompatRoFreeSpaceTree | kCompatRoFreeSpaceTreeValid)) {
    return Status::Unsupported("writing to an image with read-only-compatible features " + CompatRoNames(extra));
  }
  if (sb.log_root.get() != 0 && !allow_log) {
    return Status::Unsupported("writing to an image with an unreplayed tree log");
  }
  if (sb.flags.get() & kSuperFlagError) return Status::Unsupported("writing to an image the kernel marked as damaged");
  if (auto q = vol_->FindRoot(kQuotaTreeObjectid); q.ok()) {
    return Status::Unsupported("writing to an image with quotas enabled");
  }

  space_ = std::make_unique<alloc::SpaceManager>(vol_->sectorsize());
  tree::HeaderTemplate tmpl;
  std::memcpy(tmpl.fsid, MetadataFsid(sb), kFsidSize);
  UB_ASSIGN_OR_RETURN(tree::BlockRef chunk_root,
                      vol_->reader()->Read(tree::BlockCheck{vol_->chunk_tree().bytenr, vol_->chunk_tree().level,
                                                            vol_->chunk_tree().generation, {}}));
  std::memcpy(tmpl.chunk_tree_uuid, chunk_root->header().chunk_tree_uuid, kUuidSize);
  dirty_ = std::make_unique<tree::DirtyBlocks>(vol_->reader(), vol_->reader()->params(), tmpl, this,
                                               sb.generation.get() + 1);
  UB_RETURN_IF_ERROR(LoadBlockGroups());
  chunk_alloc_ = std::make_unique<ChunkAllocator>(this);
  UB_RETURN_IF_ERROR(chunk_alloc_->Load());
  space_->set_new_chunk_hook([this](uint64_t kind, uint64_t min_len) { return chunk_alloc_->NewChunk(kind, min_len); });
  vol_->SetSource(dirty_.get());
  // Checksum lookups follow the csum tree's writer (writes add checksums
  // from other threads).
  vol_->SetLiveRoots([this](uint64_t objectid) -> Result<tree::RootPtr> {
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(objectid));
    return w->LiveRef();
  });
  return Status::Ok();
}

Status TxnManager::LoadBlockGroups() {
  for (const auto& [logical, c] : vol_->chunks().chunks()) {
    UB_RETURN_IF_ERROR(space_->AddGroup(logical, c.length, c.type & (kBlockGroupTypeMask | kBlockGroupProfileMask)));
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
      if (tree_block && k.type == kExtentItemKey) {
        return Status::Unsupported("writing to an image without skinny tree block references");
      }
      if (tree_block) UB_RETURN_IF_ERROR(NoteExtentItemForCow(k, ei->refs.get(), ei->flags.get()));
      const uint64_t len = k.type == kMetadataItemKey ? nodesize : k.offset;
      UB_RETURN_IF_ERROR(space_->MarkUsed(k.objectid, len).WithContext("extent tree item " + KeyToString(k)));
    } else if (k.type == kTreeBlockRefKey || k.type == kSharedBlockRefKey) {
      tree_ref_items_[k.objectid].push_back(k);  // a tree block's reference as an item of its own
    } else if (k.type == kBlockGroupItemKey) {
      const alloc::ChunkInfo* ci = vol_->chunks().Find(k.objectid);
      if (!ci || ci->logical != k.objectid || ci->length != k.offset) {
        return Status::Corrupt("block group " + KeyToString(k) + " has no matching chunk");
      }
      groups_seen.insert(k.objectid);
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  if (groups_seen.size() != vol_->chunks().chunks().size()) {
    return Status::Corrupt("extent tree has " + std::to_string(groups_seen.size()) + " block groups for " +
                           std::to_string(vol_->chunks().chunks().size()) + " chunks");
  }
  return CheckFreeSpaceTree();
}

// The kernel never allocates the 64 KiB stripe of a chunk that holds a
// superblock copy; neither may we, and those bytes are neither free (free
// space tree) nor used (block group items).
Status TxnManager::ExcludeSuperStripes() {
  std::set<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [logical, c] : vol_->chunks().chunks()) {
    for (uint64_t phys : c.physical) {
      for (int m = 0; m < kSuperMirrorMax; ++m) {
        const uint64_t sb = SuperblockOffset(m);
        if (sb < phys || sb >= phys + c.length) continue;
        const uint64_t start = logical + (sb - phys) / kStripeLen * kStripeLen;
        ranges.insert({start, std::min(kStripeLen, logical + c.length - start)});
      }
    }
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
      // not a block group of this filesystem
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

Result<tree::TreeWriter*> TxnManager::Writer(uint64_t objectid) {
  auto lock = AllocLock();
  auto it = writers_.find(objectid);
  if (it != writers_.end()) return it->second.get();
  tree::RootPtr* root;
  std::mutex* copy_mu = nullptr;
  if (objectid == kRootTreeObjectid) {
    root = vol_->mutable_root_tree();
  } else if (objectid == kChunkTreeObjectid) {
    root = vol_->mutable_chunk_tree();  // no ROOT_ITEM: the superblock points at it
  } else {
    UB_ASSIGN_OR_RETURN(Volume::TreeRoot * r, vol_->MutableRoot(objectid));
    root = &r->ref;
    copy_mu = &vol_->roots_mutex();  // FindRoot copies the entry under it
  }
  auto w = std::make_unique<tree::TreeWriter>(dirty_.get(), root, objectid, copy_mu);
  auto* raw = w.get();
  writers_.emplace(objectid, std::move(w));
  return raw;
}

void TxnManager::MarkGroupDirty(uint64_t logical) {
  if (auto g = space_->FindGroup(logical)) dirty_groups_.insert(g->start);
}

Result<uint64_t> TxnManager::AllocTreeBlock(uint64_t owner, int level) {
  auto lock = AllocLock();
  const uint64_t kind = owner == kChunkTreeObjectid ? kBlockGroupSystem : kBlockGroupMetadata;
  if (kind == kBlockGroupMetadata) UB_RETURN_IF_ERROR(chunk_alloc_->BeforeMetadataBlock());  // commit reserve
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, space_->Allocate(kind, vol_->nodesize(), vol_->nodesize()));
  if (kind == kBlockGroupMetadata) chunk_alloc_->NoteMetadataAlloc();
  MarkGroupDirty(bytenr);
  PendingExtent& p = pending_[bytenr];
  p.fresh = true;
  QueueRef(bytenr, true, static_cast<uint64_t>(level), RefId{kTreeBlockRefKey, owner}, +1);
  return bytenr;
}

// The tree `owner` lets go of the block: its TREE_BLOCK_REF goes (see
// shared_cow.cc for why it is always that one), and the space with it when
// no other tree holds the block.
Status TxnManager::FreeTreeBlock(uint64_t bytenr, uint64_t owner, int level, bool created_here) {
  auto lock = AllocLock();
  const RefId r{kTreeBlockRefKey, owner};
  if (created_here) {
    QueueRef(bytenr, true, static_cast<uint64_t>(level), r, -1);
  } else {
    const BlockInfo before = InfoOf(bytenr);
    ChangeCommittedRef(bytenr, level, r, -1);
    if (before.refs > 1) return Status::Ok();  // still in another tree
  }
  UB_RETURN_IF_ERROR(space_->Free(bytenr, vol_->nodesize()));
  MarkGroupDirty(bytenr);
  freed_blocks_.push_back(bytenr);
  return Status::Ok();
}

bool TxnManager::HasChanges() {
  auto lock = AllocLock();
  return dirty_->count() > 0 || !pending_.empty() || !new_data_.empty();
}

Result<uint64_t> TxnManager::AllocData(uint64_t len) {
  auto lock = AllocLock();
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, space_->Allocate(kBlockGroupData, len, vol_->sectorsize()));
  MarkGroupDirty(bytenr);
  new_data_[bytenr] = len;
  return bytenr;
}

Status TxnManager::WriteData(uint64_t logical, std::span<const uint8_t> data, bool csum) {
  const uint32_t ss = vol_->sectorsize();
  if (logical % ss || data.size() % ss) return Status::Invalid("unaligned data write");
  UB_ASSIGN_OR_RETURN(auto copies, vol_->chunks().Map(logical, data.size()));
  for (uint64_t phys : copies) UB_RETURN_IF_ERROR(vol_->device()->WriteAt(phys, data));
  {
    auto lock = AllocLock();
    stats_.data_bytes_written += data.size();
  }
  if (!csum) return Status::Ok();
  const size_t csize = CsumSize(vol_->csum_type());
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kCsumTreeObjectid));
  const size_t per_item = std::min<size_t>(w->MaxItemSize() / csize, 1024);
  const size_t sectors = data.size() / ss;
  for (size_t first = 0; first < sectors; first += per_item) {
    const size_t n = std::min(per_item, sectors - first);
    std::vector<uint8_t> sums(n * csize);
    for (size_t i = 0; i < n; ++i) {
      CsumBytes c = ComputeCsum(vol_->csum_type(), data.subspan((first + i) * ss, ss));
      std::memcpy(sums.data() + i * csize, c.data(), csize);
    }
    UB_RETURN_IF_ERROR(w->Insert(Key{kExtentCsumObjectid, kExtentCsumKey, logical + first * ss}, sums));
  }
  return Status::Ok();
}

Status TxnManager::AddDataRef(uint64_t bytenr, uint64_t num_bytes, uint64_t root, uint64_t ino, uint64_t offset) {
  auto lock = AllocLock();
  QueueRef(bytenr, false, num_bytes, RefId{kExtentDataRefKey, root, ino, offset}, +1);
  return Status::Ok();
}

Status TxnManager::DropDataRef(uint64_t bytenr, uint64_t num_bytes, uint64_t root, uint64_t ino, uint64_t offset) {
  auto lock = AllocLock();
  QueueRef(bytenr, false, num_bytes, RefId{kExtentDataRefKey, root, ino, offset}, -1);
  return Status::Ok();
}

Status TxnManager::PinLogBlock(uint64_t bytenr) {
  auto lock = AllocLock();
  const std::string where = "tree log block " + std::to_string(bytenr);
  UB_RETURN_IF_ERROR(space_->MarkUsed(bytenr, vol_->nodesize())
                         .WithContext(where + " lies in space the extent tree has in use"));
  // Freed in this transaction: pinned (not allocatable) until the commit.
  UB_RETURN_IF_ERROR(space_->Free(bytenr, vol_->nodesize()).WithContext(where));
  MarkGroupDirty(bytenr);
  freed_blocks_.push_back(bytenr);  // its cached copy is stale once the space is reused
  return Status::Ok();
}

Result<bool> TxnManager::AdoptLoggedExtent(uint64_t bytenr, uint64_t num_bytes) {
  auto lock = AllocLock();
  const std::string where = "tree log: data extent " + std::to_string(bytenr) + " (" + std::to_string(num_bytes) +
                            " bytes)";
  const uint32_t ss = vol_->sectorsize();
  if (bytenr == 0 || num_bytes == 0 || bytenr % ss || num_bytes % ss || num_bytes > (128ull << 20)) {
    return Status::Corrupt(where + ": not a valid data extent");
  }
  if (auto it = new_data_.find(bytenr); it != new_data_.end()) {
    if (it->second != num_bytes) return Status::Corrupt(where + ": logged with two lengths");
    return true;
  }
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * ext_root, vol_->MutableRoot(kExtentTreeObjectid));
  Cursor c(dirty_.get(), ext_root->ref);
  UB_RETURN_IF_ERROR(c.Seek(Key{bytenr, kExtentItemKey, 0}));
  if (c.Valid() && c.key().objectid == bytenr && c.key().type == kExtentItemKey) {
    if (c.key().offset != num_bytes) {
      return Status::Corrupt(where + ": the extent tree has " + KeyToString(c.key()));
    }
    return false;
  }
  const alloc::ChunkInfo* ci = vol_->chunks().Find(bytenr);
  if (!ci || !(ci->type & kBlockGroupData)) return Status::Corrupt(where + ": not in a data chunk");
  UB_RETURN_IF_ERROR(space_->MarkUsed(bytenr, num_bytes).WithContext(where + " overlaps space in use"));
  MarkGroupDirty(bytenr);
  new_data_[bytenr] = num_bytes;
  return true;
}

Status TxnManager::ReplaceCsums(uint64_t logical, std::span<const uint8_t> sums) {
  const uint32_t ss = vol_->sectorsize();
  const size_t csize = CsumSize(vol_->csum_type());
  if (csize == 0 || sums.size() % csize != 0 || logical % ss != 0) {
    return Status::Corrupt("tree log: checksums at " + std::to_string(logical) + " are malformed");
  }
  const size_t sectors = sums.size() / csize;
  UB_RETURN_IF_ERROR(DeleteCsums(logical, uint64_t{sectors} * ss));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kCsumTreeObjectid));
  const size_t per_item = std::min<size_t>(w->MaxItemSize() / csize, 1024);
  for (size_t first = 0; first < sectors; first += per_item) {
    const size_t n = std::min(per_item, sectors - first);
    UB_RETURN_IF_ERROR(w->Insert(Key{kExtentCsumObjectid, kExtentCsumKey, logical + first * ss},
                                 sums.subspan(first * csize, n * csize)));
  }
  return Status::Ok();
}

// Deletes the checksums of [start, start + len), trimming items that reach
// past either end.
Status TxnManager::DeleteCsums(uint64_t start, uint64_t len) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kCsumTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * root, vol_->MutableRoot(kCsumTreeObjectid));
  const uint32_t ss = vol_->sectorsize();
  const size_t csize = CsumSize(vol_->csum_type());
  const uint64_t end = start + len;
  Cursor c(dirty_.get(), root->ref);
  UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{kExtentCsumObjectid, kExtentCsumKey, start}));
  if (!c.Valid()) UB_RETURN_IF_ERROR(c.Seek(Key{kExtentCsumObjectid, kExtentCsumKey, 0}));
  std::vector<std::pair<Key, std::vector<uint8_t>>> hits;
  for (; c.Valid(); ) {
    const Key k = c.key();
    if (k > Key{kExtentCsumObjectid, kExtentCsumKey, UINT64_MAX} || (k.type == kExtentCsumKey && k.offset >= end)) {
      break;
    }
    if (k.objectid == kExtentCsumObjectid && k.type == kExtentCsumKey &&
        k.offset + c.data().size() / csize * ss > start) {
      hits.push_back({k, std::vector<uint8_t>(c.data().begin(), c.data().end())});
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  for (auto& [k, sums] : hits) {
    const uint64_t item_end = k.offset + sums.size() / csize * ss;
    UB_RETURN_IF_ERROR(w->Delete(k));
    if (k.offset < start) {
      std::vector<uint8_t> head(sums.begin(), sums.begin() + static_cast<long>((start - k.offset) / ss * csize));
      UB_RETURN_IF_ERROR(w->Insert(k, head));
    }
    if (item_end > end) {
      std::vector<uint8_t> tail(sums.begin() + static_cast<long>((end - k.offset) / ss * csize), sums.end());
      UB_RETURN_IF_ERROR(w->Insert(Key{kExtentCsumObjectid, kExtentCsumKey, end}, tail));
    }
  }
  return Status::Ok();
}

// ---- Block groups and the free space tree ------------------------------------------------

Status TxnManager::UpdateBlockGroups(bool* changed) {
  auto groups = std::move(dirty_groups_);
  dirty_groups_.clear();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * ext, Writer(kExtentTreeObjectid));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * fstw, Writer(kFreeSpaceTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * ext_root, vol_->MutableRoot(kExtentTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * fst_root, vol_->MutableRoot(kFreeSpaceTreeObjectid));
  for (uint64_t start : groups) {
    auto g = space_->FindGroup(start);
    if (!g) continue;
    // Block group item: bytes used, superblock stripes not counted.
    const Key bg_key{start, kBlockGroupItemKey, g->length};
    UB_ASSIGN_OR_RETURN(auto bg_item, tree::LookupItem(dirty_.get(), ext_root->ref, bg_key));
    if (!bg_item || bg_item->size() < sizeof(BlockGroupItem)) {
      return Status::Corrupt("block group item " + KeyToString(bg_key) + " missing");
    }
    auto* bgi = reinterpret_cast<BlockGroupItem*>(bg_item->data());
    const uint64_t used = g->used_bytes - ExcludedIn(start);
    if (bgi->used.get() != used) {
      bgi->used = used;
      UB_RETURN_IF_ERROR(ext->Update(bg_key, *bg_item));
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

// ---- Root items ----------------------------------------------------------------------------

Status TxnManager::UpdateRootItems(bool* changed) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, Writer(kRootTreeObjectid));
  for (uint64_t id : vol_->LoadedRoots()) {
    UB_ASSIGN_OR_RETURN(Volume::TreeRoot * r, vol_->MutableRoot(id));
    if (r->item.bytenr.get() == r->ref.bytenr && r->item.level == r->ref.level &&
        r->item.generation.get() == r->ref.generation) {
      continue;
    }
    r->item.bytenr = r->ref.bytenr;
    r->item.level = static_cast<uint8_t>(r->ref.level);
    r->item.generation = r->ref.generation;
    if (r->item_size >= sizeof(RootItem)) {
      r->item.generation_v2 = r->ref.generation;
      if (id == kFsTreeObjectid || id >= kFirstFreeObjectid) {
        r->item.ctransid = transid();
        timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        r->item.ctime.sec = static_cast<uint64_t>(now.tv_sec);
        r->item.ctime.nsec = static_cast<uint32_t>(now.tv_nsec);
      }
    }
    UB_RETURN_IF_ERROR(rootw->Update(r->item_key, Bytes(&r->item, r->item_size)));
    *changed = true;
  }
  return Status::Ok();
}

// ---- Commit ----------------------------------------------------------------------------------

Status TxnManager::WriteDirtyBlocks(std::vector<uint64_t>* written) {
  const tree::TreeParams& params = vol_->reader()->params();
  const auto blocks = dirty_->All();  // by address
  std::vector<std::vector<uint64_t>> phys(blocks.size());  // each block's device copies
  // Seal and verify blocks [from, to): checksum, and never write a block our
  // own reader would refuse.
  auto seal_range = [&](size_t from, size_t to) -> Status {
    for (size_t i = from; i < to; ++i) {
      const auto& [bytenr, block] = blocks[i];
      Header& h = block->mutable_header();
      h.flags = h.flags.get() | kHeaderFlagWritten;
      auto bytes = block->bytes();
      CsumBytes c = ComputeCsum(params.csum_type, bytes.subspan(kCsumSize));
      std::memcpy(block->mutable_bytes(), c.data(), kCsumSize);
      UB_RETURN_IF_ERROR(tree::VerifyTreeBlock(bytes, params, tree::BlockCheck{bytenr, -1, transid(), {}})
                             .WithContext("refusing to write"));
      UB_ASSIGN_OR_RETURN(phys[i], vol_->chunks().Map(bytenr, bytes.size()));
    }
    return Status::Ok();
  };
  // A large commit seals its two halves on two threads (checksums and checks
  // are the CPU work of writing).
  constexpr size_t kParallelFrom = 1024;
  static stats::Histogram& seal_time = stats::GetHistogram("commit.seal_time", "ns");
  const uint64_t seal_t0 = stats::NowNs();
  Status first, second;
  if (blocks.size() >= kParallelFrom && std::thread::hardware_concurrency() > 1) {
    const size_t mid = blocks.size() / 2;
    std::thread helper([&] { second = seal_range(mid, blocks.size()); });
    first = seal_range(0, mid);
    helper.join();
  } else {
    first = seal_range(0, blocks.size());
  }
  UB_RETURN_IF_ERROR(first);
  UB_RETURN_IF_ERROR(second);
  seal_time.Record(stats::NowNs() - seal_t0);
  // Writes from one thread (parallel writes to one file only queue on its
  // lock), each run of neighbouring blocks as one gathered write of at most
  // kRunBytes. Every few MiB the device is told to start writing, so the
  // flush after this waits only for the tail.
  constexpr uint64_t kRunBytes = 1u << 20;
  constexpr uint64_t kWritebackEvery = 8u << 20;
  uint64_t since_hint = 0;
  size_t copies = 0;
  for (const auto& p : phys) copies = std::max(copies, p.size());
  std::vector<std::span<const uint8_t>> run;
  for (size_t c = 0; c < copies; ++c) {
    uint64_t run_start = 0, run_bytes = 0;
    auto flush_run = [&]() -> Status {
      if (run.empty()) return Status::Ok();
      UB_RETURN_IF_ERROR(vol_->device()->WriteGather(run_start, run));
      since_hint += run_bytes;
      run.clear();
      run_bytes = 0;
      if (since_hint >= kWritebackEvery) {
        vol_->device()->StartWriteback();
        since_hint = 0;
      }
      return Status::Ok();
    };
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (c >= phys[i].size()) continue;
      const auto bytes = blocks[i].second->bytes();
      if (!run.empty() && (phys[i][c] != run_start + run_bytes || run_bytes + bytes.size() > kRunBytes)) {
        UB_RETURN_IF_ERROR(flush_run());
      }
      if (run.empty()) run_start = phys[i][c];
      run.push_back(bytes);
      run_bytes += bytes.size();
    }
    UB_RETURN_IF_ERROR(flush_run());
  }
  written->reserve(blocks.size());
  for (const auto& [bytenr, block] : blocks) written->push_back(bytenr);
  return Status::Ok();
}

Status TxnManager::Commit() {
  ChunkAllocator::CommitScope commit_scope(chunk_alloc_.get());  // commit may use the metadata reserve
  // Where a commit's time goes: reference and accounting updates, writing the
  // blocks (checksum, verify, write), and the two device flushes.
  static stats::Histogram& refs_time = stats::GetHistogram("commit.refs_time", "ns");
  static stats::Histogram& write_time = stats::GetHistogram("commit.write_time", "ns");
  static stats::Histogram& flush_time = stats::GetHistogram("commit.flush_time", "ns");
  uint64_t t0 = stats::NowNs();
  int loops = 0;
  for (;; ++loops) {
    if (loops >= kMaxCommitLoops) return Status::Error(EIO, "internal: commit did not settle");
    bool changed = false;
    UB_RETURN_IF_ERROR(RunDelayedRefs(&changed));
    UB_RETURN_IF_ERROR(chunk_alloc_->FinishPending(&changed));  // new chunks' items, before their groups'
    UB_RETURN_IF_ERROR(UpdateBlockGroups(&changed));
    UB_RETURN_IF_ERROR(UpdateRootItems(&changed));
    if (!changed && pending_.empty() && new_data_.empty() && dirty_groups_.empty() &&
        !chunk_alloc_->HasPending()) {
      break;
    }
  }
  stats_.commit_loops = loops;
  if (dirty_->count() == 0 && !force_super_) {
    // Nothing changed on the device. What the refs pass freed can only be
    // data this transaction took and never referenced (the pieces of a write
    // that got ENOSPC): never part of a committed tree, so reusable now --
    // left pinned, a full device would stay full until some real commit.
    space_->Commit();
    return Status::Ok();
  }
  refs_time.Record(stats::NowNs() - t0);

  std::vector<uint64_t> written;
  t0 = stats::NowNs();
  UB_RETURN_IF_ERROR(WriteDirtyBlocks(&written));
  write_time.Record(stats::NowNs() - t0);
  t0 = stats::NowNs();
  UB_RETURN_IF_ERROR(vol_->device()->Flush());
  uint64_t flush_ns = stats::NowNs() - t0;

  SuperBlock& sb = vol_->mutable_super();
  uint64_t used = 0;
  space_->ForEachGroup([&](const alloc::BlockGroup& g) { used += g.used_bytes() - ExcludedIn(g.start()); });
  sb.generation = transid();
  sb.bytes_used = used;
  // Rotate the backup roots as the kernel does, newest in slot transid % 4.
  RootBackup& b = sb.super_roots[transid() % kNumBackupRoots];
  std::memset(&b, 0, sizeof b);
  const tree::RootPtr rt = vol_->root_tree();
  b.tree_root = rt.bytenr;
  b.tree_root_gen = rt.generation;
  b.tree_root_level = static_cast<uint8_t>(rt.level);
  const tree::RootPtr ct = vol_->chunk_tree();
  b.chunk_root = ct.bytenr;
  b.chunk_root_gen = ct.generation;
  b.chunk_root_level = static_cast<uint8_t>(ct.level);
  auto fill = [&](uint64_t id, Le64& bytenr, Le64& gen, uint8_t& level) {
    if (auto r = vol_->FindRoot(id); r.ok()) {
      bytenr = r->ref.bytenr;
      gen = r->ref.generation;
      level = static_cast<uint8_t>(r->ref.level);
    }
  };
  fill(kExtentTreeObjectid, b.extent_root, b.extent_root_gen, b.extent_root_level);
  fill(kFsTreeObjectid, b.fs_root, b.fs_root_gen, b.fs_root_level);
  fill(kDevTreeObjectid, b.dev_root, b.dev_root_gen, b.dev_root_level);
  fill(kCsumTreeObjectid, b.csum_root, b.csum_root_gen, b.csum_root_level);
  b.total_bytes = sb.total_bytes.get();
  b.bytes_used = used;
  b.num_devices = sb.num_devices.get();
  UB_RETURN_IF_ERROR(vol_->WriteSuperblocks());
  force_super_ = false;
  t0 = stats::NowNs();
  UB_RETURN_IF_ERROR(vol_->device()->Flush());
  flush_time.Record(flush_ns + stats::NowNs() - t0);

  // Committed: freed space becomes reusable, the cache learns the new blocks.
  // The buffers this releases are kept for the next transaction's blocks.
  tree::ExpectBlockBuffers(written.size() * vol_->nodesize());
  space_->Commit();
  for (uint64_t f : freed_blocks_) vol_->reader()->Invalidate(f);
  freed_blocks_.clear();
  for (uint64_t w : written) vol_->reader()->Cache(dirty_->Get(w));
  stats_.blocks_written += written.size();
  ++stats_.commits;
  dirty_->Reset(transid() + 1);
  return Status::Ok();
}

}  // namespace ubtrfs::txn
