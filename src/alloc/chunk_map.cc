#include "alloc/chunk_map.h"

#include <algorithm>
#include <bit>
#include <set>

#include "format/ondisk.h"

namespace ubtrfs::alloc {

using namespace ubtrfs::format;

std::string ProfileName(uint64_t type) {
  uint64_t p = type & kBlockGroupProfileMask;
  switch (p) {
    case 0: return "single";
    case kBlockGroupDup: return "DUP";
    case kBlockGroupRaid0: return "RAID0";
    case kBlockGroupRaid1: return "RAID1";
    case kBlockGroupRaid10: return "RAID10";
    case kBlockGroupRaid5: return "RAID5";
    case kBlockGroupRaid6: return "RAID6";
    case kBlockGroupRaid1c3: return "RAID1C3";
    case kBlockGroupRaid1c4: return "RAID1C4";
    default: return "mixed profile bits";
  }
}

// The kernel's btrfs_raid_array, as far as placement and validation use it.
ProfileRule RuleFor(uint64_t profile) {
  switch (profile & kBlockGroupProfileMask) {
    case kBlockGroupDup: return {1, 1, 1, 2, 0};
    case kBlockGroupRaid0: return {1, 0, 1, 1, 0};
    case kBlockGroupRaid1: return {2, 2, 2, 2, 0};
    case kBlockGroupRaid1c3: return {3, 3, 3, 3, 0};
    case kBlockGroupRaid1c4: return {4, 4, 4, 4, 0};
    case kBlockGroupRaid10: return {2, 0, 2, 2, 0};
    case kBlockGroupRaid5: return {2, 0, 1, 1, 1};
    case kBlockGroupRaid6: return {3, 0, 1, 1, 2};
    default: return {1, 1, 1, 1, 0};
  }
}

uint64_t ChunkInfo::profile() const { return type & kBlockGroupProfileMask; }

uint32_t ChunkInfo::mirrors() const {
  switch (profile()) {
    case kBlockGroupDup:
    case kBlockGroupRaid1:
    case kBlockGroupRaid1c3:
    case kBlockGroupRaid1c4: return static_cast<uint32_t>(stripes.size());
    case kBlockGroupRaid10: return sub_stripes;
    default: return 1;
  }
}

uint32_t ChunkInfo::parity_stripes() const { return RuleFor(profile()).parity; }

uint32_t DataStripesFor(uint64_t profile, uint32_t n, uint32_t sub_stripes) {
  switch (profile & kBlockGroupProfileMask) {
    case kBlockGroupRaid0: return n;
    case kBlockGroupRaid10: return sub_stripes ? n / sub_stripes : 0;
    case kBlockGroupRaid5: return n >= 1 ? n - 1 : 0;
    case kBlockGroupRaid6: return n >= 2 ? n - 2 : 0;
    default: return 1;
  }
}

uint32_t ChunkInfo::data_stripes() const {
  return DataStripesFor(profile(), static_cast<uint32_t>(stripes.size()), sub_stripes);
}

Status ChunkMap::AddChunk(uint64_t logical, std::span<const uint8_t> item, uint32_t sectorsize) {
  const std::string where = "chunk at logical " + std::to_string(logical);
  if (item.size() < sizeof(Chunk) + sizeof(Stripe)) return Status::Corrupt(where + ": item too small");
  const auto* c = reinterpret_cast<const Chunk*>(item.data());
  const uint32_t nstripes = c->num_stripes.get();
  if (nstripes == 0 || item.size() != sizeof(Chunk) + size_t{nstripes} * sizeof(Stripe)) {
    return Status::Corrupt(where + ": item size " + std::to_string(item.size()) + " does not fit " +
                           std::to_string(nstripes) + " stripes");
  }
  const uint64_t length = c->length.get();
  const uint64_t type = c->type.get();
  if (length == 0 || length % sectorsize != 0 || logical % sectorsize != 0 || logical + length < logical) {
    return Status::Corrupt(where + ": bad length " + std::to_string(length));
  }
  if ((type & kBlockGroupTypeMask) == 0) return Status::Corrupt(where + ": no DATA/METADATA/SYSTEM type");
  const uint64_t profile = type & kBlockGroupProfileMask;
  if (!std::has_single_bit(profile) && profile != 0) {
    return Status::Corrupt(where + ": conflicting profile bits " + std::to_string(profile));
  }
  const std::string pname = ProfileName(type);
  const ProfileRule rule = RuleFor(profile);
  const uint32_t sub = c->sub_stripes.get();
  // What the kernel's btrfs_check_chunk_valid refuses, so that every later
  // division and modulo below has a sane divisor.
  bool bad_count = nstripes < rule.devs_min || (rule.devs_max != 0 && nstripes != rule.devs_max);
  if (profile == kBlockGroupRaid10) bad_count = bad_count || sub != 2 || nstripes % 2 != 0;
  if (profile == 0) bad_count = nstripes != 1;
  if (profile == kBlockGroupDup) bad_count = nstripes != 2;
  if (bad_count) {
    return Status::Corrupt(where + ": " + pname + " chunk with " + std::to_string(nstripes) + " stripes" +
                           (profile == kBlockGroupRaid10 ? " and " + std::to_string(sub) + " sub-stripes" : ""));
  }
  const uint64_t stripe_len = c->stripe_len.get();
  if (!std::has_single_bit(stripe_len) || stripe_len < sectorsize || stripe_len > (16u << 20)) {
    return Status::Corrupt(where + ": stripe length " + std::to_string(stripe_len));
  }
  ChunkInfo info;
  info.logical = logical;
  info.length = length;
  info.type = type;
  info.stripe_len = stripe_len;
  info.sub_stripes = profile == kBlockGroupRaid10 ? 2 : 1;
  const auto* stripes = reinterpret_cast<const Stripe*>(item.data() + sizeof(Chunk));
  for (uint32_t i = 0; i < nstripes; ++i) info.stripes.push_back({stripes[i].devid.get(), stripes[i].offset.get()});
  const uint32_t factor = info.data_stripes();
  if (factor == 0 || length % factor != 0 || (length / factor) % sectorsize != 0) {
    return Status::Corrupt(where + ": length " + std::to_string(length) + " does not split into " +
                           std::to_string(factor) + " " + pname + " stripes");
  }
  info.stripe_size = length / factor;
  for (uint32_t i = 0; i < nstripes; ++i) {
    const uint64_t phys = info.stripes[i].physical;
    auto dev = device_sizes_.find(info.stripes[i].devid);
    if (phys + info.stripe_size < phys) return Status::Corrupt(where + ": stripe " + std::to_string(i) + " wraps");
    if (dev != device_sizes_.end() && phys + info.stripe_size > dev->second) {
      return Status::Corrupt(where + ": stripe " + std::to_string(i) + " [" + std::to_string(phys) + ", +" +
                             std::to_string(info.stripe_size) + ") lies beyond the end of the device (device " +
                             std::to_string(info.stripes[i].devid) + ", " + std::to_string(dev->second) +
                             " bytes; truncated image?)");
    }
  }

  std::unique_lock lock(mu_);
  auto it = chunks_.find(logical);
  if (it != chunks_.end()) {
    const ChunkInfo& o = it->second;
    if (o.length == info.length && o.stripes == info.stripes && o.type == info.type &&
        o.stripe_len == info.stripe_len) {
      return Status::Ok();
    }
    return Status::Corrupt(where + ": conflicting duplicate chunk");
  }
  auto next = chunks_.lower_bound(logical);
  if (next != chunks_.end() && next->first < logical + length) {
    return Status::Corrupt(where + ": overlaps chunk at " + std::to_string(next->first));
  }
  if (next != chunks_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.length > logical) {
      return Status::Corrupt(where + ": overlaps chunk at " + std::to_string(prev->first));
    }
  }
  chunks_.emplace(logical, std::move(info));
  return Status::Ok();
}

