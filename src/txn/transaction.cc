#include "txn/transaction.h"

#include "stats/stats.h"

#include <algorithm>
#include <cstring>
#include <ctime>

#include "format/checksum.h"
#include "format/superblock.h"
#include "txn/chunk_alloc.h"
#include "txn/extent_refs.h"
#include "txn/clock.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

namespace {

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
  const uint64_t ro = sb.compat_ro_flags.get();
  const bool fst_valid = (ro & kCompatRoFreeSpaceTree) && (ro & kCompatRoFreeSpaceTreeValid);
  if (ro & kCompatRoBlockGroupTree) {
    // The kernel refuses this combination too: its block groups could not be
    // cached without the free space tree.
    if (!fst_valid) return Status::Corrupt("the block-group-tree feature is set without a valid free space tree");
    bg_tree_ = kBlockGroupTreeObjectid;
  }
  // Verity files refuse changes to their data themselves (fs/verity.cc).
  constexpr uint64_t kKnownRo = kCompatRoFreeSpaceTree | kCompatRoFreeSpaceTreeValid | kCompatRoBlockGroupTree |
                                kCompatRoVerity;
  if (uint64_t extra = ro & ~kKnownRo) {
    return Status::Unsupported("writing to an image with read-only-compatible features " + CompatRoNames(extra));
  }
  if (sb.log_root.get() != 0 && !allow_log) {
    return Status::Unsupported("writing to an image with an unreplayed tree log");
  }
  if (sb.flags.get() & kSuperFlagError) return Status::Unsupported("writing to an image the kernel marked as damaged");

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
  if (fst_valid) UB_RETURN_IF_ERROR(CheckFreeSpaceTree());
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
  if (!fst_valid) UB_RETURN_IF_ERROR(RebuildFreeSpaceTree());
  uuid_tree_current_ = sb.uuid_tree_generation.get() == sb.generation.get() && vol_->FindRoot(kUuidTreeObjectid).ok();
  UB_RETURN_IF_ERROR(LoadQuotas());
  if (quotas_ && quotas_->rescan_at_open) return RescanQuotas().WithContext("finishing the kernel's quota rescan");
  return Status::Ok();
}

Result<tree::TreeWriter*> TxnManager::Writer(uint64_t objectid) {
  if (objectid < kFastWriters) {
    if (tree::TreeWriter* w = fast_writers_[objectid].load(std::memory_order_acquire)) return w;
  }
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
  if (objectid < kFastWriters) fast_writers_[objectid].store(raw, std::memory_order_release);
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
  p.owner = owner;  // its header's owner too
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

Result<uint64_t> TxnManager::AllocData(uint64_t len, bool first_fit) {
  auto lock = AllocLock();
  if (chunk_alloc_->mixed()) UB_RETURN_IF_ERROR(KeepMixedMetadataRoom(len));
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, space_->Allocate(kBlockGroupData, len, vol_->sectorsize(), first_fit));
  if (chunk_alloc_->mixed()) chunk_alloc_->TakeHeldData(len + ChunkAllocator::kCommitBytesPerRef);
  MarkGroupDirty(bytenr);
  // Extents are mostly handed out in ascending order: placed at the end,
  // the map is not searched (a search misses the cache at every level).
  new_data_.insert_or_assign(AtOrAfter(new_data_, bytenr), bytenr, len);
  return bytenr;
}

// With mixed groups a data extent takes from the space the commit and the
// global reserve keep back for metadata: data gets ENOSPC first (or a new
// chunk), never the commit.
Status TxnManager::KeepMixedMetadataRoom(uint64_t len) {
  for (int round = 0;; ++round) {
    const uint64_t free = space_->TotalsFor(kBlockGroupData).free_bytes;
    const uint64_t keep = chunk_alloc_->MixedKeepBackForCaller();
    if (free >= len + keep) return Status::Ok();
    Status s = round < 16 ? chunk_alloc_->NewChunk(kBlockGroupData, ChunkAllocator::kStripeLen)
                          : Status::Error(ENOSPC, "16 new chunks were not enough");
    if (!s.ok()) {
      return Status::Error(s.code(), "no room for " + std::to_string(len) + " bytes of data: " +
                                         std::to_string(free) + " bytes free in the mixed chunks, " +
                                         std::to_string(keep) + " of them kept for metadata; " + s.message());
    }
  }
}

