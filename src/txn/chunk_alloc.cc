#include "txn/chunk_alloc.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>

#include "format/key.h"
#include "stats/stats.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
// The kernel's BTRFS_AVAIL_ALLOC_BIT_SINGLE: "single was seen", apart from
// no profile bit at all.
constexpr uint64_t kAvailAllocBitSingle = 1ull << 48;

uint64_t RoundDown(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::vector<uint8_t> Bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// The longest run of [start, start + len) outside the (sorted) excluded ranges.
uint64_t LargestRun(uint64_t start, uint64_t len, const std::vector<std::pair<uint64_t, uint64_t>>& excluded) {
  uint64_t best = 0, cur = start;
  for (auto [s, l] : excluded) {
    if (s > cur) best = std::max(best, s - cur);
    cur = std::max(cur, s + l);
  }
  if (start + len > cur) best = std::max(best, start + len - cur);
  return best;
}

}  // namespace

Result<std::vector<uint64_t>> PlaceStripes(const std::vector<std::pair<uint64_t, uint64_t>>& holes, int nstripes,
                                           uint64_t want, uint64_t min_len, uint64_t* len) {
  constexpr uint64_t kAlign = ChunkAllocator::kStripeLen;
  if (nstripes != 1 && nstripes != 2) {
    return Status::Invalid("placing " + std::to_string(nstripes) + " stripes: only single and DUP");
  }
  if (min_len == 0) min_len = kAlign;
  uint64_t largest = 0, second = 0;
  size_t largest_i = 0, second_i = 0;
  for (size_t i = 0; i < holes.size(); ++i) {
    const uint64_t l = holes[i].second;
    if (l > largest) {
      second = largest, second_i = largest_i;
      largest = l, largest_i = i;
    } else if (l > second) {
      second = l, second_i = i;
    }
  }
  if (nstripes == 1) {
    for (auto [s, l] : holes) {
      if (l >= want) {
        *len = want;
        return std::vector<uint64_t>{s};
      }
    }
    const uint64_t cand = std::min(RoundDown(largest, kAlign), want);
    if (cand > 0 && cand >= min_len) {
      *len = cand;
      return std::vector<uint64_t>{holes[largest_i].first};
    }
  } else {
    // Both copies in one hole, as the kernel places DUP stripes...
    for (auto [s, l] : holes) {
      if (l >= 2 * want) {
        *len = want;
        return std::vector<uint64_t>{s, s + want};
      }
    }
    // ... else in the first two holes that each take one.
    std::vector<uint64_t> fit;
    for (auto [s, l] : holes) {
      if (l >= want) fit.push_back(s);
    }
    if (fit.size() >= 2) {
      *len = want;
      return std::vector<uint64_t>{fit[0], fit[1]};
    }
    // Smaller: half the largest hole, or the second largest hole (the
    // largest taking the other copy), whichever is more.
    const uint64_t in_one = std::min(RoundDown(largest / 2, kAlign), want);
    const uint64_t in_two = second > 0 ? std::min(RoundDown(second, kAlign), want) : 0;
    const uint64_t cand = std::max(in_one, in_two);
    if (cand > 0 && cand >= min_len) {
      *len = cand;
      if (in_one >= in_two) return std::vector<uint64_t>{holes[largest_i].first, holes[largest_i].first + cand};
      uint64_t a = holes[largest_i].first, b = holes[second_i].first;
      return std::vector<uint64_t>{std::min(a, b), std::max(a, b)};
    }
  }
  return Status::Error(ENOSPC, "the device has no room for " + std::to_string(nstripes) + " stripe" +
                                   (nstripes > 1 ? "s" : "") + " of " + std::to_string(min_len) +
                                   " bytes (largest free range " + std::to_string(largest) + " bytes, " +
                                   std::to_string(holes.size()) + " free ranges)");
}

// ---- Loading ----------------------------------------------------------------------------

