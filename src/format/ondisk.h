// The btrfs on-disk format: constants and structures, exactly as laid out on
// disk (all little-endian, no padding). Sizes are checked against the
// published layout at the bottom of this file. Nothing outside format/
// declares on-disk layouts.
#ifndef UBTRFS_FORMAT_ONDISK_H_
#define UBTRFS_FORMAT_ONDISK_H_

#include <cstddef>
#include <cstdint>

#include "format/endian.h"

namespace ubtrfs::format {

// ---- Superblock placement -------------------------------------------------
inline constexpr uint64_t kSuperInfoOffset = 64 * 1024;
inline constexpr uint32_t kSuperInfoSize = 4096;
inline constexpr int kSuperMirrorMax = 3;
inline constexpr uint64_t kMagic = 0x4D5F53665248425FULL;  // "_BHRfS_M"
// Copy 0 at 64 KiB, copy i>0 at 16 KiB << (12 * i): 64 MiB, 256 GiB.
inline constexpr uint64_t SuperblockOffset(int mirror) {
  return mirror == 0 ? kSuperInfoOffset : (16ULL * 1024) << (12 * mirror);
}

inline constexpr size_t kCsumSize = 32;
inline constexpr size_t kFsidSize = 16;
inline constexpr size_t kUuidSize = 16;
inline constexpr size_t kLabelSize = 256;
inline constexpr size_t kSystemChunkArraySize = 2048;
inline constexpr int kNumBackupRoots = 4;
inline constexpr int kMaxLevel = 8;  // levels are 0..7

// ---- Checksum types ---------------------------------------------------------
enum class CsumType : uint16_t { kCrc32c = 0, kXxhash64 = 1, kSha256 = 2, kBlake2b = 3 };

// ---- Superblock flags -----------------------------------------------------
inline constexpr uint64_t kSuperFlagWritten = 1ULL << 0;
inline constexpr uint64_t kSuperFlagError = 1ULL << 2;
inline constexpr uint64_t kSuperFlagSeeding = 1ULL << 32;
inline constexpr uint64_t kSuperFlagMetadump = 1ULL << 33;
inline constexpr uint64_t kSuperFlagMetadumpV2 = 1ULL << 34;
inline constexpr uint64_t kSuperFlagChangingFsid = 1ULL << 35;
inline constexpr uint64_t kSuperFlagChangingFsidV2 = 1ULL << 36;
// btrfs-progs' own flags for a btrfstune conversion under way.
inline constexpr uint64_t kSuperFlagChangingBgTree = 1ULL << 38;
inline constexpr uint64_t kSuperFlagChangingDataCsum = 1ULL << 39;
inline constexpr uint64_t kSuperFlagChangingMetaCsum = 1ULL << 40;

// ---- Feature flags ----------------------------------------------------------
inline constexpr uint64_t kIncompatMixedBackref = 1ULL << 0;
inline constexpr uint64_t kIncompatDefaultSubvol = 1ULL << 1;
inline constexpr uint64_t kIncompatMixedGroups = 1ULL << 2;
inline constexpr uint64_t kIncompatCompressLzo = 1ULL << 3;
inline constexpr uint64_t kIncompatCompressZstd = 1ULL << 4;
inline constexpr uint64_t kIncompatBigMetadata = 1ULL << 5;
inline constexpr uint64_t kIncompatExtendedIref = 1ULL << 6;
inline constexpr uint64_t kIncompatRaid56 = 1ULL << 7;
inline constexpr uint64_t kIncompatSkinnyMetadata = 1ULL << 8;
inline constexpr uint64_t kIncompatNoHoles = 1ULL << 9;
inline constexpr uint64_t kIncompatMetadataUuid = 1ULL << 10;
inline constexpr uint64_t kIncompatRaid1c34 = 1ULL << 11;
inline constexpr uint64_t kIncompatZoned = 1ULL << 12;
inline constexpr uint64_t kIncompatExtentTreeV2 = 1ULL << 13;
inline constexpr uint64_t kIncompatRaidStripeTree = 1ULL << 14;
inline constexpr uint64_t kIncompatSimpleQuota = 1ULL << 16;

inline constexpr uint64_t kCompatRoFreeSpaceTree = 1ULL << 0;
inline constexpr uint64_t kCompatRoFreeSpaceTreeValid = 1ULL << 1;
inline constexpr uint64_t kCompatRoVerity = 1ULL << 2;
inline constexpr uint64_t kCompatRoBlockGroupTree = 1ULL << 3;

// ---- Tree object ids --------------------------------------------------------
inline constexpr uint64_t kRootTreeObjectid = 1;
inline constexpr uint64_t kExtentTreeObjectid = 2;
inline constexpr uint64_t kChunkTreeObjectid = 3;
inline constexpr uint64_t kDevTreeObjectid = 4;
inline constexpr uint64_t kFsTreeObjectid = 5;
inline constexpr uint64_t kRootTreeDirObjectid = 6;
inline constexpr uint64_t kCsumTreeObjectid = 7;
inline constexpr uint64_t kQuotaTreeObjectid = 8;
inline constexpr uint64_t kUuidTreeObjectid = 9;
inline constexpr uint64_t kFreeSpaceTreeObjectid = 10;
inline constexpr uint64_t kBlockGroupTreeObjectid = 11;
inline constexpr uint64_t kRaidStripeTreeObjectid = 12;
inline constexpr uint64_t kDevStatsObjectid = 0;
inline constexpr uint64_t kBalanceObjectid = static_cast<uint64_t>(-4);
inline constexpr uint64_t kOrphanObjectid = static_cast<uint64_t>(-5);
inline constexpr uint64_t kTreeLogObjectid = static_cast<uint64_t>(-6);
inline constexpr uint64_t kTreeLogFixupObjectid = static_cast<uint64_t>(-7);
inline constexpr uint64_t kTreeRelocObjectid = static_cast<uint64_t>(-8);
inline constexpr uint64_t kDataRelocTreeObjectid = static_cast<uint64_t>(-9);
inline constexpr uint64_t kExtentCsumObjectid = static_cast<uint64_t>(-10);
inline constexpr uint64_t kFreeSpaceObjectid = static_cast<uint64_t>(-11);
inline constexpr uint64_t kFreeInoObjectid = static_cast<uint64_t>(-12);
inline constexpr uint64_t kMultipleObjectids = static_cast<uint64_t>(-255);
inline constexpr uint64_t kFirstFreeObjectid = 256;
inline constexpr uint64_t kLastFreeObjectid = static_cast<uint64_t>(-256);
// The fs tree and the trees of subvolumes and snapshots: what a qgroup, a
// UUID tree entry or a ROOT_REF can name.
inline constexpr bool IsSubvolumeTree(uint64_t id) {
  return id == kFsTreeObjectid || (id >= kFirstFreeObjectid && id <= kLastFreeObjectid);
}
inline constexpr uint64_t kFirstChunkTreeObjectid = 256;
inline constexpr uint64_t kDevItemsObjectid = 1;

// ---- Item key types ---------------------------------------------------------
enum KeyType : uint8_t {
  kInodeItemKey = 1,
  kInodeRefKey = 12,
  kInodeExtrefKey = 13,
  kXattrItemKey = 24,
  kVerityDescItemKey = 36,
  kVerityMerkleItemKey = 37,
  kOrphanItemKey = 48,
  kDirLogItemKey = 60,
  kDirLogIndexKey = 72,
  kDirItemKey = 84,
  kDirIndexKey = 96,
  kExtentDataKey = 108,
  kExtentCsumKey = 128,
  kRootItemKey = 132,
  kRootBackrefKey = 144,
  kRootRefKey = 156,
  kExtentItemKey = 168,
  kMetadataItemKey = 169,
  kExtentOwnerRefKey = 172,
  kTreeBlockRefKey = 176,
  kExtentDataRefKey = 178,
  kSharedBlockRefKey = 182,
  kSharedDataRefKey = 184,
  kBlockGroupItemKey = 192,
  kFreeSpaceInfoKey = 198,
  kFreeSpaceExtentKey = 199,
  kFreeSpaceBitmapKey = 200,
  kDevExtentKey = 204,
  kDevItemKey = 216,
  kChunkItemKey = 228,
  kRaidStripeKey = 230,
  kQgroupStatusKey = 240,
  kQgroupInfoKey = 242,
  kQgroupLimitKey = 244,
  kQgroupRelationKey = 246,
  kTemporaryItemKey = 248,  // also the balance item
  kPersistentItemKey = 249, // also dev stats
  kDevReplaceKey = 250,
  kUuidKeySubvol = 251,
  kUuidKeyReceivedSubvol = 252,
  kStringItemKey = 253,
};

// ---- Block group / chunk type flags -----------------------------------------
inline constexpr uint64_t kBlockGroupData = 1ULL << 0;
inline constexpr uint64_t kBlockGroupSystem = 1ULL << 1;
inline constexpr uint64_t kBlockGroupMetadata = 1ULL << 2;
inline constexpr uint64_t kBlockGroupRaid0 = 1ULL << 3;
inline constexpr uint64_t kBlockGroupRaid1 = 1ULL << 4;
inline constexpr uint64_t kBlockGroupDup = 1ULL << 5;
inline constexpr uint64_t kBlockGroupRaid10 = 1ULL << 6;
inline constexpr uint64_t kBlockGroupRaid5 = 1ULL << 7;
inline constexpr uint64_t kBlockGroupRaid6 = 1ULL << 8;
inline constexpr uint64_t kBlockGroupRaid1c3 = 1ULL << 9;
inline constexpr uint64_t kBlockGroupRaid1c4 = 1ULL << 10;
inline constexpr uint64_t kBlockGroupTypeMask = kBlockGroupData | kBlockGroupSystem | kBlockGroupMetadata;
inline constexpr uint64_t kBlockGroupProfileMask =
    kBlockGroupRaid0 | kBlockGroupRaid1 | kBlockGroupDup | kBlockGroupRaid10 | kBlockGroupRaid5 |
    kBlockGroupRaid6 | kBlockGroupRaid1c3 | kBlockGroupRaid1c4;

// ---- Tree block header flags ------------------------------------------------
inline constexpr uint64_t kHeaderFlagWritten = 1ULL << 0;
inline constexpr uint64_t kHeaderFlagReloc = 1ULL << 1;
// The superblock flags the kernel accepts (BTRFS_SUPER_FLAG_SUPP): the
// header flags above, ERROR, SEEDING, both METADUMP and both CHANGING_FSID.
inline constexpr uint64_t kSuperFlagsKnown = kHeaderFlagWritten | kHeaderFlagReloc | kSuperFlagError |
                                             kSuperFlagSeeding | kSuperFlagMetadump | kSuperFlagMetadumpV2 |
                                             kSuperFlagChangingFsid | kSuperFlagChangingFsidV2;
inline constexpr int kBackrefRevShift = 56;
inline constexpr uint64_t kMixedBackrefRev = 1;

// ---- Inode flags --------------------------------------------------------------
inline constexpr uint64_t kInodeNodatasum = 1ULL << 0;
// On a ROOT_ITEM's inode only (BTRFS_INODE_ROOT_ITEM_INIT): without it the
// kernel takes the item for a pre-2.6.39 one and clears its flags and limit
// (a read-only subvolume would turn writable).
inline constexpr uint64_t kInodeRootItemInit = 1ULL << 31;
inline constexpr uint64_t kInodeNodatacow = 1ULL << 1;
inline constexpr uint64_t kInodeReadonly = 1ULL << 2;
inline constexpr uint64_t kInodeNocompress = 1ULL << 3;
inline constexpr uint64_t kInodePrealloc = 1ULL << 4;
inline constexpr uint64_t kInodeSync = 1ULL << 5;
inline constexpr uint64_t kInodeImmutable = 1ULL << 6;
inline constexpr uint64_t kInodeAppend = 1ULL << 7;
inline constexpr uint64_t kInodeNodump = 1ULL << 8;
inline constexpr uint64_t kInodeNoatime = 1ULL << 9;
inline constexpr uint64_t kInodeDirsync = 1ULL << 10;
inline constexpr uint64_t kInodeCompress = 1ULL << 11;
// The upper 32 bits are the kernel's ro_flags: flags a read-write mount must
// understand. RO_VERITY: the file has fs-verity (its VERITY items below);
// its data never changes again.
inline constexpr uint64_t kInodeRoVerity = 1ULL << 32;

// ---- Directory entry types (dir_item.type) ------------------------------------
enum FileType : uint8_t {
  kFtUnknown = 0,
  kFtRegFile = 1,
  kFtDir = 2,
  kFtChrdev = 3,
  kFtBlkdev = 4,
  kFtFifo = 5,
  kFtSock = 6,
  kFtSymlink = 7,
  kFtXattr = 8,
  kFtMax = 9,
};
// The dir item type of an inode's mode (on-disk modes are Linux's S_IF*).
constexpr uint8_t FileTypeOfMode(uint32_t mode) {
  switch (mode & 0170000) {
    case 0100000: return kFtRegFile;
    case 0040000: return kFtDir;
    case 0020000: return kFtChrdev;
    case 0060000: return kFtBlkdev;
    case 0010000: return kFtFifo;
    case 0140000: return kFtSock;
    case 0120000: return kFtSymlink;
    default: return kFtUnknown;
  }
}

// ---- File extents ---------------------------------------------------------------
enum FileExtentType : uint8_t { kFileExtentInline = 0, kFileExtentReg = 1, kFileExtentPrealloc = 2 };
enum Compression : uint8_t { kCompressNone = 0, kCompressZlib = 1, kCompressLzo = 2, kCompressZstd = 3 };

// ---- Structures ------------------------------------------------------------------
struct DiskKey {
  Le64 objectid;
  uint8_t type;
  Le64 offset;
};

struct Timespec {
  Le64 sec;
  Le32 nsec;
};

struct DevItem {
  Le64 devid;
  Le64 total_bytes;
  Le64 bytes_used;
  Le32 io_align;
  Le32 io_width;
  Le32 sector_size;
  Le64 type;
  Le64 generation;
  Le64 start_offset;
  Le32 dev_group;
  uint8_t seek_speed;
  uint8_t bandwidth;
  uint8_t uuid[kUuidSize];
  uint8_t fsid[kUuidSize];
};

struct RootBackup {
  Le64 tree_root;
  Le64 tree_root_gen;
  Le64 chunk_root;
  Le64 chunk_root_gen;
  Le64 extent_root;
  Le64 extent_root_gen;
  Le64 fs_root;
  Le64 fs_root_gen;
  Le64 dev_root;
  Le64 dev_root_gen;
  Le64 csum_root;
  Le64 csum_root_gen;
  Le64 total_bytes;
  Le64 bytes_used;
  Le64 num_devices;
  Le64 unused_64[4];
  uint8_t tree_root_level;
  uint8_t chunk_root_level;
  uint8_t extent_root_level;
  uint8_t fs_root_level;
  uint8_t dev_root_level;
  uint8_t csum_root_level;
  uint8_t unused_8[10];
};

struct SuperBlock {
  uint8_t csum[kCsumSize];
  uint8_t fsid[kFsidSize];
  Le64 bytenr;
  Le64 flags;
  Le64 magic;
  Le64 generation;
  Le64 root;
  Le64 chunk_root;
  Le64 log_root;
  Le64 unused_log_root_transid;
  Le64 total_bytes;
  Le64 bytes_used;
  Le64 root_dir_objectid;
  Le64 num_devices;
  Le32 sectorsize;
  Le32 nodesize;
  Le32 unused_leafsize;
  Le32 stripesize;
  Le32 sys_chunk_array_size;
  Le64 chunk_root_generation;
  Le64 compat_flags;
  Le64 compat_ro_flags;
  Le64 incompat_flags;
  Le16 csum_type;
  uint8_t root_level;
  uint8_t chunk_root_level;
  uint8_t log_root_level;
  DevItem dev_item;
  char label[kLabelSize];
  Le64 cache_generation;
  Le64 uuid_tree_generation;
  uint8_t metadata_uuid[kFsidSize];
  Le64 nr_global_roots;
  Le64 reserved[27];
  uint8_t sys_chunk_array[kSystemChunkArraySize];
  RootBackup super_roots[kNumBackupRoots];
  uint8_t padding[565];
};

struct Header {
  uint8_t csum[kCsumSize];
  uint8_t fsid[kFsidSize];
  Le64 bytenr;
  Le64 flags;
  uint8_t chunk_tree_uuid[kUuidSize];
  Le64 generation;
  Le64 owner;
  Le32 nritems;
  uint8_t level;
};

struct Item {  // leaf item header; data offset is relative to the end of Header
  DiskKey key;
  Le32 offset;
  Le32 size;
};

struct KeyPtr {  // internal node pointer
  DiskKey key;
  Le64 blockptr;
  Le64 generation;
};

struct Stripe {
  Le64 devid;
  Le64 offset;
  uint8_t dev_uuid[kUuidSize];
};

struct Chunk {  // followed by num_stripes Stripe entries (the first is part of the item)
  Le64 length;
  Le64 owner;
  Le64 stripe_len;
  Le64 type;
  Le32 io_align;
  Le32 io_width;
  Le32 sector_size;
  Le16 num_stripes;
  Le16 sub_stripes;
};

struct InodeItem {
  Le64 generation;
  Le64 transid;
  Le64 size;
  Le64 nbytes;
  Le64 block_group;
  Le32 nlink;
  Le32 uid;
  Le32 gid;
  Le32 mode;
  Le64 rdev;
  Le64 flags;
  Le64 sequence;
  Le64 reserved[4];
  Timespec atime;
  Timespec ctime;
  Timespec mtime;
  Timespec otime;
};

struct InodeRef {  // followed by name
  Le64 index;
  Le16 name_len;
};

struct InodeExtref {  // followed by name
  Le64 parent_objectid;
  Le64 index;
  Le16 name_len;
};

struct DirItem {  // followed by name, then data (xattr value)
  DiskKey location;
  Le64 transid;
  Le16 data_len;
  Le16 name_len;
  uint8_t type;
};

struct RootItem {
  InodeItem inode;
  Le64 generation;
  Le64 root_dirid;
  Le64 bytenr;
  Le64 byte_limit;
  Le64 bytes_used;
  Le64 last_snapshot;
  Le64 flags;
  Le32 refs;
  DiskKey drop_progress;
  uint8_t drop_level;
  uint8_t level;
  // Fields below exist only in items written by newer kernels ("v2").
  Le64 generation_v2;
  uint8_t uuid[kUuidSize];
  uint8_t parent_uuid[kUuidSize];
  uint8_t received_uuid[kUuidSize];
  Le64 ctransid;
  Le64 otransid;
  Le64 stransid;
  Le64 rtransid;
  Timespec ctime;
  Timespec otime;
  Timespec stime;
  Timespec rtime;
  Le64 reserved[8];
};
inline constexpr size_t kRootItemV1Size = offsetof(RootItem, generation_v2);

struct RootRef {  // followed by name
  Le64 dirid;
  Le64 sequence;
  Le16 name_len;
};

struct FileExtentItem {
  Le64 generation;
  Le64 ram_bytes;
  uint8_t compression;
  uint8_t encryption;
  Le16 other_encoding;
  uint8_t type;
  // Inline extents store their data from here on; the fields below exist
  // only for regular and prealloc extents.
  Le64 disk_bytenr;
  Le64 disk_num_bytes;
  Le64 offset;
  Le64 num_bytes;
};
inline constexpr size_t kFileExtentInlineDataStart = offsetof(FileExtentItem, disk_bytenr);

struct ExtentItem {
  Le64 refs;
  Le64 generation;
  Le64 flags;
};

struct TreeBlockInfo {
  DiskKey key;
  uint8_t level;
};

struct ExtentInlineRef {
  uint8_t type;
  Le64 offset;
};

struct ExtentDataRef {
  Le64 root;
  Le64 objectid;
  Le64 offset;
  Le32 count;
};

struct SharedDataRef {
  Le32 count;
};

struct BlockGroupItem {
  Le64 used;
  Le64 chunk_objectid;
  Le64 flags;
};

// The quota tree (8): one status item (0, QGROUP_STATUS, 0), and per qgroup
// (id = level << 48 | subvolume or group number) an info and a limit item
// (0, QGROUP_INFO/LIMIT, id); relations (child, QGROUP_RELATION, parent) and
// (parent, QGROUP_RELATION, child).
struct QgroupStatusItem {
  Le64 version;
  Le64 generation;
  Le64 flags;
  Le64 rescan;  // objectid the rescan goes on from
};
// Simple quotas: the status item goes on with the generation from which
// extents are counted (only present with kQgroupStatusSimpleMode).
struct QgroupStatusItemSimple {
  QgroupStatusItem base;
  Le64 enable_gen;
};
inline constexpr uint64_t kQgroupStatusOn = 1, kQgroupStatusRescan = 2, kQgroupStatusInconsistent = 4,
                          kQgroupStatusSimpleMode = 8;
struct QgroupInfoItem {
  Le64 generation;
  Le64 rfer;
  Le64 rfer_cmpr;
  Le64 excl;
  Le64 excl_cmpr;
};
struct QgroupLimitItem {
  Le64 flags;
  Le64 max_rfer;
  Le64 max_excl;
  Le64 rsv_rfer;
  Le64 rsv_excl;
};
inline constexpr uint64_t kQgroupLimitMaxRfer = 1, kQgroupLimitMaxExcl = 2;

struct FreeSpaceInfo {
  Le32 extent_count;
  Le32 flags;
};

struct DevExtent {
  Le64 chunk_tree;
  Le64 chunk_objectid;
  Le64 chunk_offset;
  Le64 length;
  uint8_t chunk_tree_uuid[kUuidSize];
};

inline constexpr uint64_t kExtentFlagData = 1ULL << 0;
inline constexpr uint64_t kExtentFlagTreeBlock = 1ULL << 1;
inline constexpr uint64_t kBlockFlagFullBackref = 1ULL << 8;

// ---- fs-verity -----------------------------------------------------------------
// (ino, VERITY_DESC_ITEM, 0) holds this; the descriptor's bytes follow in
// (ino, VERITY_DESC_ITEM, 1 + position) items, and the Merkle tree in
// (ino, VERITY_MERKLE_ITEM, position) items. Reserved words must be zero.
struct VerityDescriptorItem {
  Le64 size;  // bytes of the descriptor (with its signature)
  Le64 reserved[2];
  uint8_t encryption;
};

// fs-verity's own descriptor (struct fsverity_descriptor), followed by
// sig_size bytes of signature.
struct FsverityDescriptor {
  uint8_t version;  // 1
  uint8_t hash_algorithm;
  uint8_t log_blocksize;
  uint8_t salt_size;
  Le32 sig_size;
  Le64 data_size;
  uint8_t root_hash[64];
  uint8_t salt[32];
  uint8_t reserved[144];
};

// root_item.flags
inline constexpr uint64_t kRootSubvolRdonly = 1ULL << 0;
// A subvolume being deleted (its ROOT_ITEM refs are 0; the kernel sets it).
inline constexpr uint64_t kRootSubvolDead = 1ULL << 48;

// ---- Published sizes ---------------------------------------------------------------
static_assert(sizeof(DiskKey) == 17);
static_assert(sizeof(Timespec) == 12);
static_assert(sizeof(DevItem) == 98);
static_assert(sizeof(RootBackup) == 168);
static_assert(sizeof(SuperBlock) == 4096);
static_assert(offsetof(SuperBlock, sectorsize) == 144);
static_assert(offsetof(SuperBlock, csum_type) == 196);
static_assert(offsetof(SuperBlock, dev_item) == 201);
static_assert(offsetof(SuperBlock, label) == 299);
static_assert(offsetof(SuperBlock, metadata_uuid) == 571);
static_assert(offsetof(SuperBlock, sys_chunk_array) == 811);
static_assert(offsetof(SuperBlock, super_roots) == 2859);
static_assert(sizeof(Header) == 101);
static_assert(sizeof(Item) == 25);
static_assert(sizeof(KeyPtr) == 33);
static_assert(sizeof(Stripe) == 32);
static_assert(sizeof(Chunk) == 48);
static_assert(sizeof(InodeItem) == 160);
static_assert(sizeof(InodeRef) == 10);
static_assert(sizeof(InodeExtref) == 18);
static_assert(sizeof(DirItem) == 30);
static_assert(sizeof(RootItem) == 439);
static_assert(kRootItemV1Size == 239);
static_assert(sizeof(RootRef) == 18);
static_assert(sizeof(FileExtentItem) == 53);
static_assert(sizeof(VerityDescriptorItem) == 25);
static_assert(sizeof(FsverityDescriptor) == 256);
static_assert(offsetof(FsverityDescriptor, root_hash) == 16);
static_assert(offsetof(FsverityDescriptor, salt) == 80);
static_assert(kFileExtentInlineDataStart == 21);
static_assert(sizeof(ExtentItem) == 24);
static_assert(sizeof(TreeBlockInfo) == 18);
static_assert(sizeof(ExtentInlineRef) == 9);
static_assert(sizeof(ExtentDataRef) == 28);
static_assert(sizeof(BlockGroupItem) == 24);
static_assert(sizeof(QgroupStatusItem) == 32);
static_assert(sizeof(QgroupStatusItemSimple) == 40);
static_assert(sizeof(QgroupInfoItem) == 40);
static_assert(sizeof(QgroupLimitItem) == 40);
static_assert(sizeof(FreeSpaceInfo) == 8);
static_assert(sizeof(DevExtent) == 48);

}  // namespace ubtrfs::format

#endif  // UBTRFS_FORMAT_ONDISK_H_
