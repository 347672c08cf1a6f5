#include "txn/transaction.h"

#include "stats/stats.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <system_error>
#include <thread>
#include <tuple>

#include "format/checksum.h"
#include "format/superblock.h"
#include "io/cores.h"
#include "txn/chunk_alloc.h"
#include "txn/extent_refs.h"
#include "txn/clock.h"

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
    return Status::Unsupported(
        "writing needs skinny-metadata (the mkfs.btrfs default since 3.18; `btrfstune -x` turns it on, and the "
        "kernel converts the old extent items as it rewrites them)");
  }
  const bool fst_valid = (ro & kCompatRoFreeSpaceTree) && (ro & kCompatRoFreeSpaceTreeValid);
  if (ro & kCompatRoBlockGroupTree) {
    // The kernel refuses this combination too: its block groups could not be
    // cached without the free space tree.
    if (!fst_valid) return Status::Corrupt("the block-group-tree feature is set without a valid free space tree");
    bg_tree_ = kBlockGroupTreeObjectid;
  }
  if (uint64_t extra = ro & ~(kCompatRoFreeSpaceTree | kCompatRoFreeSpaceTreeValid | kCompatRoBlockGroupTree)) {
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
  return LoadQuotas();
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

Result<uint64_t> TxnManager::AllocData(uint64_t len) {
  auto lock = AllocLock();
  if (chunk_alloc_->mixed()) UB_RETURN_IF_ERROR(KeepMixedMetadataRoom(len));
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, space_->Allocate(kBlockGroupData, len, vol_->sectorsize()));
  MarkGroupDirty(bytenr);
  new_data_[bytenr] = len;
  return bytenr;
}

