#include "txn/relocate.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstddef>
#include <cstring>
#include <set>

#include "format/key.h"
#include "format/superblock.h"
#include "alloc/chunk_io.h"
#include "alloc/chunk_map.h"
#include "alloc/stripe_rebuild.h"
#include "txn/volume.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

namespace {

constexpr uint64_t kStripeLen = 64 * 1024;
constexpr uint64_t kCopyBytes = 8ull << 20;

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t RoundDown(uint64_t v, uint64_t a) { return v / a * a; }

bool Overlaps(uint64_t a, uint64_t al, uint64_t b, uint64_t bl) { return a < b + bl && b < a + al; }

// Profiles whose chunks can be laid out anew over fewer devices (the
// mirrored ones keep a fixed stripe count and move stripe by stripe).
bool Restripable(uint64_t profile) {
  return profile == kBlockGroupRaid0 || profile == kBlockGroupRaid10 || profile == kBlockGroupRaid5 ||
         profile == kBlockGroupRaid6;
}

}  // namespace

std::vector<DeviceLayout::Stripe> DeviceLayout::Stripes() const {
  std::vector<Stripe> out;
  for (const auto& [logical, c] : txn_->vol_->chunks().chunks()) {
    for (size_t i = 0; i < c.stripes.size(); ++i) {
      out.push_back({logical, c.stripe_size, c.type, i, c.stripes[i].physical, c.stripes[i].devid});
    }
  }
  std::sort(out.begin(), out.end(), [](const Stripe& a, const Stripe& b) { return a.physical < b.physical; });
  return out;
}

uint64_t DeviceLayout::DeviceExtentEnd(uint64_t devid) const {
  uint64_t end = ChunkAllocator::kDeviceStart;
  for (const Stripe& s : Stripes()) {
    if (devid == 0 || s.devid == devid) end = std::max(end, s.physical + s.length);
  }
  return end;
}

// The end of the last byte of the group in use, superblock stripes not
// counted (they are only there because of where the chunk lies).
uint64_t DeviceLayout::UsedEnd(uint64_t logical) const {
  uint64_t end = logical;
  const auto& excluded = txn_->excluded_ranges_;
  txn_->space_->ForEachGroup([&](const alloc::BlockGroup& g) {
    if (g.start() != logical) return;
    auto note = [&](uint64_t s, uint64_t l) {
      uint64_t e = s + l;
      for (bool moved = true; moved && e > s;) {
        moved = false;
        for (auto [xs, xl] : excluded) {
          if (xs < e && e <= xs + xl) {
            e = std::max(s, xs);
            moved = true;
          }
        }
      }
      if (e > s) end = std::max(end, e);
    };
    g.ForEachUsedExtent(note);
    g.ForEachPinnedExtent([&](uint64_t s, uint64_t l) { end = std::max(end, s + l); });
  });
  return end;
}

Status DeviceLayout::UpdateChunkItem(uint64_t logical, uint64_t length, size_t index, uint64_t physical,
                                     uint64_t devid) {
  Volume* vol = txn_->vol_;
  const DevItem* dev_item = nullptr;
  if (devid != 0) {
    auto it = vol->dev_items().find(devid);
    if (it == vol->dev_items().end()) return Status::Invalid("no device " + std::to_string(devid));
    dev_item = &it->second;
  }
  const Key key{kFirstChunkTreeObjectid, kChunkItemKey, logical};
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, txn_->Writer(kChunkTreeObjectid));
  UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(txn_->source(), vol->chunk_tree(), key));
  if (!item || item->size() < sizeof(Chunk) + sizeof(format::Stripe)) {
    return Status::Corrupt("chunk tree: no chunk item " + KeyToString(key));
  }
  auto patch = [&](uint8_t* body, size_t size) -> Status {
    auto* c = reinterpret_cast<Chunk*>(body);
    const size_t n = c->num_stripes.get();
    if (size < sizeof(Chunk) + n * sizeof(format::Stripe) || index >= n) {
      return Status::Corrupt("chunk item " + KeyToString(key) + ": stripes do not fit");
    }
    c->length = length;
    format::Stripe& st = reinterpret_cast<format::Stripe*>(body + sizeof(Chunk))[index];
    st.offset = physical;
    if (dev_item) {
      st.devid = devid;
      std::memcpy(st.dev_uuid, dev_item->uuid, kUuidSize);
    }
    return Status::Ok();
  };
  UB_RETURN_IF_ERROR(patch(item->data(), item->size()));
  UB_RETURN_IF_ERROR(w->Update(key, *item));
  const Chunk* c = reinterpret_cast<const Chunk*>(item->data());
  if (!(c->type.get() & kBlockGroupSystem)) return Status::Ok();
  // System chunks are also in the superblock, where the kernel finds the
  // chunk tree before it can read it.
  SuperBlock& sb = vol->mutable_super();
  const uint32_t size = sb.sys_chunk_array_size.get();
  for (uint32_t at = 0; at + sizeof(DiskKey) + sizeof(Chunk) <= size;) {
    DiskKey dk;
    std::memcpy(&dk, sb.sys_chunk_array + at, sizeof dk);
    auto* ch = reinterpret_cast<Chunk*>(sb.sys_chunk_array + at + sizeof dk);
    const size_t len = sizeof(Chunk) + size_t{ch->num_stripes.get()} * sizeof(format::Stripe);
    if (at + sizeof dk + len > size) break;
    if (dk.offset.get() == logical) {
      return patch(sb.sys_chunk_array + at + sizeof dk, len);
    }
    at += static_cast<uint32_t>(sizeof dk + len);
  }
  return Status::Corrupt("system chunk " + std::to_string(logical) + " is missing from the superblock's array");
}

auto& DeviceLayout::Dev() const { return txn_->chunk_alloc_->devs_.begin()->second; }

Result<std::vector<uint8_t>> DeviceLayout::DevItemBytes(uint64_t devid) const {
  const Key dev_key{kDevItemsObjectid, kDevItemKey, devid};
  UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(txn_->source(), txn_->vol_->chunk_tree(), dev_key));
  if (!item || item->size() < sizeof(DevItem)) {
    return Status::Corrupt("chunk tree: no DEV_ITEM for device " + std::to_string(devid));
  }
  return std::move(*item);
}

Status DeviceLayout::UpdateDevItem() {
  Volume* vol = txn_->vol_;
  ChunkAllocator& ca = *txn_->chunk_alloc_;
  const uint64_t devid = Dev().item.devid.get();
  const Key dev_key{kDevItemsObjectid, kDevItemKey, devid};
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, txn_->Writer(kChunkTreeObjectid));
  UB_ASSIGN_OR_RETURN(std::vector<uint8_t> item, DevItemBytes(devid));
  auto* di = reinterpret_cast<DevItem*>(item.data());
  di->bytes_used = Dev().bytes_used;
  di->total_bytes = ca.device_end_;
  UB_RETURN_IF_ERROR(w->Update(dev_key, item));
  // The volume's copy too: each device's superblock takes its DEV_ITEM from
  // it when sealed (Volume::SuperFor), which would put the old sizes back.
  if (DevItem* vd = vol->mutable_dev_item(devid)) {
    vd->bytes_used = Dev().bytes_used;
    vd->total_bytes = ca.device_end_;
  }
  SuperBlock& sb = vol->mutable_super();
  sb.dev_item.bytes_used = Dev().bytes_used;
  sb.dev_item.total_bytes = ca.device_end_;
  sb.total_bytes = ca.device_end_;
  Dev().item.total_bytes = ca.device_end_;
  vol->mutable_chunks()->set_device_size(devid, std::max(ca.device_end_, vol->devices().Get(devid)->Size()));
  return Status::Ok();
}