Status ChunkAllocator::Load() {
  Volume* vol = txn_->vol_;
  mixed_ = (vol->super().incompat_flags.get() & kIncompatMixedGroups) != 0;

  const tree::RootPtr chunk_root = vol->chunk_tree();
  UB_ASSIGN_OR_RETURN(tree::BlockRef root_block,
                      vol->reader()->Read(tree::BlockCheck{chunk_root.bytenr, chunk_root.level,
                                                           chunk_root.generation, {}}));
  std::memcpy(chunk_tree_uuid_, root_block->header().chunk_tree_uuid, kUuidSize);

  device_end_ = 0;
  for (const auto& [devid, item] : vol->dev_items()) {
    io::BlockDevice* bd = vol->devices().Get(devid);
    if (bd == nullptr || vol->IsSeedDevice(devid)) continue;  // missing, or a seed: nothing goes there
    Dev& d = devs_[devid];
    d.item = item;
    d.end = std::min<uint64_t>(item.total_bytes.get(), bd->Size());
    device_end_ += d.end;
  }
  if (devs_.empty()) return Status::Corrupt("chunk tree: no DEV_ITEM for any device present");

  UB_ASSIGN_OR_RETURN(auto dev_root, vol->FindRoot(kDevTreeObjectid));
  tree::Cursor c(txn_->source(), dev_root.ref);
  UB_RETURN_IF_ERROR(c.Seek(Key{0, kDevExtentKey, 0}).WithContext("dev tree"));
  for (; c.Valid();) {
    if (c.key().type == kDevExtentKey) {
      if (c.data().size() < sizeof(DevExtent)) {
        return Status::Corrupt("dev tree: short DEV_EXTENT " + KeyToString(c.key()));
      }
      const auto* de = reinterpret_cast<const DevExtent*>(c.data().data());
      auto it = devs_.find(c.key().objectid);
      if (it != devs_.end()) {
        uint64_t& len = it->second.extents[c.key().offset];
        len = std::max(len, de->length.get());
        // DEV_ITEM.bytes_used is written as this sum (plus new chunks), which
        // also mends an image where the two disagree.
        it->second.bytes_used += de->length.get();
      }
    }
    UB_RETURN_IF_ERROR(c.Next().WithContext("dev tree"));
  }
  // Stripes are device space too, whatever the dev tree says.
  uint64_t seen[3] = {0, 0, 0};
  for (const auto& [logical, ci] : vol->chunks().chunks()) {
    for (const alloc::StripeLoc& st : ci.stripes) {
      auto it = devs_.find(st.devid);
      if (it == devs_.end()) continue;
      uint64_t& len = it->second.extents[st.physical];
      len = std::max(len, ci.stripe_size);
    }
    for (int bit = 0; bit < 3; ++bit) {
      if (ci.type & (1ull << bit)) {
        seen[bit] |= ci.type & kBlockGroupProfileMask;
        if ((ci.type & kBlockGroupProfileMask) == 0) seen[bit] |= kAvailAllocBitSingle;
      }
    }
  }
  // The most redundant profile in use, reduced to what the present devices
  // allow (the kernel's btrfs_reduce_alloc_profile).
  const uint32_t ndevs = static_cast<uint32_t>(devs_.size());
  for (int bit = 0; bit < 3; ++bit) {
    if (seen[bit] == 0) continue;
    uint64_t allowed = 0;
    for (uint64_t p : {kBlockGroupRaid1c4, kBlockGroupRaid6, kBlockGroupRaid1c3, kBlockGroupRaid5, kBlockGroupRaid10,
                       kBlockGroupRaid1, kBlockGroupDup, kBlockGroupRaid0}) {
      if ((seen[bit] & p) && alloc::RuleFor(p).devs_min <= ndevs) {
        allowed = p;
        break;
      }
    }
    profile_[bit] = allowed;
  }
  return Status::Ok();
}

// ---- Sizes and device space ----------------------------------------------------------------

uint64_t ChunkAllocator::TargetSize(uint64_t kind) const {
  const uint64_t tenth = device_end_ / 10;
  uint64_t max;
  if (kind & kBlockGroupData) {
    max = kGiB;
  } else if (kind & kBlockGroupMetadata) {
    max = device_end_ > 50 * kGiB ? kGiB : 256 * kMiB;
  } else {
    max = 32 * kMiB;
  }
  return std::max(RoundDown(std::min(max, tenth), kMiB), kMiB);
}

uint64_t ChunkAllocator::Profile(uint64_t kind) const {
  return profile_[std::countr_zero(kind & kBlockGroupTypeMask) % 3];
}

