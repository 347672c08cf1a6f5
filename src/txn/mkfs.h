// mkfs: writes a new, empty btrfs filesystem onto one or more devices, in
// the layout mkfs.btrfs (btrfs-progs 6.x) produces by default:
//
//   features   incompat mixed-backref, extended-iref, skinny-metadata,
//              no-holes; compat_ro free-space-tree + free-space-tree-valid,
//              block-group-tree (unless turned off)
//   chunks     one device, default profiles: SYSTEM (DUP), METADATA (DUP),
//              DATA (SINGLE), placed from 1 MiB on; logical address =
//              physical offset of the first copy.
//              Several devices (or profiles given): SYSTEM and METADATA with
//              the metadata profile (RAID1 by default), DATA with the data
//              profile (SINGLE by default); stripes on the devices with the
//              most room (as the kernel's gather_device_info), each device
//              from 1 MiB on; logical addresses from 1 MiB on. Every device
//              gets a DEV_ITEM and its superblock copies with its own one.
//   trees      root, chunk, extent, dev, fs (5), csum, uuid, free space,
//              data reloc and block group trees, every block at generation 1
//
// Every tree block is built, checksummed and verified in memory and written
// to each copy; the superblock copies that fit the filesystem come last. When
// MakeFilesystem returns OK the image is complete and flushed: it can be
// opened by Volume/TxnManager, Filesystem::Open, btrfs check and the kernel.
#ifndef UBTRFS_TXN_MKFS_H_
#define UBTRFS_TXN_MKFS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/ondisk.h"
#include "io/block_device.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {

using Uuid = std::array<uint8_t, format::kUuidSize>;

// data_bytes value: every byte the system and metadata chunks leave over.
inline constexpr uint64_t kMkfsAllSpace = UINT64_MAX;
// The smallest filesystem MakeFilesystem writes for a node size: 64 MiB up
// to 16 KiB nodes, more for larger nodes (the kernel's global block reserve
// grows with the node size -- 22 MiB at 64 KiB -- and the metadata chunk must
// hold it with room to spare, or the first mkdir fails with ENOSPC).
uint64_t MkfsMinBytes(uint32_t nodesize);
// Data is allocated in chunks of at most this size (as the kernel does).
inline constexpr uint64_t kMkfsMaxDataChunk = 1ull << 30;

struct MkfsOptions {
  uint32_t nodesize = 16384;   // power of two, sectorsize..64 KiB
  uint32_t sectorsize = 4096;  // only 4096 (what the kernel mounts on 4 KiB pages)
  uint16_t csum_type = static_cast<uint16_t>(format::CsumType::kCrc32c);
  std::string label;           // at most 255 bytes
  // Block group items in a tree of their own (compat_ro block-group-tree,
  // mkfs.btrfs's default since 6.19): the kernel finds them without reading
  // the extent tree, so large filesystems mount fast.
  bool block_group_tree = true;

  // Random (version 4) when not given.
  std::optional<Uuid> fsid;
  std::optional<Uuid> dev_uuid;
  std::optional<Uuid> chunk_tree_uuid;
  std::optional<Uuid> fs_tree_uuid;  // the uuid of subvolume 5 (ROOT_ITEM and uuid tree)

  // Times of the root directories and the fs tree's ctime/otime; now when not given.
  std::optional<int64_t> time_sec;
  uint32_t time_nsec = 0;

  // Bytes of the device the filesystem covers; 0: all of it (rounded down
  // to the sector size).
  uint64_t total_bytes = 0;
  // Size of the METADATA chunk (each of its two copies); 0: by device size
  // as mkfs.btrfs does (5%, 32 MiB..256 MiB; less on devices below 256 MiB),
  // but at least 768 nodes and 16 MiB.
  uint64_t metadata_chunk_bytes = 0;
  // Bytes of DATA chunks to allocate; 0: a 64 MiB chunk (less on small
  // devices, leaving room for the kernel to allocate more metadata);
  // kMkfsAllSpace: everything left. More than kMkfsMaxDataChunk is split.
  uint64_t data_bytes = 0;
  // The system and metadata chunks at the end of the device, data from
  // 1 MiB on (mkfs --shrink: data chunks then fill the device from its
  // start, and the small chunks move down behind them at the end).
  bool metadata_at_end = false;