Result<bool> TxnManager::AllocDataAt(uint64_t logical, uint64_t len) {
  auto lock = AllocLock();
  if (chunk_alloc_->mixed() && !KeepMixedMetadataRoom(len).ok()) return false;
  const auto g = space_->FindGroup(logical);
  // At a group's start the extent being grown ends in the group before:
  // one extent must not span two groups (btrfs check, the kernel's tree
  // checker), however adjacent the two are in logical space.
  if (!g || !(g->flags & kBlockGroupData) || g->read_only || logical == g->start || logical + len > g->start + g->length) {
    return false;
  }
  if (!space_->MarkUsed(logical, len).ok()) return false;  // in use or pinned
  if (chunk_alloc_->mixed()) chunk_alloc_->TakeHeldData(len);
  MarkGroupDirty(logical);
  new_data_[logical] = len;
  return true;
}

Result<bool> TxnManager::MergeData(uint64_t prev, uint64_t prev_len, uint64_t next, uint64_t root, uint64_t ino,
                                   uint64_t offset) {
  auto lock = AllocLock();
  auto a = new_data_.find(prev), b = new_data_.find(next);
  if (a == new_data_.end() || b == new_data_.end() || a->second != prev_len || prev + prev_len != next) return false;
  auto pa = pending_.find(prev);
  if (pa == pending_.end() || pa->second.tree || pending_.count(next)) return false;
  const auto& refs = pa->second.refs;
  if (refs.size() != 1 || refs.begin()->first != RefId{kExtentDataRefKey, root, ino, offset} ||
      refs.begin()->second != 1) {
    return false;  // cloned or split since: other items point into it
  }
  a->second += b->second;
  pa->second.num_bytes = a->second;
  new_data_.erase(b);
  return true;
}

namespace {
thread_local CloneSource t_clone_source;
}  // namespace

ScopedCloneSource::ScopedCloneSource(const CloneSource& s) : saved_(t_clone_source) { t_clone_source = s; }
ScopedCloneSource::~ScopedCloneSource() { t_clone_source = saved_; }
const CloneSource* CurrentCloneSource() { return t_clone_source.fd >= 0 ? &t_clone_source : nullptr; }