std::vector<std::pair<uint64_t, uint64_t>> ChunkAllocator::FreeDeviceRanges() const {
  std::lock_guard lock(mu_);
  return FreeDeviceRangesLocked();
}

std::vector<std::pair<uint64_t, uint64_t>> ChunkAllocator::DeviceUsage() const {
  std::lock_guard lock(mu_);
  // Chunks made in the running transaction have no dev extent items yet
  // (phase 2 adds them at the commit), but their space is taken: without
  // them statfs counted it as unallocated and free twice.
  std::map<uint64_t, uint64_t> made;
  for (const Pending& p : pending_) {
    for (const auto& [devid, physical] : p.stripes) made[devid] += p.stripe_size;
  }
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& [devid, d] : devs_) out.push_back({d.item.total_bytes.get(), d.bytes_used + made[devid]});
  return out;
}

std::vector<std::pair<uint64_t, uint64_t>> ChunkAllocator::FreeDeviceRangesLocked() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& [devid, d] : devs_) {
    auto r = FreeRanges(d);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

std::vector<std::pair<uint64_t, uint64_t>> ChunkAllocator::FreeRanges(const Dev& d) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  auto add = [&](uint64_t s, uint64_t e) {
    s = RoundUp(s, kStripeLen);
    e = RoundDown(e, kStripeLen);
    if (e > s) out.push_back({s, e - s});
  };
  uint64_t cur = kDeviceStart;
  for (const auto& [s, l] : d.extents) {
    if (s > cur) add(cur, std::min(s, d.end));
    cur = std::max(cur, s + l);
    if (cur >= d.end) break;
  }
  if (cur < d.end) add(cur, d.end);
  return out;
}

Status ChunkAllocator::PlaceChunk(uint64_t profile, uint64_t want, uint64_t need,
                                  std::vector<std::pair<uint64_t, uint64_t>>* stripes, uint64_t* stripe_size) const {
  stripes->clear();
  const alloc::ProfileRule rule = alloc::RuleFor(profile);
  struct Cand {
    uint64_t devid, max_avail, total_free;
    std::vector<std::pair<uint64_t, uint64_t>> holes;
  };
  std::vector<Cand> cands;
  for (const auto& [devid, d] : devs_) {
    Cand c{devid, 0, 0, FreeRanges(d)};
    for (auto [s, l] : c.holes) {
      c.max_avail = std::max(c.max_avail, l);
      c.total_free += l;
    }
    if (c.max_avail >= kStripeLen) cands.push_back(std::move(c));
  }
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return a.max_avail != b.max_avail ? a.max_avail > b.max_avail : a.total_free > b.total_free;
  });
  if (profile == 0 || profile == kBlockGroupDup) {
    // One device: the one with the largest free range (the only one, on a
    // single-device filesystem), places as before.
    if (cands.empty()) cands.push_back(Cand{devs_.begin()->first, 0, 0, {}});
    const Cand& c = cands.front();
    UB_ASSIGN_OR_RETURN(auto placed, PlaceStripes(c.holes, profile == kBlockGroupDup ? 2 : 1, want, need, stripe_size));
    for (uint64_t p : placed) stripes->push_back({c.devid, p});
    return Status::Ok();
  }
  uint32_t ndevs = static_cast<uint32_t>(cands.size());
  if (rule.devs_max != 0) ndevs = std::min(ndevs, rule.devs_max);
  ndevs -= ndevs % rule.increment;
  if (ndevs < rule.devs_min) {
    return Status::Error(ENOSPC, alloc::ProfileName(profile) + " needs " + std::to_string(rule.devs_min) +
                                     " devices with free space, " + std::to_string(cands.size()) + " have any");
  }
  const uint64_t data_stripes = alloc::DataStripesFor(profile, ndevs);
  const uint64_t want_stripe = std::max(RoundDown(want / data_stripes, kStripeLen), kStripeLen);
  const uint64_t need_stripe = RoundUp((need + data_stripes - 1) / data_stripes, kStripeLen);
  uint64_t size = std::min(want_stripe, RoundDown(cands[ndevs - 1].max_avail, kStripeLen));
  if (size < need_stripe || size == 0) {
    return Status::Error(ENOSPC, "no room for " + std::to_string(ndevs) + " " + alloc::ProfileName(profile) +
                                     " stripes of " + std::to_string(need_stripe) + " bytes (the smallest largest "
                                     "free range is " + std::to_string(cands[ndevs - 1].max_avail) + " bytes)");
  }
  for (uint32_t i = 0; i < ndevs; ++i) {
    for (auto [s, l] : cands[i].holes) {
      if (l >= size) {
        stripes->push_back({cands[i].devid, s});
        break;
      }
    }
  }
  *stripe_size = size;
  return Status::Ok();
}