// With mixed groups a data extent takes from the space the commit and the
// global reserve keep back for metadata: data gets ENOSPC first (or a new
// chunk), never the commit.
Status TxnManager::KeepMixedMetadataRoom(uint64_t len) {
  for (int round = 0;; ++round) {
    const uint64_t free = space_->TotalsFor(kBlockGroupData).free_bytes;
    const uint64_t keep = chunk_alloc_->MixedKeepBack();
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
  if (!g || !(g->flags & kBlockGroupData) || logical == g->start || logical + len > g->start + g->length) return false;
  if (!space_->MarkUsed(logical, len).ok()) return false;  // in use or pinned
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
  {
    auto lock = AllocLock();
    stats_.data_bytes_written += data.size();
  }
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
      if (id == kFsTreeObjectid || id >= kFirstFreeObjectid) {
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

// ---- Commit ----------------------------------------------------------------------------------

Status TxnManager::WriteDirtyBlocks(std::vector<uint64_t>* written) {
  const tree::TreeParams& params = vol_->reader()->params();
  const auto blocks = dirty_->All();  // by address
  // Each block's pieces on the devices, every copy; blocks in RAID5/6
  // chunks go row by row through the chunk layer (their parity) instead.
  std::vector<std::vector<alloc::Piece>> phys(blocks.size());
  std::vector<char> in_parity_chunk(blocks.size(), 0);
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
      if (vol_->chunk_io().IsParityChunk(bytenr)) {
        in_parity_chunk[i] = 1;
        continue;
      }
      UB_ASSIGN_OR_RETURN(auto copies, vol_->chunks().Map(bytenr, bytes.size()));
      for (auto& copy : copies) {
        for (const alloc::Piece& p : copy) {
          // A degraded array writes the copies it has (as the kernel).
          if (vol_->devices().Has(p.devid)) phys[i].push_back(p);
        }
      }
    }
    return Status::Ok();
  };
  // A large commit seals its two halves on two threads (checksums and checks
  // are the CPU work of writing).
  constexpr size_t kParallelFrom = 1024;
  static stats::Histogram& seal_time = stats::GetHistogram("commit.seal_time", "ns");
  const uint64_t seal_t0 = stats::NowNs();
  Status first, second;
  if (blocks.size() >= kParallelFrom && io::UsableCores() > 1) {
    const size_t mid = blocks.size() / 2;
    std::thread helper;
    try {
      helper = std::thread([&] { second = seal_range(mid, blocks.size()); });
    } catch (const std::system_error&) {
      // no thread to be had (the process limit): this one seals both
    }
    first = seal_range(0, mid);
    if (helper.joinable()) {
      helper.join();
    } else {
      second = seal_range(mid, blocks.size());
    }
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
  // Every piece in device order, so neighbouring blocks on one device
  // become one gathered write.
  struct Out {
    uint64_t devid, physical;
    std::span<const uint8_t> bytes;
  };
  std::vector<Out> outs;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto bytes = blocks[i].second->bytes();
    for (const alloc::Piece& p : phys[i]) outs.push_back({p.devid, p.physical, bytes.subspan(p.buf_offset, p.length)});
  }
  std::sort(outs.begin(), outs.end(),
            [](const Out& a, const Out& b) { return std::tie(a.devid, a.physical) < std::tie(b.devid, b.physical); });
  std::vector<std::span<const uint8_t>> run;
  uint64_t run_dev = 0, run_start = 0, run_bytes = 0;
  auto flush_run = [&]() -> Status {
    if (run.empty()) return Status::Ok();
    UB_RETURN_IF_ERROR(vol_->devices().WriteGather(run_dev, run_start, run));
    since_hint += run_bytes;
    run.clear();
    run_bytes = 0;
    if (since_hint >= kWritebackEvery) {
      vol_->devices().StartWriteback();
      since_hint = 0;
    }
    return Status::Ok();
  };
  for (const Out& o : outs) {
    if (!run.empty() && (o.devid != run_dev || o.physical != run_start + run_bytes ||
                         run_bytes + o.bytes.size() > kRunBytes)) {
      UB_RETURN_IF_ERROR(flush_run());
    }
    if (run.empty()) {
      run_dev = o.devid;
      run_start = o.physical;
    }
    run.push_back(o.bytes);
    run_bytes += o.bytes.size();
  }
  UB_RETURN_IF_ERROR(flush_run());
  std::vector<alloc::ChunkIo::Range> parity_blocks;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (in_parity_chunk[i]) parity_blocks.push_back({blocks[i].first, blocks[i].second->bytes()});
  }
  UB_RETURN_IF_ERROR(vol_->chunk_io().WriteBatch(parity_blocks));
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
  if (force_super_ && dirty_->count() == 0) {
    // A superblock of a new generation needs a root tree of that generation
    // (readers check it, as the kernel's commit always copies it). A log
    // whose replay changed nothing (say, one that only dropped an inode
    // that is gone) gets here: the root tree's first item rewritten as it
    // is copies its path.
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * rw, Writer(kRootTreeObjectid));
    Cursor c(dirty_.get(), rw->CurrentRoot());
    UB_RETURN_IF_ERROR(c.SeekFirst());
    if (c.Valid()) {
      const Key k = c.key();
      const std::vector<uint8_t> same(c.data().begin(), c.data().end());
      UB_RETURN_IF_ERROR(rw->Update(k, same));
    }
  }
  // Rides along with a commit that writes anyway: never a commit of its own.
  if (!stale_fst_keys_.empty() && dirty_->count() > 0) UB_RETURN_IF_ERROR(DropStaleFreeSpaceItems());
  if (quotas_) UB_RETURN_IF_ERROR(PrepareQuotaAccounting());
  int loops = 0;
  for (;; ++loops) {
    if (loops >= kMaxCommitLoops) return Status::Error(EIO, "internal: commit did not settle");
    bool changed = false;
    UB_RETURN_IF_ERROR(RunDelayedRefs(&changed));
    // Every reference of a subvolume's extents is applied after the first
    // round (later rounds change only the global trees' own blocks).
    // Simple quotas change with every extent item, in whichever round.
    if (quotas_ && (loops == 0 || (quotas_->simple && QgroupsDirty()))) {
      UB_RETURN_IF_ERROR(AccountQuotas());
      changed = true;
    }
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
    QuotasCommitted();
    return Status::Ok();
  }
  refs_time.Record(stats::NowNs() - t0);

  std::vector<uint64_t> written;
  t0 = stats::NowNs();
  UB_RETURN_IF_ERROR(WriteDirtyBlocks(&written));
  write_time.Record(stats::NowNs() - t0);
  t0 = stats::NowNs();
  UB_RETURN_IF_ERROR(vol_->devices().Flush());
  uint64_t flush_ns = stats::NowNs() - t0;

  SuperBlock& sb = vol_->mutable_super();
  uint64_t used = 0;
  space_->ForEachGroup([&](const alloc::BlockGroup& g) { used += g.used_bytes() - ExcludedIn(g.start()); });
  sb.generation = transid();
  if (uuid_tree_current_) sb.uuid_tree_generation = transid();
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
  UB_RETURN_IF_ERROR(vol_->devices().Flush());
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
  QuotasCommitted();
  return Status::Ok();
}

}  // namespace ubtrfs::txn
