#include "alloc/chunk_map.h"

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
  if (profile != 0 && profile != kBlockGroupDup) {
    return Status::Unsupported(where + ": " + ProfileName(type) + " profile (only single and DUP)");
  }
  const uint32_t want = profile == kBlockGroupDup ? 2 : 1;
  if (nstripes != want) {
    return Status::Corrupt(where + ": " + ProfileName(type) + " chunk with " + std::to_string(nstripes) + " stripes");
  }
  ChunkInfo info{logical, length, type, {}};
  const auto* stripes = reinterpret_cast<const Stripe*>(item.data() + sizeof(Chunk));
  for (uint32_t i = 0; i < nstripes; ++i) {
    if (stripes[i].devid.get() != devid_) {
      return Status::Unsupported(where + ": stripe on device " + std::to_string(stripes[i].devid.get()) +
                                 " (multi-device filesystems are not supported; this device is " +
                                 std::to_string(devid_) + ")");
    }
    uint64_t phys = stripes[i].offset.get();
    if (phys + length < phys || phys + length > device_size_) {
      return Status::Corrupt(where + ": stripe " + std::to_string(i) + " [" + std::to_string(phys) + ", +" +
                             std::to_string(length) + ") lies beyond the end of the device (" +
                             std::to_string(device_size_) + " bytes; truncated image?)");
    }
    info.physical.push_back(phys);
  }

  std::unique_lock lock(mu_);
  auto it = chunks_.find(logical);
  if (it != chunks_.end()) {
    if (it->second.length == info.length && it->second.physical == info.physical && it->second.type == info.type) {
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
  return Status::Ok();
}

Status ChunkMap::SetStripe(uint64_t logical, size_t index, uint64_t physical) {
  std::unique_lock lock(mu_);
  auto it = chunks_.find(logical);
  if (it == chunks_.end()) return Status::NotFound("no chunk at logical " + std::to_string(logical));
  if (index >= it->second.physical.size()) {
    return Status::Invalid("chunk at logical " + std::to_string(logical) + " has no stripe " + std::to_string(index));
  }
  it->second.physical[index] = physical;
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

Result<std::vector<uint64_t>> ChunkMap::Map(uint64_t logical, uint64_t len) const {
  const ChunkInfo* c = Find(logical);
  if (c == nullptr) {
    return Status::Corrupt("logical address " + std::to_string(logical) + " is not in any chunk");
  }
  const uint64_t off = logical - c->logical;
  if (len > c->length - off) {
    return Status::Corrupt("range [" + std::to_string(logical) + ", +" + std::to_string(len) +
                           ") crosses the end of chunk " + std::to_string(c->logical));
  }
  std::vector<uint64_t> out;
  out.reserve(c->physical.size());
  for (uint64_t p : c->physical) out.push_back(p + off);
  return out;
}

}  // namespace ubtrfs::alloc