// ---- Phase 1: in memory ---------------------------------------------------------------------

Status ChunkAllocator::NewChunk(uint64_t kind, uint64_t min_len) {
  std::lock_guard lock(mu_);
  return NewChunkLocked(kind & kBlockGroupTypeMask, min_len);
}

Status ChunkAllocator::NewChunkLocked(uint64_t kind, uint64_t min_len) {
  if (!std::has_single_bit(kind)) return Status::Invalid("new chunk: kind must be one of data, metadata, system");
  Volume* vol = txn_->vol_;
  alloc::SpaceManager& space = *txn_->space_;
  const std::string kind_name = alloc::SpaceManager::KindName(kind);
  const int bit = std::countr_zero(kind);
  const uint64_t profile = profile_[bit];
  // The most stripes this chunk can have: what the system chunk array
  // must make room for.
  const alloc::ProfileRule rule = alloc::RuleFor(profile);
  const size_t max_stripes =
      profile == kBlockGroupDup ? 2 : rule.devs_max != 0 ? rule.devs_max : std::max<size_t>(devs_.size(), 1);

  // A filesystem of mixed groups has only DATA|METADATA chunks besides the
  // system ones (the kernel makes no others there); their size is a data
  // chunk's, as the kernel's sizing tests the DATA bit first.
  const bool mixed = mixed_ && kind != kBlockGroupSystem;
  const uint64_t kinds = mixed ? (kBlockGroupData | kBlockGroupMetadata) : kind;

  // Data must not take the last device space from the metadata its extents
  // need (csums, extent items, file extent items).
  if (!mixed && kind == kBlockGroupData && space.TotalsFor(kBlockGroupMetadata).free_bytes < 2 * CommitReserve()) {
    if (NewChunkLocked(kBlockGroupMetadata, vol->nodesize()).ok()) ++stats_.early_metadata_chunks;
  }

  const size_t sys_entry = sizeof(DiskKey) + sizeof(Chunk) + max_stripes * sizeof(Stripe);
  if (kind == kBlockGroupSystem) {
    size_t used = vol->super().sys_chunk_array_size.get();
    for (const auto& p : pending_) {
      if (p.type & kBlockGroupSystem) used += sizeof(DiskKey) + p.item.size();
    }
    if (used + sys_entry > kSystemChunkArraySize) {
      ++stats_.enospc;
      return Status::Error(ENOSPC, "no new system chunk: the superblock's system chunk array is full (" +
                                       std::to_string(used) + " of " + std::to_string(kSystemChunkArraySize) +
                                       " bytes)");
    }
  }

  uint64_t need = RoundUp(std::max<uint64_t>(min_len, 1), kStripeLen);
  uint64_t want = std::max(TargetSize(kinds), need);
  uint64_t logical = 0;
  {
    const auto& chunks = vol->chunks().chunks();
    if (!chunks.empty()) {
      const auto& last = chunks.rbegin()->second;
      logical = RoundUp(last.logical + last.length, kLogicalAlign);
    } else {
      logical = kLogicalAlign;
    }
    logical = std::max(logical, RoundUp(logical_floor_, kLogicalAlign));
  }
  uint64_t len = 0, stripe_size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> placed;
  std::vector<std::pair<uint64_t, uint64_t>> excluded;
  std::vector<uint8_t> item;
  const uint64_t type = kinds | profile;
  for (int attempt = 0;; ++attempt) {
    Status st = PlaceChunk(profile, want, need, &placed, &stripe_size);
    if (!st.ok()) {
      ++stats_.enospc;
      return st.WithContext("no new " + kind_name + " chunk for " + std::to_string(min_len) + " bytes");
    }
    const size_t nstripes = placed.size();
    const uint64_t data_stripes = alloc::DataStripesFor(profile, static_cast<uint32_t>(nstripes));
    len = stripe_size * data_stripes;
    item.assign(sizeof(Chunk) + nstripes * sizeof(Stripe), 0);
    auto* c = reinterpret_cast<Chunk*>(item.data());
    c->length = len;
    c->owner = kExtentTreeObjectid;
    c->stripe_len = kStripeLen;
    c->type = type;
    c->io_align = static_cast<uint32_t>(kStripeLen);
    c->io_width = static_cast<uint32_t>(kStripeLen);
    c->sector_size = vol->sectorsize();
    c->num_stripes = static_cast<uint16_t>(nstripes);
    c->sub_stripes = profile == kBlockGroupRaid10 ? 2 : 1;
    auto* stripes = reinterpret_cast<Stripe*>(item.data() + sizeof(Chunk));
    alloc::ChunkInfo ci;
    ci.logical = logical;
    ci.length = len;
    ci.type = type;
    ci.stripe_len = kStripeLen;
    ci.sub_stripes = c->sub_stripes.get();
    ci.stripe_size = stripe_size;
    for (size_t i = 0; i < nstripes; ++i) {
      const auto [devid, phys] = placed[i];
      stripes[i].devid = devid;
      stripes[i].offset = phys;
      std::memcpy(stripes[i].dev_uuid, devs_.at(devid).item.uuid, kUuidSize);
      ci.stripes.push_back({devid, phys});
    }
    excluded = alloc::SuperblockRanges(ci);
    // A superblock copy inside a stripe takes 64 KiB (a RAID5/6 row) out of
    // the middle of the chunk; the request must still fit in one piece.
    if (LargestRun(logical, len, excluded) >= min_len) break;
    if (attempt >= 3) {
      ++stats_.enospc;
      return Status::Error(ENOSPC, "no new " + kind_name + " chunk for " + std::to_string(min_len) +
                                       " bytes: superblock copies split every place that fits");
    }
    need = len + 2 * kStripeLen * data_stripes;
    want = std::max(want, need);
  }

  const std::string where = "new " + kind_name + " chunk at " + std::to_string(logical);
  UB_RETURN_IF_ERROR(vol->mutable_chunks()->AddChunk(logical, item, vol->sectorsize()).WithContext(where));
  UB_RETURN_IF_ERROR(space.AddGroup(logical, len, type).WithContext(where));
  for (auto [s, l] : excluded) {
    UB_RETURN_IF_ERROR(space.MarkUsed(s, l).WithContext(where + ": superblock stripe"));
    txn_->excluded_[logical] += l;
    txn_->excluded_ranges_.push_back({s, l});
  }
  txn_->MarkGroupDirty(logical);
  for (auto [devid, p] : placed) devs_[devid].extents[p] = stripe_size;
  pending_.push_back(Pending{logical, len, type, stripe_size, placed, std::move(item)});
  made_this_txn_.insert(logical);
  ++stats_.chunks[bit];
  return Status::Ok();
}