Status DeviceLayout::TrimChunks(uint64_t* trimmed) {
  *trimmed = 0;
  Volume* vol = txn_->vol_;
  const uint32_t node = vol->nodesize();
  const uint64_t devid = Dev().item.devid.get();

  // Metadata left free: the kernel's global block reserve as its mount
  // sizes it (the extent, checksum and free space trees' bytes and the root
  // tree, at least 24 worst-case item inserts: 6 MiB with 16 KiB nodes on
  // 6.x kernels), plus a commit's worth of blocks, so that a mount can still
  // delete and commit. Less would still mount, but the kernel's first
  // commit could find no metadata block and turn the filesystem read-only.
  uint64_t reserve = 0;
  for (uint64_t id : {kExtentTreeObjectid, kCsumTreeObjectid, kFreeSpaceTreeObjectid}) {
    if (auto r = vol->FindRoot(id); r.ok()) reserve += r->item.bytes_used.get();
  }
  reserve += 4ull * node;  // the root tree
  reserve = std::max<uint64_t>(reserve, 24ull * 16 * node);
  reserve = std::min<uint64_t>(reserve, 512ull << 20);
  reserve += ChunkAllocator::kCommitReserveBlocks * node;

  struct Cut {
    uint64_t logical, old_len, new_len, type;
    std::vector<uint64_t> physical;
  };
  std::vector<Cut> cuts;
  uint64_t meta_free = 0;
  std::vector<size_t> meta_cuts;
  for (const auto& [logical, c] : vol->chunks().chunks()) {
    // Single and DUP stripes are as long as the chunk; striped profiles
    // (a kernel-made RAID0 on one device) stay whole.
    if ((c.type & kBlockGroupProfileMask & ~kBlockGroupDup) != 0) continue;
    const uint64_t used_end = UsedEnd(logical);
    uint64_t want = used_end - logical;
    if (c.type & kBlockGroupSystem) want += 8ull * node;  // the chunk tree grows with chunks
    uint64_t len = std::clamp(RoundUp(want, kStripeLen), kStripeLen, c.length);
    if (c.type & kBlockGroupMetadata) {
      auto g = txn_->space_->FindGroup(logical);
      uint64_t excluded_below = 0;
      for (auto [xs, xl] : txn_->excluded_ranges_) {
        if (xs >= logical && xs + xl <= logical + len) excluded_below += xl;
      }
      // Used bytes below the cut: everything used is below it, except
      // superblock stripes past it.
      uint64_t used = g ? g->used_bytes : 0;
      uint64_t excluded_all = txn_->ExcludedIn(logical);
      used = used - excluded_all + excluded_below;
      meta_free += len > used ? len - used : 0;
      meta_cuts.push_back(cuts.size());
    }
    cuts.push_back({logical, c.length, len, c.type, c.physical()});
  }
  // Not enough free metadata below the cuts: give the groups back some of
  // their tails, the last ones first.
  for (auto it = meta_cuts.rbegin(); it != meta_cuts.rend() && meta_free < reserve; ++it) {
    Cut& cut = cuts[*it];
    const uint64_t more = std::min(RoundUp(reserve - meta_free, kStripeLen), cut.old_len - cut.new_len);
    cut.new_len += more;
    meta_free += more;
  }
  std::erase_if(cuts, [](const Cut& c) { return c.new_len >= c.old_len; });
  if (cuts.empty()) return Status::Ok();

  // Keep the tails out of this transaction's own allocations first.
  for (const Cut& cut : cuts) {
    std::vector<std::pair<uint64_t, uint64_t>> free_runs;
    txn_->space_->ForEachGroup([&](const alloc::BlockGroup& g) {
      if (g.start() != cut.logical) return;
      g.ForEachFreeExtent([&](uint64_t s, uint64_t l) {
        const uint64_t from = std::max(s, cut.logical + cut.new_len);
        if (from < s + l) free_runs.push_back({from, s + l - from});
      });
    });
    for (auto [s, l] : free_runs) UB_RETURN_IF_ERROR(txn_->space_->MarkUsed(s, l).WithContext("trimming a chunk"));
  }

  UB_ASSIGN_OR_RETURN(tree::TreeWriter * dev_w, txn_->Writer(kDevTreeObjectid));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * bg_w, txn_->Writer(txn_->block_group_tree()));
  for (const Cut& cut : cuts) {
    const std::string where = "trimming chunk " + std::to_string(cut.logical);
    for (size_t i = 0; i < cut.physical.size(); ++i) {
      UB_RETURN_IF_ERROR(UpdateChunkItem(cut.logical, cut.new_len, i, cut.physical[i]).WithContext(where));
    }
    for (uint64_t phys : cut.physical) {
      const Key k{devid, kDevExtentKey, phys};
      UB_ASSIGN_OR_RETURN(auto de, tree::LookupItem(txn_->source(), dev_w->LiveRef(), k));
      if (!de || de->size() < sizeof(DevExtent)) return Status::Corrupt(where + ": no dev extent " + KeyToString(k));
      reinterpret_cast<DevExtent*>(de->data())->length = cut.new_len;
      UB_RETURN_IF_ERROR(dev_w->Update(k, *de));
    }
    const Key bg_old{cut.logical, kBlockGroupItemKey, cut.old_len};
    UB_ASSIGN_OR_RETURN(auto bg, tree::LookupItem(txn_->source(), bg_w->LiveRef(), bg_old));
    if (!bg) return Status::Corrupt(where + ": no block group item " + KeyToString(bg_old));
    UB_RETURN_IF_ERROR(bg_w->Delete(bg_old));
    UB_RETURN_IF_ERROR(bg_w->Insert(Key{cut.logical, kBlockGroupItemKey, cut.new_len}, *bg));
    // The group's free space entries are written anew at commit (it is dirty).
    UB_RETURN_IF_ERROR(txn_->DeleteFreeSpaceEntries(cut.logical, cut.old_len).WithContext(where));
  }

  for (const Cut& cut : cuts) {
    const uint64_t end = cut.logical + cut.new_len;
    auto& ranges = txn_->excluded_ranges_;
    for (auto it = ranges.begin(); it != ranges.end();) {
      if (it->first >= end && it->first < cut.logical + cut.old_len) {
        txn_->excluded_[cut.logical] -= it->second;
        it = ranges.erase(it);
      } else {
        ++it;
      }
    }
    UB_RETURN_IF_ERROR(txn_->space_->TruncateGroup(cut.logical, cut.new_len));
    UB_RETURN_IF_ERROR(vol->mutable_chunks()->SetLength(cut.logical, cut.new_len));
    for (uint64_t phys : cut.physical) Dev().extents[phys] = cut.new_len;
    Dev().bytes_used -= (cut.old_len - cut.new_len) * cut.physical.size();
    *trimmed += (cut.old_len - cut.new_len) * cut.physical.size();
    txn_->MarkGroupDirty(cut.logical);
  }
  return UpdateDevItem();
}

