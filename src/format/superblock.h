// Superblock validation and the system chunk array. Pure functions over
// bytes: nothing here does I/O.
#ifndef UBTRFS_FORMAT_SUPERBLOCK_H_
#define UBTRFS_FORMAT_SUPERBLOCK_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/key.h"
#include "format/ondisk.h"
#include "ubtrfs/status.h"

namespace ubtrfs::format {

// Checks one superblock copy read from `offset`: magic, checksum type and
// checksum, bytenr, sizes, levels, tree root alignment and the system chunk
// array bounds. The error names the first thing that is wrong.
Status ValidateSuperblock(std::span<const uint8_t> bytes, uint64_t offset);

// Features this build reads. Anything else in incompat_flags is refused.
inline constexpr uint64_t kSupportedIncompat =
    kIncompatMixedBackref | kIncompatDefaultSubvol | kIncompatMixedGroups | kIncompatCompressLzo |
    kIncompatCompressZstd | kIncompatBigMetadata | kIncompatExtendedIref | kIncompatRaid56 |
    kIncompatSkinnyMetadata | kIncompatNoHoles | kIncompatMetadataUuid | kIncompatRaid1c34 |
    kIncompatSimpleQuota;
// Names the incompat bits for messages ("extent-tree-v2, zoned").
std::string IncompatNames(uint64_t flags);
std::string CompatRoNames(uint64_t flags);

// The fsid tree blocks carry: metadata_uuid when that feature is on.
const uint8_t* MetadataFsid(const SuperBlock& sb);

// The backup-root slot a commit of `generation` fills: the one after the
// newest (by tree root generation), or the newest itself when it is of this
// generation -- the rotation the kernel's usebackuproot walks backwards.
int NextBackupRootSlot(const SuperBlock& sb, uint64_t generation);

struct SysChunk {
  Key key;
  std::vector<uint8_t> chunk;  // a Chunk followed by its stripes
};
// Splits sys_chunk_array into its (key, chunk) entries, checking every bound.
Result<std::vector<SysChunk>> ParseSysChunkArray(const SuperBlock& sb);

std::string UuidToString(const uint8_t* uuid);

}  // namespace ubtrfs::format

#endif  // UBTRFS_FORMAT_SUPERBLOCK_H_