Status ChunkMap::SetLength(uint64_t logical, uint64_t length) {
  std::unique_lock lock(mu_);
  auto it = chunks_.find(logical);
  if (it == chunks_.end()) return Status::NotFound("no chunk at logical " + std::to_string(logical));
  if (length == 0 || length > it->second.length) {
    return Status::Invalid("chunk at logical " + std::to_string(logical) + ": cannot set length " +
                           std::to_string(length) + " (now " + std::to_string(it->second.length) + ")");
  }
  it->second.length = length;
  it->second.stripe_size = length / std::max<uint32_t>(1, it->second.data_stripes());
  return Status::Ok();
}

Status ChunkMap::RemoveChunk(uint64_t logical) {
  std::unique_lock lock(mu_);
  auto it = chunks_.find(logical);
  if (it == chunks_.end()) return Status::NotFound("no chunk at logical " + std::to_string(logical));
  removed_.push_back(chunks_.extract(it));
  return Status::Ok();
}

Status ChunkMap::SetStripes(uint64_t logical, std::vector<StripeLoc> stripes, uint64_t stripe_size, uint64_t type,
                            uint32_t sub_stripes) {
  std::unique_lock lock(mu_);
  auto it = chunks_.find(logical);
  if (it == chunks_.end()) return Status::NotFound("no chunk at logical " + std::to_string(logical));
  if (stripes.empty()) return Status::Invalid("chunk at logical " + std::to_string(logical) + ": no stripes");
  it->second.stripes = std::move(stripes);
  it->second.stripe_size = stripe_size;
  if (type != 0) {
    it->second.type = type;
    it->second.sub_stripes = sub_stripes;
  }
  return Status::Ok();
}

Status ChunkMap::SetStripe(uint64_t logical, size_t index, uint64_t physical, uint64_t devid) {
  std::unique_lock lock(mu_);
  auto it = chunks_.find(logical);
  if (it == chunks_.end()) return Status::NotFound("no chunk at logical " + std::to_string(logical));
  if (index >= it->second.stripes.size()) {
    return Status::Invalid("chunk at logical " + std::to_string(logical) + " has no stripe " + std::to_string(index));
  }
  it->second.stripes[index].physical = physical;
  if (devid != 0) it->second.stripes[index].devid = devid;
  return Status::Ok();
}