std::vector<std::pair<uint64_t, uint64_t>> DeviceLayout::NewSuperRanges(uint64_t logical, size_t index,
                                                                        uint64_t devid, uint64_t to) const {
  const alloc::ChunkInfo* ci = txn_->vol_->chunks().Find(logical);
  if (!ci || index >= ci->stripes.size()) return {};
  alloc::ChunkInfo moved = *ci;
  moved.stripes[index] = {devid, to};
  return NewSuperRanges(moved);
}

std::vector<std::pair<uint64_t, uint64_t>> DeviceLayout::NewSuperRanges(const alloc::ChunkInfo& layout) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (auto [start, len] : alloc::SuperblockRanges(layout)) {
    bool have = false;
    for (auto [xs, xl] : txn_->excluded_ranges_) have |= xs == start && xl == len;
    if (!have) out.push_back({start, len});
  }
  return out;
}

bool DeviceLayout::SuperRangesFree(const alloc::ChunkInfo& layout) const {
  for (const auto& range : NewSuperRanges(layout)) {
    // (not a structured binding: clang before 16 cannot capture one)
    const uint64_t start = range.first, len = range.second;
    bool busy = false;
    txn_->space_->ForEachGroup([&](const alloc::BlockGroup& g) {
      if (g.start() != layout.logical) return;
      auto check = [&](uint64_t a, uint64_t l) { busy |= Overlaps(a, l, start, len); };
      g.ForEachUsedExtent(check);
      g.ForEachPinnedExtent(check);
    });
    if (busy) return false;
  }
  return true;
}

bool DeviceLayout::PlaceOk(const Stripe& s, uint64_t devid, uint64_t to) const {
  const ChunkAllocator& ca = *txn_->chunk_alloc_;
  auto dev = ca.devs_.find(devid);
  if (dev == ca.devs_.end()) return false;
  if (to % kStripeLen || to < ChunkAllocator::kDeviceStart || to + s.length > dev->second.end) return false;
  for (const auto& [p, l] : dev->second.extents) {
    if (Overlaps(p, l, to, s.length)) return false;
  }
  const alloc::ChunkInfo* ci = txn_->vol_->chunks().Find(s.logical);
  if (!ci || s.index >= ci->stripes.size()) return false;
  alloc::ChunkInfo moved = *ci;
  moved.stripes[s.index] = {devid, to};
  return SuperRangesFree(moved);
}

std::set<uint64_t> DeviceLayout::PlaceCandidates(const Stripe& s, uint64_t devid) const {
  const ChunkAllocator& ca = *txn_->chunk_alloc_;
  std::set<uint64_t> candidates;
  auto dev = ca.devs_.find(devid);
  if (dev == ca.devs_.end()) return candidates;
  // Free 64 KiB pieces of the chunk, for placing a superblock copy on one.
  std::vector<uint64_t> free_offsets;
  txn_->space_->ForEachGroup([&](const alloc::BlockGroup& g) {
    if (g.start() != s.logical) return;
    g.ForEachFreeExtent([&](uint64_t a, uint64_t l) {
      for (uint64_t o = RoundUp(a - s.logical, kStripeLen); o + kStripeLen <= a + l - s.logical; o += kStripeLen) {
        if (free_offsets.size() >= 4096) return;
        free_offsets.push_back(o);
      }
    });
  });
  for (auto [hs, hl] : ca.FreeRanges(dev->second)) {
    candidates.insert(hs);
    // The top of the range, and just below a superblock copy in it.
    if (hl >= s.length) candidates.insert(RoundDown(hs + hl - s.length, kStripeLen));
    for (int m = 0; m < kSuperMirrorMax; ++m) {
      const uint64_t sb = SuperblockOffset(m);
      if (sb < hs || sb >= hs + hl) continue;
      candidates.insert(sb + kStripeLen);  // just past the copy
      if (sb >= hs + s.length) candidates.insert(RoundDown(sb - s.length, kStripeLen));
      for (uint64_t o : free_offsets) {
        if (sb >= hs + o) candidates.insert(sb - o);
      }
    }
  }
  return candidates;
}

uint64_t DeviceLayout::FindPlace(const Stripe& s, uint64_t devid, uint64_t limit) const {
  for (uint64_t to : PlaceCandidates(s, devid)) {
    if (to + s.length > limit) break;
    if (PlaceOk(s, devid, to)) return to;
  }
  return 0;
}

uint64_t DeviceLayout::FindPlaceAbove(const Stripe& s) const {
  const std::set<uint64_t> candidates = PlaceCandidates(s, s.devid);
  for (auto it = candidates.rbegin(); it != candidates.rend() && *it > s.physical; ++it) {
    if (PlaceOk(s, s.devid, *it)) return *it;
  }
  return 0;
}

Status DeviceLayout::MoveStripe(uint64_t logical, size_t index, uint64_t to, CopyStats* copied) {
  const alloc::ChunkInfo* ci = txn_->vol_->chunks().Find(logical);
  if (!ci || ci->logical != logical || index >= ci->stripes.size()) {
    return Status::Invalid("no copy " + std::to_string(index) + " of a chunk at " + std::to_string(logical));
  }
  return MoveStripe(logical, index, ci->stripes[index].devid, to, copied);
}