// ---- Reserve --------------------------------------------------------------------------------

// Mixed chunks hold mostly data: a sixteenth of them would keep back far
// more than the kernel does (it sizes its reserve by the extent, csum and
// root trees: 1.4 MiB on a 512 MiB mixed image with 300 MiB of data).
uint64_t ChunkAllocator::ReserveBase(uint64_t metadata_total) const {
  return mixed_ ? metadata_total / 16 : metadata_total;
}

uint64_t ChunkAllocator::NodeSize() const { return txn_->vol_->nodesize(); }

thread_local ChunkAllocator::OpHold* ChunkAllocator::OpHold::current_ = nullptr;
thread_local int ChunkAllocator::QueuedWorkScope::depth_ = 0;

void ChunkAllocator::NoteMetadataAlloc() {
  meta_allocs_.fetch_add(1, std::memory_order_relaxed);
  TakeFromHold(2 * NodeSize());
}

ChunkAllocator::OpHold* ChunkAllocator::OwnHold() const {
  OpHold* h = OpHold::current_;
  return h != nullptr && &h->ca_ == this ? h : nullptr;
}

void ChunkAllocator::HoldData(uint64_t bytes) {
  if (OpHold* h = OwnHold()) {
    h->data_left_ += bytes;
    ops_reserved_.fetch_add(bytes, std::memory_order_relaxed);
  }
}

