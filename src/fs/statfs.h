// statfs(2) figures as the Linux kernel's btrfs computes them for a mount of
// the same filesystem (fs/btrfs/super.c btrfs_statfs and
// btrfs_calc_avail_data_space, fs/btrfs/block-rsv.c
// btrfs_update_global_block_rsv, as of Linux 6.18; the rules were read
// there, no code was taken). The arithmetic only: the callers gather the
// block groups, devices and tree sizes (StatFsInputFromVolume for a
// read-only view, StatFsInputFromTxn for a running transaction).
//
//   blocks = super total_bytes / data factor (copies a data block group
//            keeps of each byte: 2 for DUP and RAID1, ...)
//   bfree  = blocks - (device bytes used by extents of every kind, DUP
//            and mirrors counted per copy) / data factor - global reserve
//   bavail = (free bytes of writable data block groups) / data factor
//            + unallocated device space that new data chunks could take
//              (each device less its first MiB, whole 64 KiB stripes, the
//              data profile's stripe rules) / data factor;
//            0 when metadata can grow no more and its free space is down
//            to the global reserve plus 4 MiB
//
// The global reserve: the bytes of the extent, csum, free space (and block
// group, raid stripe) trees' blocks, at least what inserting one item per
// such tree plus the tree root plus an unlink's 6 items takes, plus an
// unlink's delayed refs; at most 512 MiB.
//
// The kernel looks at whether the block devices are writable, not at the
// mount's ro flag: on a read-only block device (`mount -o loop,ro IMAGE`
// sets up a read-only loop device) every block group is read-only, so the
// free space in data chunks is not available, and the unallocated space is
// counted as for "single" data. Filesystem::StatFs reports what a mount
// over writable devices reports, read-write or read-only alike (a read-only
// view too: the image is what is described, not how ubtrfs opened it).
// Mixed block groups (mkfs --mixed) follow the same rules as the kernel's
// (one space for data and metadata, the "metadata full" rule off).
#ifndef UBTRFS_FS_STATFS_H_
#define UBTRFS_FS_STATFS_H_

#include <cstdint>
#include <vector>

#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {
class TxnManager;
class Volume;
}  // namespace ubtrfs::txn

namespace ubtrfs::fsimpl {

struct StatFsGroup {
  uint64_t flags = 0;   // BLOCK_GROUP_* type and profile bits
  uint64_t length = 0;  // logical bytes
  uint64_t used = 0;    // logical bytes used (as the block group item has it)
  bool read_only = false;  // a seed device's group under a sprout: its free space is not available
};

struct StatFsDevice {
  uint64_t total_bytes = 0;  // DEV_ITEM total_bytes
  uint64_t bytes_used = 0;   // DEV_ITEM bytes_used: its dev extents
};

struct StatFsInput {
  uint32_t sectorsize = 4096;
  uint32_t nodesize = 16384;
  uint64_t super_total_bytes = 0;
  std::vector<StatFsGroup> groups;
  std::vector<StatFsDevice> devices;  // the present devices, seeds left out (the kernel lists them apart)
  // Whether the block devices are writable (see above): block groups are
  // writable and the data profile is the one new chunks get.
  bool devices_writable = true;
  // bytes_used of the trees the global reserve covers, and how many there
  // are (the tree root counts as one, with 0 bytes: a mount starts it so).
  uint64_t reserve_tree_bytes = 0;
  unsigned reserve_trees = 1;
  bool free_space_tree = false;  // delayed refs cost twice with one
  // Metadata can have no new chunk (the kernel knows it once an allocation
  // failed; a fresh mount never does).
  bool metadata_full = false;
};

struct StatFsFigures {
  uint64_t blocks = 0, bfree = 0, bavail = 0;  // in sectors, as statfs(2)
  uint64_t global_reserve = 0;                 // bytes
};

// The kernel's global block reserve size for these trees.
uint64_t KernelGlobalReserve(const StatFsInput& in);
StatFsFigures KernelStatFs(const StatFsInput& in);

// The input for the committed state of a volume (read from its block group
// items, DEV_ITEMs and ROOT_ITEMs).
Result<StatFsInput> StatFsInputFromVolume(txn::Volume& vol);
// The input for a running transaction: its block groups as they are now.
Result<StatFsInput> StatFsInputFromTxn(txn::TxnManager& txn);

// FsStat from the figures: sizes in bytes, each a whole number of sectors.
FsStat ToFsStat(const StatFsInput& in, const StatFsFigures& f);

}  // namespace ubtrfs::fsimpl

#endif  // UBTRFS_FS_STATFS_H_