Status DeviceLayout::CopyStripeBytes(const alloc::ChunkInfo& c, size_t index, io::BlockDevice* dst, uint64_t to,
                                     CopyStats* copied) {
  Volume* vol = txn_->vol_;
  const uint64_t logical = c.logical;
  const alloc::StripeLoc from = c.stripes[index];
  // The bytes: only what the group uses (free space holds nothing), as the
  // stripe holds them (every element of a striped chunk that lies in it).
  std::vector<std::pair<uint64_t, uint64_t>> used;
  txn_->space_->ForEachGroup([&](const alloc::BlockGroup& g) {
    if (g.start() == logical) g.ForEachUsedExtent([&](uint64_t a, uint64_t l) { used.push_back({a, l}); });
  });
  io::BlockDevice* src = vol->devices().Get(from.devid);
  // A copy on a missing device, or one that does not read, is made again
  // from the rest of its chunk.
  auto read = [&](uint64_t physical, std::span<uint8_t> out) {
    Status st = src ? src->ReadAt(physical, out) : Status::IoError("device " + std::to_string(from.devid) + " is missing");
    if (st.ok() || c.stripes.size() < 2) return st;
    Status rebuilt = alloc::RebuildStripeRange(vol->chunk_io(), c, index, physical - from.physical, out);
    return rebuilt.ok() ? rebuilt : st.WithContext(rebuilt.ToString());
  };
  std::vector<uint8_t> buf;
  // With `verify`, `logical` is where [physical, +len) lies in the chunk
  // (a RAID5/6 P or Q element has no such place, and is not verified).
  auto copy_bytes = [&](uint64_t physical, uint64_t len, bool verify, uint64_t logical) -> Status {
    for (uint64_t off = 0; off < len;) {
      const uint64_t n = std::min(kCopyBytes, len - off);
      buf.resize(n);
      UB_RETURN_IF_ERROR(read(physical + off, buf));
      if (verify) VerifyCopy(*vol, logical + off, buf, &copied->check);
      UB_RETURN_IF_ERROR(dst->WriteAt(to + (physical - from.physical) + off, buf));
      copied->bytes += n;
      off += n;
    }
    return Status::Ok();
  };
  if (c.parity_stripes() > 0) {
    // RAID5/6: the stripe holds data of some rows and P or Q of others;
    // every row with used bytes has its element here copied whole, a data
    // element verified as any copy is, a P or Q as it is (scrub checks it
    // against the row's data).
    const uint64_t sl = c.stripe_len, k = c.data_stripes(), row_bytes = sl * k;
    std::set<uint64_t> rows;
    for (auto [a, l] : used) {
      for (uint64_t r = (a - logical) / row_bytes; r <= (a + l - 1 - logical) / row_bytes; ++r) rows.insert(r);
    }
    for (uint64_t r : rows) {
      const uint64_t e = c.RowElement(r, index);
      UB_RETURN_IF_ERROR(copy_bytes(from.physical + r * sl, sl, e < k, logical + (r * k + e) * sl));
    }
    used.clear();
  }
  for (auto [a, l] : used) {
    UB_ASSIGN_OR_RETURN(auto copies, vol->chunks().Map(a, l));
    for (const auto& copy : copies) {
      for (const alloc::Piece& p : copy) {
        if (p.devid != from.devid || p.physical < from.physical || p.physical >= from.physical + c.stripe_size) {
          continue;
        }
        UB_RETURN_IF_ERROR(copy_bytes(p.physical, p.length, true, a + p.buf_offset));
      }
    }
  }
  return Status::Ok();
}

Status DeviceLayout::MoveStripe(uint64_t logical, size_t index, uint64_t devid, uint64_t to, CopyStats* copied) {
  Volume* vol = txn_->vol_;
  ChunkAllocator& ca = *txn_->chunk_alloc_;
  const alloc::ChunkInfo* ci = vol->chunks().Find(logical);
  if (!ci || ci->logical != logical || index >= ci->stripes.size()) {
    return Status::Invalid("no copy " + std::to_string(index) + " of a chunk at " + std::to_string(logical));
  }
  const alloc::StripeLoc from = ci->stripes[index];
  const Stripe s{logical, ci->stripe_size, ci->type, index, from.physical, from.devid};
  const std::string where = "moving copy " + std::to_string(index) + " of chunk " + std::to_string(logical) +
                            " from device " + std::to_string(from.devid) + " offset " + std::to_string(s.physical) +
                            " to device " + std::to_string(devid) + " offset " + std::to_string(to);
  if (!PlaceOk(s, devid, to)) return Status::Invalid(where + ": the target is not free device space");

  io::BlockDevice* dst = vol->devices().Get(devid);
  if (!dst) return Status::IoError(where + ": the target device is missing");
  UB_RETURN_IF_ERROR(CopyStripeBytes(*ci, index, dst, to, copied).WithContext(where));

  // Superblock copies inside the new place: their 64 KiB of the chunk is
  // taken out of use (PlaceOk made sure it is free).
  for (auto [start, len] : NewSuperRanges(logical, index, devid, to)) {
    UB_RETURN_IF_ERROR(txn_->space_->MarkUsed(start, len).WithContext(where + ": superblock stripe"));
    txn_->excluded_[logical] += len;
    txn_->excluded_ranges_.push_back({start, len});
  }

  UB_RETURN_IF_ERROR(UpdateChunkItem(logical, ci->length, index, to, devid == from.devid ? 0 : devid)
                         .WithContext(where));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * dev_w, txn_->Writer(kDevTreeObjectid));
  const Key old_key{from.devid, kDevExtentKey, s.physical};
  UB_ASSIGN_OR_RETURN(auto de, tree::LookupItem(txn_->source(), dev_w->LiveRef(), old_key));
  if (!de) return Status::Corrupt(where + ": no dev extent " + KeyToString(old_key));
  UB_RETURN_IF_ERROR(dev_w->Delete(old_key));
  UB_RETURN_IF_ERROR(dev_w->Insert(Key{devid, kDevExtentKey, to}, *de));

  // From here on, blocks of this transaction go to the new place only.
  UB_RETURN_IF_ERROR(vol->mutable_chunks()->SetStripe(logical, index, to, devid));
  TrackMissing(from.devid);
  ca.devs_[from.devid].extents.erase(s.physical);
  ca.devs_[devid].extents[to] = s.length;
  if (devid != from.devid) {
    ca.devs_[from.devid].bytes_used -= s.length;
    ca.devs_[devid].bytes_used += s.length;
    UB_RETURN_IF_ERROR(ca.WriteBytesUsed({from.devid, devid}).WithContext(where));
  }
  return Status::Ok();
}

Status DeviceLayout::SetDeviceSize(uint64_t bytes) {
  ChunkAllocator& ca = *txn_->chunk_alloc_;
  const uint64_t ss = txn_->vol_->sectorsize();
  bytes = RoundDown(bytes, ss);
  if (bytes < DeviceExtentEnd()) {
    return Status::Invalid("device size " + std::to_string(bytes) + " is below the end of the last chunk (" +
                           std::to_string(DeviceExtentEnd()) + ")");
  }
  ca.device_end_ = bytes;
  Dev().end = bytes;
  return UpdateDevItem();
}

// ---- Several devices ----

Status DeviceLayout::SetDeviceSize(uint64_t devid, uint64_t bytes) {
  Volume* vol = txn_->vol_;
  ChunkAllocator& ca = *txn_->chunk_alloc_;
  auto it = ca.devs_.find(devid);
  io::BlockDevice* dev = vol->devices().Get(devid);
  if (it == ca.devs_.end() || dev == nullptr) {
    return Status::Invalid("device " + std::to_string(devid) + " is not a present device of the filesystem");
  }
  bytes = RoundDown(bytes, vol->sectorsize());
  const uint64_t end = DeviceExtentEnd(devid);
  if (bytes < end) {
    return Status::Invalid("device " + std::to_string(devid) + " size " + std::to_string(bytes) +
                           " is below the end of its last chunk stripe (" + std::to_string(end) + ")");
  }
  if (bytes > dev->Size()) {
    return Status::Invalid("device " + std::to_string(devid) + " (" + dev->Name() + ") has " +
                           std::to_string(dev->Size()) + " bytes, fewer than " + std::to_string(bytes));
  }
  const Key dev_key{kDevItemsObjectid, kDevItemKey, devid};
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, txn_->Writer(kChunkTreeObjectid));
  UB_ASSIGN_OR_RETURN(std::vector<uint8_t> item, DevItemBytes(devid));
  auto* di = reinterpret_cast<DevItem*>(item.data());
  const uint64_t old_total = di->total_bytes.get();
  di->total_bytes = bytes;
  UB_RETURN_IF_ERROR(w->Update(dev_key, item));
  if (DevItem* vd = vol->mutable_dev_item(devid)) vd->total_bytes = bytes;
  it->second.item.total_bytes = bytes;
  it->second.end = bytes;
  ca.device_end_ = 0;
  for (const auto& [id, d] : ca.devs_) ca.device_end_ += d.end;
  SuperBlock& sb = vol->mutable_super();
  sb.total_bytes = sb.total_bytes.get() - old_total + bytes;
  if (sb.dev_item.devid.get() == devid) sb.dev_item.total_bytes = bytes;
  vol->mutable_chunks()->set_device_size(devid, std::max(bytes, dev->Size()));
  return Status::Ok();
}