const ChunkInfo* ChunkMap::Find(uint64_t logical) const {
  std::shared_lock lock(mu_);
  auto it = chunks_.upper_bound(logical);
  if (it == chunks_.begin()) return nullptr;
  --it;
  if (logical - it->first >= it->second.length) return nullptr;
  return &it->second;
}

Result<std::vector<std::vector<Piece>>> ChunkMap::Map(uint64_t logical, uint64_t len) const {
  const ChunkInfo* c = Find(logical);
  if (c == nullptr) {
    return Status::Corrupt("logical address " + std::to_string(logical) + " is not in any chunk");
  }
  const uint64_t off = logical - c->logical;
  if (len > c->length - off) {
    return Status::Corrupt("range [" + std::to_string(logical) + ", +" + std::to_string(len) +
                           ") crosses the end of chunk " + std::to_string(c->logical));
  }
  const uint64_t profile = c->profile();
  std::vector<std::vector<Piece>> out;
  if (profile == 0 || profile == kBlockGroupDup || profile == kBlockGroupRaid1 || profile == kBlockGroupRaid1c3 ||
      profile == kBlockGroupRaid1c4) {
    for (const StripeLoc& s : c->stripes) out.push_back({Piece{s.devid, s.physical + off, len, 0}});
    return out;
  }
  // Striped: element e of the chunk (stripe_len bytes each) sits in row
  // e / per_row at position e % per_row.
  const uint64_t sl = c->stripe_len;
  const uint32_t per_row = c->data_stripes();
  const uint32_t ncopies = profile == kBlockGroupRaid10 ? c->sub_stripes : 1;
  const uint32_t nstripes = static_cast<uint32_t>(c->stripes.size());
  out.resize(ncopies);
  for (uint64_t done = 0; done < len;) {
    const uint64_t at = off + done;
    const uint64_t elem = at / sl, in = at % sl;
    const uint64_t row = elem / per_row;
    const uint32_t pos = static_cast<uint32_t>(elem % per_row);
    const uint64_t n = std::min(sl - in, len - done);
    for (uint32_t m = 0; m < ncopies; ++m) {
      uint32_t idx;
      if (profile == kBlockGroupRaid10) {
        idx = pos * c->sub_stripes + m;
      } else if (profile == kBlockGroupRaid0) {
        idx = pos;
      } else {  // RAID5/6: the data of row r starts at stripe r % n (parity rotates)
        idx = static_cast<uint32_t>((pos + row) % nstripes);
      }
      const StripeLoc& s = c->stripes[idx];
      std::vector<Piece>& copy = out[m];
      const uint64_t phys = s.physical + row * sl + in;
      if (!copy.empty() && copy.back().devid == s.devid && copy.back().physical + copy.back().length == phys) {
        copy.back().length += n;
      } else {
        copy.push_back(Piece{s.devid, phys, n, done});
      }
    }
    done += n;
  }
  return out;
}

Result<std::vector<uint64_t>> ChunkMap::MapPhysical(uint64_t logical, uint64_t len) const {
  UB_ASSIGN_OR_RETURN(auto copies, Map(logical, len));
  std::vector<uint64_t> out;
  for (const auto& c : copies) {
    if (c.size() != 1) {
      return Status::Invalid("range [" + std::to_string(logical) + ", +" + std::to_string(len) +
                             ") is split over stripes");
    }
    out.push_back(c[0].physical);
  }
  return out;
}

std::vector<std::pair<uint64_t, uint64_t>> SuperblockRanges(const ChunkInfo& c) {
  std::set<std::pair<uint64_t, uint64_t>> ranges;
  const uint64_t sl = c.stripe_len ? c.stripe_len : 65536;
  const uint64_t profile = c.profile();
  const uint32_t n = static_cast<uint32_t>(c.stripes.size());
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t p = c.stripes[i].physical;
    for (int m = 0; m < kSuperMirrorMax; ++m) {
      const uint64_t sb = SuperblockOffset(m);
      if (sb < p || sb - p >= c.stripe_size) continue;
      const uint64_t row = (sb - p) / sl;
      uint64_t start, len = sl;
      if (profile == kBlockGroupRaid0) {
        start = (row * n + i) * sl;
      } else if (profile == kBlockGroupRaid10) {
        start = (row * n + i) / c.sub_stripes * sl;
      } else if (profile == kBlockGroupRaid5 || profile == kBlockGroupRaid6) {
        len = sl * c.data_stripes();
        start = row * len;
      } else {
        start = row * sl;
      }
      if (start >= c.length) continue;
      ranges.insert({c.logical + start, std::min(len, c.length - start)});
    }
  }
  return {ranges.begin(), ranges.end()};
}

}  // namespace ubtrfs::alloc