void ChunkAllocator::TakeHeldData(uint64_t bytes) {
  if (OpHold* h = OwnHold()) {
    const uint64_t take = std::min(h->data_left_, bytes);
    h->data_left_ -= take;
    ops_reserved_.fetch_sub(take, std::memory_order_relaxed);
  }
}

uint64_t ChunkAllocator::MixedKeepBackForCaller() const {
  const OpHold* h = OwnHold();
  return MixedKeepBack() - (h != nullptr ? h->data_left_ : 0);
}

void ChunkAllocator::TakeFromHold(uint64_t bytes) {
  if (OpHold* h = OwnHold()) {
    const uint64_t take = std::min(h->left_, bytes);
    h->left_ -= take;
    ops_reserved_.fetch_sub(take, std::memory_order_relaxed);
  }
}

uint64_t ChunkAllocator::CommitReserveFor(uint64_t refs) const {
  return NodeSize() * (kCommitReserveBlocks + txn_->dirty_->count()) + refs * kCommitBytesPerRef +
         (queued_work_ ? queued_work_() : 0);
}

uint64_t ChunkAllocator::CommitReserve() const {
  const uint64_t refs = txn_->pending_.size() + txn_->new_data_.size();
  refs_seen_.store(refs, std::memory_order_relaxed);
  return CommitReserveFor(refs);
}

Status ChunkAllocator::EnsureMetadataFree(uint64_t need, const std::string& why) {
  std::lock_guard lock(mu_);
  alloc::SpaceManager& space = *txn_->space_;
  for (int round = 0;; ++round) {
    // Allocations hold the transaction's allocation lock, as callers of this
    // do (or run alone): the count read here goes with the free bytes.
    const uint64_t allocs = meta_allocs_.load(std::memory_order_relaxed);
    const alloc::SpaceManager::Totals totals = space.TotalsFor(kBlockGroupMetadata);
    const uint64_t free = totals.free_bytes;
    global_reserve_.store(GlobalReserveBytes(ReserveBase(totals.total_bytes), txn_->vol_->nodesize()),
                          std::memory_order_release);
    if (free >= need) {
      checked_free_.store(free, std::memory_order_release);
      checked_allocs_.store(allocs, std::memory_order_release);
      return Status::Ok();
    }
    Status s = round < 16 ? NewChunkLocked(kBlockGroupMetadata, txn_->vol_->nodesize())
                          : Status::Error(ENOSPC, "16 new chunks were not enough");
    if (!s.ok()) {
      return Status::Error(s.code(), why + ": " + std::to_string(free) + " bytes of metadata space free, " +
                                         std::to_string(need) + " needed (" + std::to_string(CommitReserve()) +
                                         " of them kept for committing the transaction); " + s.message());
    }
    ++stats_.early_metadata_chunks;
  }
}

Status ChunkAllocator::BeforeMetadataBlock() {
  if (committing_ || QueuedWorkScope::depth_ > 0) return Status::Ok();
  const uint64_t need = CommitReserve() + txn_->vol_->nodesize();
  if (txn_->space_->TotalsFor(kBlockGroupMetadata).free_bytes >= need) return Status::Ok();
  return EnsureMetadataFree(need, "allocating a tree block");
}

bool ChunkAllocator::MetadataSurelyFree(uint64_t items) const {
  // Only metadata blocks are counted since the last check; with mixed
  // groups data takes from the same free space.
  if (mixed_) return false;
  const uint64_t node = txn_->vol_->nodesize();
  const uint64_t since = checked_allocs_.load(std::memory_order_acquire);
  const uint64_t free = checked_free_.load(std::memory_order_acquire);
  const uint64_t now = meta_allocs_.load(std::memory_order_acquire);
  const uint64_t used_since = (now - since) * node;
  // Room to spare: a metadata chunk's worth of blocks is only a few hundred.
  const uint64_t need = CommitReserveFor(refs_seen_.load(std::memory_order_relaxed)) + GlobalReserve() +
                        items * kBlocksPerItem * node + 256 * node;
  return free >= used_since && free - used_since >= need;
}