Status DeviceLayout::AddDevice(std::unique_ptr<io::BlockDevice> dev, const std::array<uint8_t, kUuidSize>& uuid,
                               uint64_t* devid) {
  Volume* vol = txn_->vol_;
  ChunkAllocator& ca = *txn_->chunk_alloc_;
  const uint32_t ss = vol->sectorsize();
  uint64_t id = 1;
  for (const auto& [d, item] : vol->dev_items()) id = std::max(id, d + 1);
  const uint64_t size = RoundDown(dev->Size(), ss);
  DevItem item{};
  item.devid = id;
  item.total_bytes = size;
  item.bytes_used = 0;
  item.io_align = ss;
  item.io_width = ss;
  item.sector_size = ss;
  std::memcpy(item.uuid, uuid.data(), kUuidSize);
  // The filesystem's (metadata) uuid, as every other DEV_ITEM carries it.
  std::memcpy(item.fsid, vol->dev_items().begin()->second.fsid, kUuidSize);
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, txn_->Writer(kChunkTreeObjectid));
  const auto* bytes = reinterpret_cast<const uint8_t*>(&item);
  UB_RETURN_IF_ERROR(w->Insert(Key{kDevItemsObjectid, kDevItemKey, id}, std::vector<uint8_t>(bytes, bytes + sizeof item)));
  SuperBlock& sb = vol->mutable_super();
  sb.num_devices = sb.num_devices.get() + 1;
  sb.total_bytes = sb.total_bytes.get() + size;
  UB_RETURN_IF_ERROR(vol->AddDevice(std::move(dev), item));
  ChunkAllocator::Dev& d = ca.devs_[id];
  d.item = item;
  d.end = size;
  ca.device_end_ += size;
  *devid = id;
  return Status::Ok();
}

Status DeviceLayout::NoSuchDevice(uint64_t devid) const {
  std::string ids;
  for (const auto& [d, item] : txn_->vol_->dev_items()) ids += (ids.empty() ? "" : ", ") + std::to_string(d);
  return Status::Invalid("the filesystem has no device " + std::to_string(devid) + " (its devices: " + ids + ")");
}

Status DeviceLayout::CheckRemovable(uint64_t devid) const {
  Volume* vol = txn_->vol_;
  if (!vol->dev_items().count(devid)) return NoSuchDevice(devid);
  const uint64_t num = vol->super().num_devices.get();
  if (num <= 1) return Status::Invalid("unable to remove the only device of the filesystem");
  std::set<uint64_t> profiles;
  for (const auto& [logical, c] : vol->chunks().chunks()) profiles.insert(c.profile());
  for (uint64_t p : profiles) {
    const uint32_t min = alloc::RuleFor(p).devs_min;
    if (num - 1 < min) {
      std::string name = alloc::ProfileName(p);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return Status::Invalid("unable to go below " + std::to_string(min) + " devices on " + name + ": the filesystem has " +
                             alloc::ProfileName(p) + " chunks and " + std::to_string(num) + " devices");
    }
  }
  return Status::Ok();
}

Status DeviceLayout::CheckRebuildable(const Stripe& s) const {
  Volume* vol = txn_->vol_;
  if (vol->devices().Has(s.devid)) return Status::Ok();
  const alloc::ChunkInfo* ci = vol->chunks().Find(s.logical);
  if (!ci) return Status::Invalid("no chunk at " + std::to_string(s.logical));
  const std::string why = alloc::WhyNotRebuildable(*ci, vol->devices());
  if (why.empty()) return Status::Ok();
  uint64_t used = 0;
  txn_->space_->ForEachGroup([&](const alloc::BlockGroup& g) {
    if (g.start() == s.logical) used = g.used_bytes();
  });
  // An unused chunk loses nothing: it moves as it is.
  if (used == 0) return Status::Ok();
  return Status::Invalid(why + ": its " + std::to_string(used) + " bytes in use cannot be rebuilt from the devices " +
                         "present, so device " + std::to_string(s.devid) + "'s stripes cannot be made again");
}

void DeviceLayout::TrackMissing(uint64_t devid) {
  ChunkAllocator& ca = *txn_->chunk_alloc_;
  const auto item = txn_->vol_->dev_items().find(devid);
  if (ca.devs_.count(devid) || item == txn_->vol_->dev_items().end()) return;
  ChunkAllocator::Dev& gone = ca.devs_[devid];
  gone.item = item->second;
  gone.end = 0;
  gone.bytes_used = item->second.bytes_used.get();
}

void DeviceLayout::AllocateAs(uint64_t kind, uint64_t profile) {
  txn_->chunk_alloc_->profile_[std::countr_zero(kind & kBlockGroupTypeMask) % 3] = profile;
}

void DeviceLayout::StopAllocating(uint64_t devid) {
  auto it = txn_->chunk_alloc_->devs_.find(devid);
  if (it != txn_->chunk_alloc_->devs_.end()) it->second.end = 0;  // no free range left on it
}

