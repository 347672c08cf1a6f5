// Every field of a superblock copy as text (ubtrfs/inspect.h DumpSuper,
// `ubtrfs inspect dump-super`), in the form `btrfs inspect-internal
// dump-super` prints, so that what reads its output reads ours. It reads
// the copies' bytes only: a device whose chunk tree or trees are gone, or
// whose superblock is damaged, still shows what it says.
#include <fmt/core.h>

#include <cctype>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "inspect/dump_tree.h"
#include "io/offset_device.h"
#include "txn/devices.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs {
namespace {

using namespace ubtrfs::format;

using FlagNames = std::vector<std::pair<uint64_t, const char*>>;

// btrfs-progs' order (not always the bits'), then the flags newer kernels added.
const FlagNames kSuperFlags = {{kHeaderFlagWritten, "WRITTEN"},
                               {kHeaderFlagReloc, "RELOC"},
                               {kSuperFlagChangingFsid, "CHANGING_FSID"},
                               {kSuperFlagSeeding, "SEEDING"},
                               {kSuperFlagMetadump, "METADUMP"},
                               {kSuperFlagMetadumpV2, "METADUMP_V2"},
                               {kSuperFlagChangingFsidV2, "CHANGING_FSID_V2"},
                               {kSuperFlagError, "ERROR"},
                               {kSuperFlagChangingBgTree, "CHANGING_BG_TREE"},
                               {kSuperFlagChangingDataCsum, "CHANGING_DATA_CSUM"},
                               {kSuperFlagChangingMetaCsum, "CHANGING_META_CSUM"}};
const FlagNames kCompatRo = {{kCompatRoFreeSpaceTree, "FREE_SPACE_TREE"},
                             {kCompatRoFreeSpaceTreeValid, "FREE_SPACE_TREE_VALID"},
                             {kCompatRoVerity, "VERITY"},
                             {kCompatRoBlockGroupTree, "BLOCK_GROUP_TREE"}};
const FlagNames kIncompat = {{kIncompatMixedBackref, "MIXED_BACKREF"},
                             {kIncompatDefaultSubvol, "DEFAULT_SUBVOL"},
                             {kIncompatMixedGroups, "MIXED_GROUPS"},
                             {kIncompatCompressLzo, "COMPRESS_LZO"},
                             {kIncompatCompressZstd, "COMPRESS_ZSTD"},
                             {kIncompatBigMetadata, "BIG_METADATA"},
                             {kIncompatExtendedIref, "EXTENDED_IREF"},
                             {kIncompatRaid56, "RAID56"},
                             {kIncompatSkinnyMetadata, "SKINNY_METADATA"},
                             {kIncompatNoHoles, "NO_HOLES"},
                             {kIncompatMetadataUuid, "METADATA_UUID"},
                             {kIncompatRaid1c34, "RAID1C34"},
                             {kIncompatZoned, "ZONED"},
                             {kIncompatExtentTreeV2, "EXTENT_TREE_V2"},
                             {kIncompatRaidStripeTree, "RAID_STRIPE_TREE"},
                             {kIncompatSimpleQuota, "SIMPLE_QUOTA"}};

// "\t\t\t( A |\n\t\t\t  B )", the bits no name covers as "unknown flag: 0x..".
void PrintFlags(std::FILE* out, uint64_t flags, const FlagNames& names) {
  if (flags == 0) return;
  std::vector<std::string> words;
  uint64_t known = 0;
  for (const auto& [bit, name] : names) {
    known |= bit;
    if (flags & bit) words.push_back(name);
  }
  if (flags & ~known) words.push_back(fmt::format("unknown flag: 0x{:x}", flags & ~known));
  fmt::print(out, "\t\t\t( ");
  for (size_t i = 0; i < words.size(); ++i) fmt::print(out, "{}{} ", i ? "|\n\t\t\t  " : "", words[i]);
  fmt::print(out, ")\n");
}

std::string Printable(const char* s, size_t max) {
  std::string out;
  for (size_t i = 0; i < max && s[i]; ++i) out += std::isprint(static_cast<unsigned char>(s[i])) ? s[i] : '.';
  return out;
}

// The chunk items the superblock carries for the system chunks; damage is
// said on `err` and ends the list, as btrfs-progs does.
void PrintSysChunkArray(std::FILE* out, const SuperBlock& sb, std::vector<std::string>* err) {
  const uint32_t size = sb.sys_chunk_array_size.get();
  if (size > kSystemChunkArraySize) {
    err->push_back(fmt::format("sys_array_size {} shouldn't exceed {} bytes", size, kSystemChunkArraySize));
    return;
  }
  std::span<const uint8_t> a(sb.sys_chunk_array, size);
  size_t at = 0;
  for (int item = 0; at < a.size(); ++item) {
    if (a.size() - at < sizeof(DiskKey)) {
      err->push_back(fmt::format("sys_array too short to read {} bytes at offset {}", sizeof(DiskKey), at));
      return;
    }
    DiskKey key;
    std::memcpy(&key, a.data() + at, sizeof key);
    at += sizeof key;
    if (key.type != kChunkItemKey) {
      inspect::PrintSysArrayItem(out, item, key, {});
      err->push_back(fmt::format("unexpected item type {} in sys_array at offset {}", key.type, at - sizeof key));
      return;
    }
    if (a.size() - at < sizeof(Chunk) + sizeof(Stripe)) {
      inspect::PrintSysArrayItem(out, item, key, {});
      err->push_back(fmt::format("sys_array too short to read {} bytes at offset {}", sizeof(Chunk) + sizeof(Stripe),
                                 at));
      return;
    }
    Chunk c;
    std::memcpy(&c, a.data() + at, sizeof c);
    const size_t n = c.num_stripes.get();
    if (n == 0) {
      inspect::PrintSysArrayItem(out, item, key, {});
      err->push_back(fmt::format("invalid number of stripes 0 in sys_array at offset {}", at));
      return;
    }
    const size_t len = sizeof(Chunk) + n * sizeof(Stripe);
    if (a.size() - at < len) {
      inspect::PrintSysArrayItem(out, item, key, {});
      err->push_back(fmt::format("sys_array too short to read {} bytes at offset {}", len, at));
      return;
    }
    inspect::PrintSysArrayItem(out, item, key, a.subspan(at, len));
    at += len;
  }
}

void PrintBackupRoots(std::FILE* out, const SuperBlock& sb) {
  const bool v2 = (sb.incompat_flags.get() & kIncompatExtentTreeV2) != 0;
  for (int i = 0; i < kNumBackupRoots; ++i) {
    const RootBackup& b = sb.super_roots[i];
    if (b.tree_root.get() == 0 && b.tree_root_gen.get() == 0) continue;
    fmt::print(out, "\tbackup {}:\n", i);
    fmt::print(out, "\t\tbackup_tree_root:\t{}\tgen: {}\tlevel: {}\n", b.tree_root.get(), b.tree_root_gen.get(),
               b.tree_root_level);
    fmt::print(out, "\t\tbackup_chunk_root:\t{}\tgen: {}\tlevel: {}\n", b.chunk_root.get(), b.chunk_root_gen.get(),
               b.chunk_root_level);
    fmt::print(out, "\t\t{}:\t{}\tgen: {}\tlevel: {}\n", v2 ? "backup_block_group_root" : "backup_extent_root",
               b.extent_root.get(), b.extent_root_gen.get(), b.extent_root_level);
    fmt::print(out, "\t\tbackup_fs_root:\t\t{}\tgen: {}\tlevel: {}\n", b.fs_root.get(), b.fs_root_gen.get(),
               b.fs_root_level);
    fmt::print(out, "\t\tbackup_dev_root:\t{}\tgen: {}\tlevel: {}\n", b.dev_root.get(), b.dev_root_gen.get(),
               b.dev_root_level);
    fmt::print(out, "\t\tcsum_root:\t{}\tgen: {}\tlevel: {}\n", b.csum_root.get(), b.csum_root_gen.get(),
               b.csum_root_level);
    fmt::print(out, "\t\tbackup_total_bytes:\t{}\n\t\tbackup_bytes_used:\t{}\n\t\tbackup_num_devices:\t{}\n\n",
               b.total_bytes.get(), b.bytes_used.get(), b.num_devices.get());
  }
}

void PrintSuper(std::FILE* out, const SuperBlock& sb, std::span<const uint8_t> raw, bool full,
                std::vector<std::string>* err) {
  const uint16_t type = sb.csum_type.get();
  const size_t csize = CsumSize(type);
  const size_t shown = csize ? csize : kCsumSize;
  fmt::print(out, "csum_type\t\t{} ({})\n", type, csize ? CsumTypeName(type) : "INVALID");
  fmt::print(out, "csum_size\t\t{}\n", shown);
  std::string sum;
  for (size_t i = 0; i < shown; ++i) sum += fmt::format("{:02x}", sb.csum[i]);
  const char* verdict = !csize ? " [UNKNOWN CSUM TYPE OR SIZE]"
                        : VerifyCsum(type, raw.subspan(kCsumSize), sb.csum) ? " [match]"
                                                                             : " [DON'T MATCH]";
  fmt::print(out, "csum\t\t\t0x{}{}\n", sum, verdict);
  fmt::print(out, "bytenr\t\t\t{}\n", sb.bytenr.get());
  fmt::print(out, "flags\t\t\t0x{:x}\n", sb.flags.get());
  PrintFlags(out, sb.flags.get(), kSuperFlags);
  std::string magic;
  for (int i = 0; i < 8; ++i) {
    const char c = reinterpret_cast<const char*>(&sb.magic)[i];
    magic += std::isprint(static_cast<unsigned char>(c)) ? c : '.';
  }
  fmt::print(out, "magic\t\t\t{} [{}]\n", magic, sb.magic.get() == kMagic ? "match" : "DON'T MATCH");
  const bool meta_uuid = (sb.incompat_flags.get() & kIncompatMetadataUuid) != 0;
  fmt::print(out, "fsid\t\t\t{}\n", UuidToString(sb.fsid));
  fmt::print(out, "metadata_uuid\t\t{}\n", UuidToString(meta_uuid ? sb.metadata_uuid : sb.fsid));
  fmt::print(out, "label\t\t\t{}\n", Printable(sb.label, kLabelSize));
  fmt::print(out, "generation\t\t{}\n", sb.generation.get());
  fmt::print(out, "root\t\t\t{}\n", sb.root.get());
  fmt::print(out, "sys_array_size\t\t{}\n", sb.sys_chunk_array_size.get());
  fmt::print(out, "chunk_root_generation\t{}\n", sb.chunk_root_generation.get());
  fmt::print(out, "root_level\t\t{}\n", sb.root_level);
  fmt::print(out, "chunk_root\t\t{}\n", sb.chunk_root.get());
  fmt::print(out, "chunk_root_level\t{}\n", sb.chunk_root_level);
  fmt::print(out, "log_root\t\t{}\n", sb.log_root.get());
  fmt::print(out, "log_root_transid (deprecated)\t{}\n", sb.unused_log_root_transid.get());
  fmt::print(out, "log_root_level\t\t{}\n", sb.log_root_level);
  fmt::print(out, "total_bytes\t\t{}\n", sb.total_bytes.get());
  fmt::print(out, "bytes_used\t\t{}\n", sb.bytes_used.get());
  fmt::print(out, "sectorsize\t\t{}\n", sb.sectorsize.get());
  fmt::print(out, "nodesize\t\t{}\n", sb.nodesize.get());
  fmt::print(out, "leafsize (deprecated)\t{}\n", sb.unused_leafsize.get());
  fmt::print(out, "stripesize\t\t{}\n", sb.stripesize.get());
  fmt::print(out, "root_dir\t\t{}\n", sb.root_dir_objectid.get());
  fmt::print(out, "num_devices\t\t{}\n", sb.num_devices.get());
  fmt::print(out, "compat_flags\t\t0x{:x}\n", sb.compat_flags.get());
  fmt::print(out, "compat_ro_flags\t\t0x{:x}\n", sb.compat_ro_flags.get());
  PrintFlags(out, sb.compat_ro_flags.get(), kCompatRo);
  fmt::print(out, "incompat_flags\t\t0x{:x}\n", sb.incompat_flags.get());
  PrintFlags(out, sb.incompat_flags.get(), kIncompat);
  fmt::print(out, "cache_generation\t{}\n", sb.cache_generation.get());
  fmt::print(out, "uuid_tree_generation\t{}\n", sb.uuid_tree_generation.get());
  const DevItem& d = sb.dev_item;
  fmt::print(out, "dev_item.uuid\t\t{}\n", UuidToString(d.uuid));
  const bool fsid_match = std::memcmp(d.fsid, meta_uuid ? sb.metadata_uuid : sb.fsid, kFsidSize) == 0;
  fmt::print(out, "dev_item.fsid\t\t{} [{}]\n", UuidToString(d.fsid), fsid_match ? "match" : "DON'T MATCH");
  fmt::print(out, "dev_item.type\t\t{}\n", d.type.get());
  fmt::print(out, "dev_item.total_bytes\t{}\n", d.total_bytes.get());
  fmt::print(out, "dev_item.bytes_used\t{}\n", d.bytes_used.get());
  fmt::print(out, "dev_item.io_align\t{}\n", d.io_align.get());
  fmt::print(out, "dev_item.io_width\t{}\n", d.io_width.get());
  fmt::print(out, "dev_item.sector_size\t{}\n", d.sector_size.get());
  fmt::print(out, "dev_item.devid\t\t{}\n", d.devid.get());
  fmt::print(out, "dev_item.dev_group\t{}\n", d.dev_group.get());
  fmt::print(out, "dev_item.seek_speed\t{}\n", d.seek_speed);
  fmt::print(out, "dev_item.bandwidth\t{}\n", d.bandwidth);
  fmt::print(out, "dev_item.generation\t{}\n", d.generation.get());
  if (!full) return;
  fmt::print(out, "sys_chunk_array[{}]:\n", kSystemChunkArraySize);
  PrintSysChunkArray(out, sb, err);
  fmt::print(out, "backup_roots[{}]:\n", kNumBackupRoots);
  PrintBackupRoots(out, sb);
}

}  // namespace

