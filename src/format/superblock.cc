#include "format/superblock.h"

#include <cstdio>
#include <cstring>
#include <tuple>

#include "format/checksum.h"

namespace ubtrfs::format {
namespace {

bool IsPow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string FlagNames(uint64_t flags, const char* const* names, int count) {
  std::string out;
  for (int bit = 0; bit < 64; ++bit) {
    if (!(flags & (1ULL << bit))) continue;
    if (!out.empty()) out += ", ";
    out += bit < count && names[bit] ? names[bit] : "bit " + std::to_string(bit);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string IncompatNames(uint64_t flags) {
  static const char* const kNames[] = {
      "mixed-backref", "default-subvol", "mixed-groups", "compress-lzo", "compress-zstd",
      "big-metadata",  "extended-iref",  "raid56",       "skinny-metadata", "no-holes",
      "metadata-uuid", "raid1c34",       "zoned",        "extent-tree-v2", "raid-stripe-tree",
      nullptr,         "simple-quota"};
  return FlagNames(flags, kNames, sizeof kNames / sizeof kNames[0]);
}

std::string CompatRoNames(uint64_t flags) {
  static const char* const kNames[] = {"free-space-tree", "free-space-tree-valid", "verity",
                                       "block-group-tree"};
  return FlagNames(flags, kNames, 4);
}

int NextBackupRootSlot(const SuperBlock& sb, uint64_t generation) {
  int newest = 0;
  for (int i = 1; i < kNumBackupRoots; ++i) {
    if (sb.super_roots[i].tree_root_gen.get() > sb.super_roots[newest].tree_root_gen.get()) newest = i;
  }
  if (sb.super_roots[newest].tree_root_gen.get() == generation) return newest;
  return (newest + 1) % kNumBackupRoots;
}

const uint8_t* MetadataFsid(const SuperBlock& sb) {
  return (sb.incompat_flags.get() & kIncompatMetadataUuid) ? sb.metadata_uuid : sb.fsid;
}

Status ValidateSuperblock(std::span<const uint8_t> bytes, uint64_t offset) {
  const std::string where = "superblock at " + std::to_string(offset);
  if (bytes.size() < sizeof(SuperBlock)) return Status::Corrupt(where + ": short read");
  const auto& sb = *reinterpret_cast<const SuperBlock*>(bytes.data());
  if (sb.magic.get() != kMagic) {
    return Status::Corrupt(where + ": bad magic " + Hex(sb.magic.get()) + " (expected _BHRfS_M)");
  }
  uint16_t csum_type = sb.csum_type.get();
  if (CsumSize(csum_type) == 0) {
    return Status::Unsupported(where + ": checksum type " + std::to_string(csum_type));
  }
  if (!VerifyCsum(csum_type, bytes.subspan(kCsumSize, kSuperInfoSize - kCsumSize), sb.csum)) {
    return Status::Corrupt(where + ": checksum mismatch (" + CsumTypeName(csum_type) + ")");
  }
  if (sb.bytenr.get() != offset) {
    return Status::Corrupt(where + ": bytenr field says " + std::to_string(sb.bytenr.get()));
  }
  uint32_t sectorsize = sb.sectorsize.get(), nodesize = sb.nodesize.get();
  if (!IsPow2(sectorsize) || sectorsize < 4096 || sectorsize > 65536) {
    return Status::Corrupt(where + ": invalid sectorsize " + std::to_string(sectorsize));
  }
  if (!IsPow2(nodesize) || nodesize < sectorsize || nodesize > 65536) {
    return Status::Corrupt(where + ": invalid nodesize " + std::to_string(nodesize));
  }
  if (sb.stripesize.get() != sectorsize && sb.stripesize.get() != 4096) {
    return Status::Corrupt(where + ": invalid stripesize " + std::to_string(sb.stripesize.get()));
  }
  for (auto [name, val, level] : {std::tuple{"root", sb.root.get(), sb.root_level},
                                  std::tuple{"chunk_root", sb.chunk_root.get(), sb.chunk_root_level}}) {
    if (val == 0 || val % sectorsize != 0) {
      return Status::Corrupt(where + ": " + name + " " + std::to_string(val) + " is not sector aligned");
    }
    if (level >= kMaxLevel) {
      return Status::Corrupt(where + ": " + name + " level " + std::to_string(level) + " is too high");
    }
  }
  if (sb.log_root.get() != 0 && (sb.log_root.get() % sectorsize != 0 || sb.log_root_level >= kMaxLevel)) {
    return Status::Corrupt(where + ": invalid log_root " + std::to_string(sb.log_root.get()));
  }
  if (sb.sys_chunk_array_size.get() > kSystemChunkArraySize) {
    return Status::Corrupt(where + ": sys_chunk_array_size " + std::to_string(sb.sys_chunk_array_size.get()) +
                           " exceeds " + std::to_string(kSystemChunkArraySize));
  }
  if (sb.sys_chunk_array_size.get() < sizeof(DiskKey) + sizeof(Chunk) + sizeof(Stripe)) {
    return Status::Corrupt(where + ": system chunk array is empty");
  }
  if (sb.num_devices.get() == 0) return Status::Corrupt(where + ": num_devices is 0");
  if (sb.total_bytes.get() == 0) return Status::Corrupt(where + ": total_bytes is 0");
  if (sb.generation.get() == 0) return Status::Corrupt(where + ": generation is 0");
  if (std::memcmp(sb.dev_item.fsid, (sb.incompat_flags.get() & kIncompatMetadataUuid) ? sb.metadata_uuid : sb.fsid,
                  kFsidSize) != 0) {
    return Status::Corrupt(where + ": device item fsid does not match the filesystem");
  }
  return Status::Ok();
}

Result<std::vector<SysChunk>> ParseSysChunkArray(const SuperBlock& sb) {
  std::vector<SysChunk> out;
  const uint32_t size = sb.sys_chunk_array_size.get();
  const uint8_t* base = sb.sys_chunk_array;
  uint32_t pos = 0;
  while (pos < size) {
    std::string where = "system chunk array offset " + std::to_string(pos);
    if (size - pos < sizeof(DiskKey)) return Status::Corrupt(where + ": truncated key");
    Key key = Key::From(*reinterpret_cast<const DiskKey*>(base + pos));
    pos += sizeof(DiskKey);
    if (key.type != kChunkItemKey) {
      return Status::Corrupt(where + ": unexpected key " + KeyToString(key) + " (expected CHUNK_ITEM)");
    }
    if (size - pos < sizeof(Chunk) + sizeof(Stripe)) return Status::Corrupt(where + ": truncated chunk");
    const auto* chunk = reinterpret_cast<const Chunk*>(base + pos);
    uint32_t stripes = chunk->num_stripes.get();
    if (stripes == 0) return Status::Corrupt(where + ": chunk with zero stripes");
    uint64_t len = sizeof(Chunk) + uint64_t{stripes} * sizeof(Stripe);
    if (len > size - pos) return Status::Corrupt(where + ": chunk with " + std::to_string(stripes) +
                                                 " stripes overruns the array");
    if (!(chunk->type.get() & kBlockGroupSystem)) {
      return Status::Corrupt(where + ": chunk " + std::to_string(key.offset) + " is not a SYSTEM chunk");
    }
    out.push_back(SysChunk{key, std::vector<uint8_t>(base + pos, base + pos + len)});
    pos += static_cast<uint32_t>(len);
  }
  return out;
}

std::string UuidToString(const uint8_t* u) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return buf;
}

}  // namespace ubtrfs::format