Status ChunkAllocator::ReserveMetadata(uint64_t items, ReserveFor who) {
  const uint32_t node = txn_->vol_->nodesize();
  const uint64_t own = items * kBlocksPerItem * node;
  if (who == ReserveFor::kDelete) {
    return EnsureMetadataFree(CommitReserve() + own,
                              "reserving metadata for a deletion of " + std::to_string(items) + " items");
  }
  // The global reserve as it will be once a chunk more is there: asking
  // twice keeps the figure current when EnsureMetadataFree adds chunks.
  for (;;) {
    const uint64_t global = GlobalReserveBytes(ReserveBase(txn_->space_->TotalsFor(kBlockGroupMetadata).total_bytes), node);
    UB_RETURN_IF_ERROR(EnsureMetadataFree(CommitReserve() + global + own,
                                          "reserving metadata for " + std::to_string(items) + " items (" +
                                              std::to_string(global) + " bytes of global reserve kept back)"));
    if (GlobalReserve() <= global) return Status::Ok();
  }
}

// ---- Phase 2: items -------------------------------------------------------------------------

bool ChunkAllocator::HasPending() const {
  std::lock_guard lock(mu_);
  return !pending_.empty();
}

Status ChunkAllocator::FinishPending(bool* changed) {
  for (;;) {
    Pending p;
    {
      std::lock_guard lock(mu_);
      if (pending_.empty()) return Status::Ok();
      p = pending_.front();
    }
    // The inserts below may need new chunks themselves (appended to pending_).
    UB_RETURN_IF_ERROR(FinishOne(p).WithContext("adding the items of chunk " + std::to_string(p.logical)));
    {
      std::lock_guard lock(mu_);
      pending_.erase(pending_.begin());
    }
    *changed = true;
  }
}

Status ChunkAllocator::WriteBytesUsed(const std::set<uint64_t>& devids) {
  Volume* vol = txn_->vol_;
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * chunk_w, txn_->Writer(kChunkTreeObjectid));
  for (uint64_t devid : devids) {
    const Key dev_key{kDevItemsObjectid, kDevItemKey, devid};
    UB_ASSIGN_OR_RETURN(auto dev_item, tree::LookupItem(txn_->source(), vol->chunk_tree(), dev_key));
    if (!dev_item || dev_item->size() < sizeof(DevItem)) {
      return Status::Corrupt("chunk tree: no DEV_ITEM for device " + std::to_string(devid));
    }
    auto* di = reinterpret_cast<DevItem*>(dev_item->data());
    const uint64_t used = devs_[devid].bytes_used;
    di->bytes_used = used;
    UB_RETURN_IF_ERROR(chunk_w->Update(dev_key, *dev_item));
    if (DevItem* vd = vol->mutable_dev_item(devid)) vd->bytes_used = used;
    if (vol->super().dev_item.devid.get() == devid) vol->mutable_super().dev_item.bytes_used = used;
  }
  return Status::Ok();
}