// Present devices other than `leaving`, the ones with the largest free
// range first, and that free range.
std::vector<std::pair<uint64_t, uint64_t>> DeviceLayout::OtherDevices(uint64_t leaving) const {
  const ChunkAllocator& ca = *txn_->chunk_alloc_;
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& [id, d] : ca.devs_) {
    if (id == leaving || !txn_->vol_->devices().Has(id)) continue;
    uint64_t largest = 0;
    for (auto [hs, hl] : ca.FreeRanges(d)) largest = std::max(largest, hl);
    out.push_back({id, largest});
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::vector<uint64_t> DeviceLayout::HomesFor(const Stripe& s, uint64_t leaving) const {
  std::vector<uint64_t> out;
  const alloc::ChunkInfo* ci = txn_->vol_->chunks().Find(s.logical);
  if (!ci) return out;
  std::set<uint64_t> holding;
  for (size_t i = 0; i < ci->stripes.size(); ++i) {
    if (i != s.index) holding.insert(ci->stripes[i].devid);
  }
  for (auto [id, largest] : OtherDevices(leaving)) {
    if (ci->profile() == kBlockGroupDup) {
      // Both copies on one device: the other copy's, once it has left.
      if (!holding.count(leaving) && !holding.count(id)) continue;
    } else if (holding.count(id)) {
      continue;
    }
    out.push_back(id);
  }
  return out;
}

bool DeviceLayout::NeedsRestripe(const Stripe& s, uint64_t leaving) const {
  return Restripable(s.type & kBlockGroupProfileMask) && HomesFor(s, leaving).empty();
}

Status DeviceLayout::FindNewHome(const Stripe& s, uint64_t leaving, uint64_t* devid, uint64_t* to) const {
  const ChunkAllocator& ca = *txn_->chunk_alloc_;
  const alloc::ChunkInfo* ci = txn_->vol_->chunks().Find(s.logical);
  if (!ci) return Status::Invalid("no chunk at " + std::to_string(s.logical));
  const std::vector<uint64_t> cands = HomesFor(s, leaving);
  for (uint64_t c : cands) {
    const uint64_t place = FindPlace(s, c, ca.devs_.at(c).end);
    if (place != 0) {
      *devid = c;
      *to = place;
      return Status::Ok();
    }
  }
  const std::string what = "the " + alloc::ProfileName(ci->type) + " chunk at logical " + std::to_string(s.logical) +
                           " (" + std::to_string(ci->stripes.size()) + " stripes of " +
                           std::to_string(s.length >> 20) + " MiB)";
  if (cands.empty()) {
    return Status::Invalid(what + " has a stripe on every other device already: no device to move it to");
  }
  return Status::Error(ENOSPC, what + ": no room for its stripe on the other devices");
}

Status DeviceLayout::RemoveDevice(uint64_t devid, std::unique_ptr<io::BlockDevice>* out) {
  Volume* vol = txn_->vol_;
  ChunkAllocator& ca = *txn_->chunk_alloc_;
  UB_RETURN_IF_ERROR(CheckRemovable(devid));
  for (const Stripe& s : Stripes()) {
    if (s.devid == devid) {
      return Status::Invalid("device " + std::to_string(devid) + " still holds a stripe of chunk " +
                             std::to_string(s.logical));
    }
  }
  const DevItem item = vol->dev_items().at(devid);
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * chunk_w, txn_->Writer(kChunkTreeObjectid));
  UB_RETURN_IF_ERROR(chunk_w->Delete(Key{kDevItemsObjectid, kDevItemKey, devid}));
  // The kernel's error counters for the device, if it kept any.
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * dev_w, txn_->Writer(kDevTreeObjectid));
  const Key stats{kDevStatsObjectid, kPersistentItemKey, devid};
  UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(txn_->source(), dev_w->LiveRef(), stats));
  if (have) UB_RETURN_IF_ERROR(dev_w->Delete(stats));
  SuperBlock& sb = vol->mutable_super();
  sb.num_devices = sb.num_devices.get() - 1;
  sb.total_bytes = sb.total_bytes.get() - std::min(sb.total_bytes.get(), item.total_bytes.get());
  auto it = ca.devs_.find(devid);
  if (it != ca.devs_.end()) {
    ca.device_end_ -= std::min(ca.device_end_, it->second.end);
    ca.devs_.erase(it);
  }
  *out = vol->RemoveDevice(devid);
  if (sb.dev_item.devid.get() == devid) {
    // The superblock's own DEV_ITEM: each device's is filled in as it is
    // written; start from the lowest remaining one.
    const DevItem& d = vol->dev_items().begin()->second;
    sb.dev_item = d;
    sb.dev_item.generation = 0;
  }
  return Status::Ok();
}

Status DeviceLayout::PlanRestripe(uint64_t logical, uint64_t leaving, RestripePlan* plan) const {
  const alloc::ChunkInfo* ci = txn_->vol_->chunks().Find(logical);
  if (!ci || ci->logical != logical) return Status::Invalid("no chunk at " + std::to_string(logical));
  const uint64_t profile = ci->profile();
  if (!Restripable(profile)) {
    return Status::Invalid("chunk " + std::to_string(logical) +
                           ": only RAID0, RAID10, RAID5 and RAID6 chunks are restriped");
  }
  return PlanLayout(logical, profile, leaving, plan);
}

Status DeviceLayout::PlanLayout(uint64_t logical, uint64_t profile, uint64_t leaving, RestripePlan* plan) const {
  const ChunkAllocator& ca = *txn_->chunk_alloc_;
  const alloc::ChunkInfo* ci = txn_->vol_->chunks().Find(logical);
  if (!ci || ci->logical != logical) return Status::Invalid("no chunk at " + std::to_string(logical));
  const alloc::ProfileRule rule = alloc::RuleFor(profile);
  const std::string what = "the " + alloc::ProfileName(ci->type) + " chunk at logical " + std::to_string(logical) +
                           " (" + std::to_string(ci->length >> 20) + " MiB over " +
                           std::to_string(ci->stripes.size()) + " devices)";
  const auto others = OtherDevices(leaving);
  // Stripe counts to try, the widest first: mirrored profiles and DUP have
  // one; striped ones take as many devices as have room (RAID10 pairs).
  std::vector<size_t> counts;
  const bool dup = profile == kBlockGroupDup;
  if (dup) {
    counts = {2};
  } else if (rule.devs_max != 0) {
    counts = {rule.devs_max};
  } else {
    const size_t step = rule.increment;
    for (size_t m = others.size() - others.size() % step; m >= step && m >= rule.devs_min; m -= step) counts.push_back(m);
  }
  constexpr uint64_t kFar = UINT64_MAX / 4;  // a stripe not placed yet: no superblock in it
  for (size_t m : counts) {
    if (!dup && m > others.size()) continue;
    const uint64_t data = alloc::DataStripesFor(profile, static_cast<uint32_t>(m));
    if (data == 0 || ci->length % (ci->stripe_len * data) != 0) continue;
    const uint64_t size = ci->length / data;
    alloc::ChunkInfo layout = *ci;
    layout.type = (ci->type & ~kBlockGroupProfileMask) | profile;
    layout.sub_stripes = profile == kBlockGroupRaid10 ? 2 : 1;
    layout.stripe_size = size;
    layout.stripes.assign(m, alloc::StripeLoc{0, kFar});
    std::vector<std::pair<uint64_t, uint64_t>> chosen;
    for (auto [id, largest] : others) {
      if (chosen.size() == m) break;
      if (largest < size) continue;
      for (size_t want = dup ? 2 : 1; want > 0 && chosen.size() < m; --want) {
        // Free places on the device, less what this plan took there (DUP).
        std::vector<std::pair<uint64_t, uint64_t>> free;
        for (auto [hs, hl] : ca.FreeRanges(ca.devs_.at(id))) {
          uint64_t s0 = hs;
          const uint64_t e0 = hs + hl;
          for (auto [cid, cto] : chosen) {
            if (cid != id || cto + size <= s0 || cto >= e0) continue;
            if (cto > s0) free.push_back({s0, cto - s0});
            s0 = cto + size;
          }
          if (e0 > s0) free.push_back({s0, e0 - s0});
        }
        std::set<uint64_t> candidates;
        for (auto [hs, hl] : free) {
          if (hl < size) continue;
          candidates.insert(hs);
          for (int mi = 0; mi < kSuperMirrorMax; ++mi) {
            const uint64_t sb = SuperblockOffset(mi);
            if (sb >= hs && sb + kStripeLen + size <= hs + hl) candidates.insert(sb + kStripeLen);
          }
        }
        bool placed = false;
        for (uint64_t to : candidates) {  // (inside `free`: clear of the stripes chosen)
          const size_t k = chosen.size();
          layout.stripes[k] = {id, to};
          if (SuperRangesFree(layout)) {
            chosen.push_back({id, to});
            placed = true;
            break;
          }
          layout.stripes[k] = {0, kFar};
        }
        if (!placed) break;
      }
      if (dup && chosen.size() == 1) chosen.clear();  // both on one device, or neither
    }
    if (chosen.size() == m) {
      plan->stripes = std::move(chosen);
      plan->stripe_size = size;
      return Status::Ok();
    }
  }
  if (leaving != 0) {
    return Status::Invalid(what + " has a stripe on every other device: it must be restriped over the other " +
                           std::to_string(others.size()) + " devices, and they have no room for its new stripes");
  }
  return Status::Error(ENOSPC, what + ": no room for it as " + alloc::ProfileName(profile) + " on the " +
                                   std::to_string(others.size()) + " devices (its new stripes go beside the old ones)");
}