Status TxnManager::WriteData(uint64_t logical, std::span<const uint8_t> data, bool csum) {
  const uint32_t ss = vol_->sectorsize();
  if (logical % ss || data.size() % ss) return Status::Invalid("unaligned data write");
  const CloneSource& cs = t_clone_source;
  // Only whole sectors the buffer holds as they lie in the host file (not
  // a padded tail, not compressed bytes), from a sector-aligned place in it.
  // RAID5/6 data is written with its parity, never cloned from the host.
  uint64_t host_len = 0;
  if (cs.fd >= 0 && !vol_->chunk_io().IsParityChunk(logical) && data.data() >= cs.base &&
      data.data() < cs.base + cs.len &&
      (cs.offset + static_cast<uint64_t>(data.data() - cs.base)) % ss == 0) {
    host_len = std::min<uint64_t>(data.size(), cs.base + cs.len - data.data()) / ss * ss;
  }
  if (host_len == 0) {
    UB_RETURN_IF_ERROR(vol_->chunk_io().Write(logical, data));
    // Left to the host's page cache, large writes would reach the disk only
    // at the commit's flush (background writeback starts at 10% of RAM):
    // started every 16 MiB, the disk works while the caller goes on.
    constexpr uint64_t kDataWritebackEvery = 16u << 20;
    if (data_since_hint_.fetch_add(data.size()) + data.size() >= kDataWritebackEvery) {
      data_since_hint_ = 0;
      vol_->devices().StartWriteback();
    }
  } else {
    // Cloned piece by piece where each copy lies.
    UB_ASSIGN_OR_RETURN(auto copies, vol_->chunks().Map(logical, data.size()));
    for (const auto& pieces : copies) {
      for (const alloc::Piece& p : pieces) {
        io::BlockDevice* dev = vol_->chunk_io().devices().Get(p.devid);
        if (dev == nullptr) continue;  // a missing device of a degraded array
        uint64_t done = 0;
        if (p.buf_offset < host_len) {
          const uint64_t n = std::min(p.length, host_len - p.buf_offset) / ss * ss;
          if (n > 0) {
            UB_ASSIGN_OR_RETURN(bool cloned, dev->CloneFrom(cs.fd, cs.offset + (data.data() - cs.base) + p.buf_offset,
                                                            p.physical, n));
            if (cloned) done = n;
          }
        }
        if (done < p.length) UB_RETURN_IF_ERROR(dev->WriteAt(p.physical + done, data.subspan(p.buf_offset + done, p.length - done)));
      }
    }
  }
  data_bytes_written_.fetch_add(data.size(), std::memory_order_relaxed);
  if (!csum) return Status::Ok();
  const size_t csize = CsumSize(vol_->csum_type());
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kCsumTreeObjectid));
  const size_t per_item = std::min<size_t>(MaxCsumsPerItem(vol_->nodesize(), csize), 1024);
  const size_t sectors = data.size() / ss;
  for (size_t first = 0; first < sectors; first += per_item) {
    const size_t n = std::min(per_item, sectors - first);
    std::vector<uint8_t> sums(n * csize);
    for (size_t i = 0; i < n; ++i) {
      CsumBytes c = ComputeCsum(vol_->csum_type(), data.subspan((first + i) * ss, ss));
      std::memcpy(sums.data() + i * csize, c.data(), csize);
    }
    // Extents written one after another (small files) share one item, as
    // the kernel's do, instead of costing an item and a leaf search each.
    auto put = w->InsertOrAppendRun(Key{kExtentCsumObjectid, kExtentCsumKey, logical + first * ss}, sums,
                                    static_cast<uint32_t>(csize), ss, static_cast<uint32_t>(per_item * csize));
    if (!put.ok()) return put.status();
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

Result<uint64_t> TxnManager::AllocLogBlock() {
  auto lock = AllocLock();
  if (chunk_alloc_->HasPending()) return Status::Error(ENOSPC, "a new chunk is not committed yet");
  const uint32_t n = vol_->nodesize();
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, space_->Allocate(kBlockGroupMetadata, n, n));
  if (chunk_alloc_->HasPending()) {
    // The allocation made a chunk: the block may lie in it. The space goes
    // back (pinned) and the caller commits instead.
    UB_RETURN_IF_ERROR(space_->Free(bytenr, n));
    MarkGroupDirty(bytenr);
    return Status::Error(ENOSPC, "metadata space for a tree log needs a new chunk");
  }
  UB_RETURN_IF_ERROR(space_->Free(bytenr, n));  // pinned: not handed out again before the commit
  MarkGroupDirty(bytenr);
  freed_blocks_.push_back(bytenr);  // a cached block of an older life at this address is stale
  return bytenr;
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
  const size_t per_item = std::min<size_t>(MaxCsumsPerItem(vol_->nodesize(), csize), 1024);
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
      if ((id == kFsTreeObjectid || id >= kFirstFreeObjectid) && !moved_only_.contains(id)) {
        r->item.ctransid = transid();
        const timespec now = WallClock();
        r->item.ctime.sec = static_cast<uint64_t>(now.tv_sec);
        r->item.ctime.nsec = static_cast<uint32_t>(now.tv_nsec);
      }
    }
    UB_RETURN_IF_ERROR(rootw->Update(r->item_key, Bytes(&r->item, r->item_size)));
    *changed = true;
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