Status ChunkAllocator::FinishOne(const Pending& p) {
  Volume* vol = txn_->vol_;
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * chunk_w, txn_->Writer(kChunkTreeObjectid));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * dev_w, txn_->Writer(kDevTreeObjectid));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * bg_w, txn_->Writer(txn_->block_group_tree()));

  UB_RETURN_IF_ERROR(chunk_w->Insert(Key{kFirstChunkTreeObjectid, kChunkItemKey, p.logical}, p.item));

  std::set<uint64_t> touched;
  for (auto [devid, phys] : p.stripes) {
    DevExtent de{};
    de.chunk_tree = kChunkTreeObjectid;
    de.chunk_objectid = kFirstChunkTreeObjectid;
    de.chunk_offset = p.logical;
    de.length = p.stripe_size;
    std::memcpy(de.chunk_tree_uuid, chunk_tree_uuid_, kUuidSize);
    UB_RETURN_IF_ERROR(dev_w->Insert(Key{devid, kDevExtentKey, phys}, Bytes(&de, sizeof de)));
    devs_[devid].bytes_used += p.stripe_size;
    touched.insert(devid);
  }

  UB_RETURN_IF_ERROR(WriteBytesUsed(touched));

  BlockGroupItem bg{};
  bg.used = 0;  // TxnManager::UpdateBlockGroups writes the real figure
  bg.chunk_objectid = kFirstChunkTreeObjectid;
  bg.flags = p.type;
  UB_RETURN_IF_ERROR(bg_w->Insert(Key{p.logical, kBlockGroupItemKey, p.length}, Bytes(&bg, sizeof bg)));

  if (p.type & kBlockGroupSystem) {
    SuperBlock& sb = vol->mutable_super();
    const uint32_t at = sb.sys_chunk_array_size.get();
    const size_t add = sizeof(DiskKey) + p.item.size();
    if (at + add > kSystemChunkArraySize) {
      return Status::Error(ENOSPC, "the superblock's system chunk array is full");
    }
    DiskKey k{};
    Key{kFirstChunkTreeObjectid, kChunkItemKey, p.logical}.To(&k);
    std::memcpy(sb.sys_chunk_array + at, &k, sizeof k);
    std::memcpy(sb.sys_chunk_array + at + sizeof k, p.item.data(), p.item.size());
    sb.sys_chunk_array_size = static_cast<uint32_t>(at + add);
  }

  txn_->MarkGroupDirty(p.logical);
  ++stats_.finished;
  return Status::Ok();
}

// ---- Chunks of emptied block groups ---------------------------------------------------------

bool ChunkAllocator::Removable(const alloc::ChunkInfo& c) const {
  std::lock_guard lock(mu_);
  if ((c.type & kBlockGroupSystem) || made_this_txn_.count(c.logical)) return false;
  for (const alloc::StripeLoc& st : c.stripes) {
    if (!devs_.count(st.devid) || !txn_->vol_->devices().Has(st.devid) || txn_->vol_->IsSeedDevice(st.devid)) {
      return false;
    }
  }
  return true;
}

Status ChunkAllocator::RemoveChunk(const alloc::ChunkInfo& c) {
  if (!Removable(c)) return Status::Invalid("chunk " + std::to_string(c.logical) + " may not be removed");
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * chunk_w, txn_->Writer(kChunkTreeObjectid));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * dev_w, txn_->Writer(kDevTreeObjectid));
  UB_RETURN_IF_ERROR(chunk_w->Delete(Key{kFirstChunkTreeObjectid, kChunkItemKey, c.logical}).WithContext("chunk item"));
  std::map<uint64_t, uint64_t> freed;  // devid -> bytes
  for (const alloc::StripeLoc& st : c.stripes) {
    const Key k{st.devid, kDevExtentKey, st.physical};
    UB_ASSIGN_OR_RETURN(auto de, tree::LookupItem(txn_->source(), dev_w->LiveRef(), k));
    if (!de || de->size() < sizeof(DevExtent)) return Status::Corrupt("dev tree: no dev extent " + KeyToString(k));
    freed[st.devid] += reinterpret_cast<const DevExtent*>(de->data())->length.get();
    UB_RETURN_IF_ERROR(dev_w->Delete(k));
  }
  std::set<uint64_t> touched;
  {
    std::lock_guard lock(mu_);
    for (auto [devid, bytes] : freed) {
      Dev& d = devs_.at(devid);
      d.bytes_used -= std::min(d.bytes_used, bytes);
      touched.insert(devid);
    }
    for (const alloc::StripeLoc& st : c.stripes) removed_stripes_.push_back({st.devid, st.physical});
    logical_floor_ = std::max(logical_floor_, c.logical + c.length);
    ++stats_.removed;
  }
  static stats::Counter& removed = stats::GetCounter("alloc.chunks_removed");
  removed.Add();
  return WriteBytesUsed(touched);
}

void ChunkAllocator::ReleaseRemoved() {
  std::lock_guard lock(mu_);
  for (auto [devid, physical] : removed_stripes_) {
    auto it = devs_.find(devid);
    if (it != devs_.end()) it->second.extents.erase(physical);
  }
  removed_stripes_.clear();
}

void ChunkAllocator::TransactionSealed() {
  std::lock_guard lock(mu_);
  made_this_txn_.clear();
}

}  // namespace ubtrfs::txn