Status DeviceLayout::RestripeOff(uint64_t logical, uint64_t leaving, bool dry_run, CopyStats* copied) {
  RestripePlan plan;
  UB_RETURN_IF_ERROR(PlanRestripe(logical, leaving, &plan));
  if (dry_run) return Status::Ok();
  return Relayout(logical, 0, plan, copied);
}

Status DeviceLayout::ConvertChunk(uint64_t logical, uint64_t profile, CopyStats* copied) {
  RestripePlan plan;
  UB_RETURN_IF_ERROR(PlanLayout(logical, profile, 0, &plan));
  return Relayout(logical, profile == 0 ? kSingle : profile, plan, copied);
}

Status DeviceLayout::Relayout(uint64_t logical, uint64_t profile, const RestripePlan& plan, CopyStats* copied) {
  Volume* vol = txn_->vol_;
  ChunkAllocator& ca = *txn_->chunk_alloc_;
  const alloc::ChunkInfo old = *vol->chunks().Find(logical);
  // kSingle stands for SINGLE (no profile bit); 0 keeps it.
  const uint64_t new_type = profile == 0 ? old.type
                                         : (old.type & ~kBlockGroupProfileMask) |
                                               (profile == kSingle ? 0 : profile);
  const uint32_t sub_stripes = (new_type & kBlockGroupRaid10) ? 2 : 1;
  const std::string where = (new_type == old.type ? "restriping chunk " : "converting chunk ") +
                            std::to_string(logical) + " to " + alloc::ProfileName(new_type) + " over " +
                            std::to_string(plan.stripes.size()) + " stripes";

  // The new chunk item: the old one's fields, the new stripes.
  const Key key{kFirstChunkTreeObjectid, kChunkItemKey, logical};
  UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(txn_->source(), vol->chunk_tree(), key));
  if (!item || item->size() < sizeof(Chunk)) return Status::Corrupt(where + ": no chunk item");
  std::vector<uint8_t> fresh(sizeof(Chunk) + plan.stripes.size() * sizeof(format::Stripe));
  std::memcpy(fresh.data(), item->data(), sizeof(Chunk));
  reinterpret_cast<Chunk*>(fresh.data())->num_stripes = static_cast<uint16_t>(plan.stripes.size());
  reinterpret_cast<Chunk*>(fresh.data())->type = new_type;
  reinterpret_cast<Chunk*>(fresh.data())->sub_stripes = static_cast<uint16_t>(sub_stripes);
  std::vector<alloc::StripeLoc> locs;
  for (size_t i = 0; i < plan.stripes.size(); ++i) {
    auto [devid, phys] = plan.stripes[i];
    auto* st = reinterpret_cast<format::Stripe*>(fresh.data() + sizeof(Chunk) + i * sizeof(format::Stripe));
    st->devid = devid;
    st->offset = phys;
    std::memcpy(st->dev_uuid, vol->dev_items().at(devid).uuid, kUuidSize);
    locs.push_back({devid, phys});
  }
  alloc::ChunkMap next(vol->devices().Sizes());
  UB_RETURN_IF_ERROR(next.AddChunk(logical, fresh, vol->sectorsize()).WithContext(where));

  // The bytes: every used range, read through the old layout (a copy that
  // reads; RAID5/6: the stored data, rebuilt where a device is missing) and
  // written through the new one (every copy; RAID5/6: with the new rows'
  // parity).
  std::vector<std::pair<uint64_t, uint64_t>> used;
  txn_->space_->ForEachGroup([&](const alloc::BlockGroup& g) {
    if (g.start() == logical) g.ForEachUsedExtent([&](uint64_t a, uint64_t l) { used.push_back({a, l}); });
  });
  alloc::ChunkIo next_io(&next, &vol->devices());
  std::vector<uint8_t> buf;
  for (auto [a, l] : used) {
    for (uint64_t off = 0; off < l;) {
      const uint64_t n = std::min(kCopyBytes, l - off);
      buf.resize(n);
      UB_RETURN_IF_ERROR(alloc::ReadFromAnyCopy(vol->chunk_io(), a + off, buf).WithContext(where));
      VerifyCopy(*vol, a + off, buf, &copied->check);
      UB_RETURN_IF_ERROR(next_io.Write(a + off, buf).WithContext(where));
      copied->bytes += n;
      off += n;
    }
  }

  // Superblock stripes of the new layout leave use (PlanLayout made sure
  // they are free).
  alloc::ChunkInfo layout = old;
  layout.type = new_type;
  layout.sub_stripes = sub_stripes;
  layout.stripes = locs;
  layout.stripe_size = plan.stripe_size;
  for (auto [start, len] : NewSuperRanges(layout)) {
    UB_RETURN_IF_ERROR(txn_->space_->MarkUsed(start, len).WithContext(where + ": superblock stripe"));
    txn_->excluded_[logical] += len;
    txn_->excluded_ranges_.push_back({start, len});
  }

  // The items: chunk item (and the superblock's copy of a system chunk),
  // dev extents, bytes_used.
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * chunk_w, txn_->Writer(kChunkTreeObjectid));
  UB_RETURN_IF_ERROR(chunk_w->Delete(key));
  UB_RETURN_IF_ERROR(chunk_w->Insert(key, fresh));
  if (old.type & kBlockGroupSystem) {
    SuperBlock& sb = vol->mutable_super();
    const uint32_t size = sb.sys_chunk_array_size.get();
    std::vector<uint8_t> array;
    for (uint32_t at = 0; at + sizeof(DiskKey) + sizeof(Chunk) <= size;) {
      DiskKey dk;
      std::memcpy(&dk, sb.sys_chunk_array + at, sizeof dk);
      const auto* ch = reinterpret_cast<const Chunk*>(sb.sys_chunk_array + at + sizeof dk);
      const size_t len = sizeof(Chunk) + size_t{ch->num_stripes.get()} * sizeof(format::Stripe);
      if (at + sizeof dk + len > size) break;
      const uint8_t* entry = sb.sys_chunk_array + at;
      array.insert(array.end(), entry, entry + sizeof dk);
      if (dk.offset.get() == logical) {
        array.insert(array.end(), fresh.begin(), fresh.end());
      } else {
        array.insert(array.end(), entry + sizeof dk, entry + sizeof dk + len);
      }
      at += static_cast<uint32_t>(sizeof dk + len);
    }
    if (array.size() > kSystemChunkArraySize) return Status::Error(ENOSPC, where + ": the system chunk array is full");
    std::memset(sb.sys_chunk_array, 0, kSystemChunkArraySize);
    std::memcpy(sb.sys_chunk_array, array.data(), array.size());
    sb.sys_chunk_array_size = static_cast<uint32_t>(array.size());
  }
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * dev_w, txn_->Writer(kDevTreeObjectid));
  const Key first{old.stripes[0].devid, kDevExtentKey, old.stripes[0].physical};
  UB_ASSIGN_OR_RETURN(auto de, tree::LookupItem(txn_->source(), dev_w->LiveRef(), first));
  if (!de || de->size() < sizeof(DevExtent)) return Status::Corrupt(where + ": no dev extent " + KeyToString(first));
  std::set<uint64_t> touched;
  for (const alloc::StripeLoc& st : old.stripes) {
    TrackMissing(st.devid);
    UB_RETURN_IF_ERROR(dev_w->Delete(Key{st.devid, kDevExtentKey, st.physical}));
    auto it = ca.devs_.find(st.devid);
    if (it != ca.devs_.end()) {
      it->second.extents.erase(st.physical);
      it->second.bytes_used -= std::min(it->second.bytes_used, old.stripe_size);
    }
    touched.insert(st.devid);
  }
  reinterpret_cast<DevExtent*>(de->data())->length = plan.stripe_size;
  for (const alloc::StripeLoc& st : locs) {
    UB_RETURN_IF_ERROR(dev_w->Insert(Key{st.devid, kDevExtentKey, st.physical}, *de));
    ChunkAllocator::Dev& d = ca.devs_[st.devid];
    d.extents[st.physical] = plan.stripe_size;
    d.bytes_used += plan.stripe_size;
    touched.insert(st.devid);
  }
  UB_RETURN_IF_ERROR(ca.WriteBytesUsed(touched).WithContext(where));
  if (new_type != old.type) {
    // The block group item carries the profile too; and the features the
    // kernel wants named for the new one.
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * bg_w, txn_->Writer(txn_->block_group_tree()));
    const Key bg_key{logical, kBlockGroupItemKey, old.length};
    UB_ASSIGN_OR_RETURN(auto bg, tree::LookupItem(txn_->source(), bg_w->LiveRef(), bg_key));
    if (!bg || bg->size() < sizeof(BlockGroupItem)) {
      return Status::Corrupt(where + ": no block group item " + KeyToString(bg_key));
    }
    reinterpret_cast<BlockGroupItem*>(bg->data())->flags = new_type;
    UB_RETURN_IF_ERROR(bg_w->Update(bg_key, *bg));
    UB_RETURN_IF_ERROR(txn_->space_->SetFlags(logical, new_type).WithContext(where));
    SuperBlock& sb = vol->mutable_super();
    if (new_type & (kBlockGroupRaid5 | kBlockGroupRaid6)) sb.incompat_flags = sb.incompat_flags.get() | kIncompatRaid56;
    if (new_type & (kBlockGroupRaid1c3 | kBlockGroupRaid1c4)) {
      sb.incompat_flags = sb.incompat_flags.get() | kIncompatRaid1c34;
    }
  }
  // From here on, blocks of this transaction go to the new stripes only.
  return vol->mutable_chunks()->SetStripes(logical, locs, plan.stripe_size, new_type, sub_stripes);
}