Result<DumpSuperReport> DumpSuper(const std::string& image, const OpenOptions& where, const DumpSuperOptions& o,
                                  std::FILE* out) {
  if (o.mirror < 0 || o.mirror >= kSuperMirrorMax) {
    return Status::Invalid(fmt::format("superblock copy {}: there are copies 0 to {}", o.mirror, kSuperMirrorMax - 1));
  }
  DumpSuperReport report;
  for (const std::string& path : txn::SplitDeviceList(image)) {
    io::Placement place;
    place.offset = where.offset;
    place.partition = where.partition;
    UB_ASSIGN_OR_RETURN(auto dev, io::OpenImage(path, io::OpenFlags{}, place));
    for (int m = o.all ? 0 : o.mirror; m <= (o.all ? kSuperMirrorMax - 1 : o.mirror); ++m) {
      const uint64_t off = SuperblockOffset(m);
      if (off + kSuperInfoSize > dev->Size()) {  // the device is too small to have it
        fmt::print(out, "\n");                    // btrfs-progs' blank line for it, kept for its readers
        if (!o.all) report.missing.push_back(fmt::format("{}: no superblock copy {}: the device is only {} bytes",
                                                         path, m, dev->Size()));
        continue;
      }
      std::vector<uint8_t> raw(kSuperInfoSize);
      UB_RETURN_IF_ERROR(dev->ReadAt(off, raw).WithContext(fmt::format("{}: superblock copy {} at {}", path, m, off)));
      SuperBlock sb;
      std::memcpy(&sb, raw.data(), sizeof sb);
      fmt::print(out, "superblock: bytenr={}, device={}\n", off, path);
      fmt::print(out, "---------------------------------------------------------\n");
      if (sb.magic.get() != kMagic && !o.force) {
        std::fflush(out);
        return Status::Corrupt(fmt::format("{}: bad magic on superblock copy {} at {} (force dumps it anyway)", path,
                                           m, off));
      }
      PrintSuper(out, sb, raw, o.full, &report.errors);
      fmt::print(out, "\n");
      ++report.copies;
    }
  }
  std::fflush(out);
  return report;
}

}  // namespace ubtrfs