  // Block group profiles (format::kBlockGroupDup, kBlockGroupRaid1, ...;
  // 0 is SINGLE). Unset: mkfs.btrfs's defaults, data SINGLE and metadata
  // DUP on one device, RAID1 on several. System chunks take the metadata
  // profile.
  std::optional<uint64_t> data_profile;
  std::optional<uint64_t> metadata_profile;
  // Mixed block groups (mkfs.btrfs -M; incompat MIXED_GROUPS): data and
  // metadata share DATA|METADATA chunks, which small filesystems waste less
  // of. The node size must equal the sector size; the two profiles, if
  // given, must be the same (default SINGLE, as mkfs.btrfs).
  bool mixed = false;
  // Uuids of the devices after the first (dev_uuid is the first one's);
  // random where not given.
  std::vector<Uuid> more_dev_uuids;
};

// "raid1" -> kBlockGroupRaid1 (mkfs.btrfs's names, any case: single, dup,
// raid0, raid1, raid1c3, raid1c4, raid10, raid5, raid6); nullopt if unknown.
std::optional<uint64_t> ParseProfile(const std::string& name);

struct MkfsChunk {
  uint64_t logical = 0;
  uint64_t length = 0;
  uint64_t type = 0;                // block group flags: DATA/METADATA/SYSTEM | profile
  std::vector<uint64_t> physical;   // start of each stripe on its device
  std::vector<uint64_t> devids;     // the device of each stripe (1 for all on one device)
  uint64_t stripe_bytes = 0;        // each stripe's length on its device (its dev extent)
};

// What MakeFilesystem wrote (for the CLI's report and for tests).
struct MkfsSummary {
  Uuid fsid{};
  Uuid dev_uuid{};
  std::vector<Uuid> dev_uuids;  // every device's, by devid (1 first)
  Uuid chunk_tree_uuid{};
  uint64_t total_bytes = 0;     // all devices together
  std::vector<uint64_t> dev_bytes;  // each device's, by devid (1 first)
  uint64_t bytes_used = 0;     // tree blocks
  uint64_t generation = 0;
  int tree_blocks = 0;
  std::vector<MkfsChunk> chunks;
  int superblock_copies = 0;  // on all devices together
};

// Creates the filesystem. The device must be writable and already have its
// size (an image file is sized beforehand). Refuses (EINVAL) bad options and
// devices below MkfsMinBytes(nodesize), naming the option or the sizes.
Status MakeFilesystem(io::BlockDevice* dev, const MkfsOptions& opts, MkfsSummary* summary = nullptr);
// Over several devices (devids 1, 2, ... in this order). total_bytes, when
// set, is each device's size as the filesystem sees it (mkfs.btrfs -b).
// EINVAL with fewer devices than a profile needs, naming the profile.
Status MakeFilesystem(const std::vector<io::BlockDevice*>& devs, const MkfsOptions& opts,
                      MkfsSummary* summary = nullptr);

// Checks the options alone (sizes, checksum type, label, and total_bytes
// against the minimum when it is set); MakeFilesystem does this first.
Status ValidateMkfsOptions(const MkfsOptions& opts);
// Checks the profiles against the number of devices (EINVAL: too few for
// a profile); MakeFilesystem does this first.
Status ValidateMkfsProfiles(const MkfsOptions& opts, size_t devices);
// The metadata and data profiles the options give on `devices` devices,
// defaults filled in (mkfs.btrfs's): {metadata, data}.
std::pair<uint64_t, uint64_t> MkfsProfiles(const MkfsOptions& opts, size_t devices);

// Whether any superblock copy that fits on the device carries the btrfs
// magic (the test mkfs.btrfs makes before it refuses to overwrite without -f).
Result<bool> HasBtrfsSignature(io::BlockDevice* dev);

// "9f0c3b5e-..." into bytes; nullopt when malformed.
std::optional<Uuid> ParseUuid(const std::string& text);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_MKFS_H_