Status RemoveDeviceCommitted(TxnManager* txn, uint64_t devid, RemoveStats* stats) {
  DeviceLayout layout(txn);
  UB_RETURN_IF_ERROR(layout.CheckRemovable(devid));
  // Every stripe on the device moves first, one commit each (largest
  // first: they are the hardest to place), and nothing new goes there.
  // Each stripe's new home is checked before anything moves.
  layout.StopAllocating(devid);
  bool checked = false;
  for (;;) {
    std::vector<DeviceLayout::Stripe> on;
    for (const auto& s : layout.Stripes()) {
      if (s.devid == devid) on.push_back(s);
    }
    if (on.empty()) break;
    for (const auto& s : on) {
      if (checked) break;
      UB_RETURN_IF_ERROR(layout.CheckRebuildable(s));
      uint64_t id = 0, to = 0;
      if (layout.NeedsRestripe(s, devid)) {
        UB_RETURN_IF_ERROR(layout.RestripeOff(s.logical, devid, /*dry_run=*/true, nullptr));
      } else {
        UB_RETURN_IF_ERROR(layout.FindNewHome(s, devid, &id, &to));
      }
    }
    checked = true;
    std::stable_sort(on.begin(), on.end(), [](const auto& a, const auto& b) { return a.length > b.length; });
    const auto& s = on.front();
    if (layout.NeedsRestripe(s, devid)) {
      // A striped chunk on every other device already: over fewer devices.
      UB_RETURN_IF_ERROR(layout.RestripeOff(s.logical, devid, /*dry_run=*/false, &stats->copied));
      ++stats->chunks_restriped;
    } else {
      uint64_t to_dev = 0, to = 0;
      UB_RETURN_IF_ERROR(layout.FindNewHome(s, devid, &to_dev, &to));
      UB_RETURN_IF_ERROR(layout.MoveStripe(s.logical, s.index, to_dev, to, &stats->copied));
      ++stats->stripes_moved;
    }
    UB_RETURN_IF_ERROR(txn->Commit());
  }
  std::unique_ptr<io::BlockDevice> gone;
  UB_RETURN_IF_ERROR(layout.RemoveDevice(devid, &gone));
  UB_RETURN_IF_ERROR(txn->Commit());
  if (gone) UB_RETURN_IF_ERROR(ScratchSuperblocks(*gone));
  return Status::Ok();
}

Status ScratchSuperblocks(io::BlockDevice& dev) {
  const std::vector<uint8_t> zero(sizeof(uint64_t), 0);
  for (int m = 0; m < kSuperMirrorMax; ++m) {
    const uint64_t off = SuperblockOffset(m);
    if (off + kSuperInfoSize > dev.Size()) break;
    UB_RETURN_IF_ERROR(dev.WriteAt(off + offsetof(SuperBlock, magic), zero));
  }
  return dev.Flush();
}

}  // namespace ubtrfs::txn
