#include "fs/statfs.h"

#include <gtest/gtest.h>

#include "format/ondisk.h"

namespace ubtrfs::fsimpl {
namespace UBTRFS_UNITY_ID {

using namespace ubtrfs::format;
constexpr uint64_t kMiB = 1ull << 20;

// A fresh `mkfs.btrfs` (progs 6.2) 1 GiB image: DUP metadata and system,
// single data, free space tree, 16 KiB nodes. The expected figures are what
// Linux 6.18 reported with statvfs on loop mounts of it (a read-only loop
// device: `mount -o loop,ro`; a writable one, mounted ro or rw).
StatFsInput Fresh1GiB(bool devices_writable) {
  StatFsInput in;
  in.sectorsize = 4096;
  in.nodesize = 16384;
  in.super_total_bytes = 1024 * kMiB;
  in.groups = {{kBlockGroupSystem | kBlockGroupDup, 8 * kMiB, 16384},
               {kBlockGroupMetadata | kBlockGroupDup, 53673984, 131072},
               {kBlockGroupData, 8 * kMiB, 0}};
  in.devices = {{1024 * kMiB, 132513792}};
  in.devices_writable = devices_writable;
  in.reserve_trees = 4;  // tree root, extent, csum, free space
  in.reserve_tree_bytes = 3 * 16384;
  in.free_space_tree = true;
  return in;
}

TEST(StatFs, FreshImageAsTheKernelCountsIt) {
  const StatFsFigures ro = KernelStatFs(Fresh1GiB(false));
  EXPECT_EQ(ro.global_reserve, 5767168u);  // sysfs allocation/global_rsv_size
  EXPECT_EQ(ro.blocks, 262144u);
  EXPECT_EQ(ro.bfree, 260664u);
  EXPECT_EQ(ro.bavail, 229536u);  // read-only devices: the data chunk's 8 MiB are not available
  const StatFsFigures rw = KernelStatFs(Fresh1GiB(true));
  EXPECT_EQ(rw.bfree, 260664u);
  EXPECT_EQ(rw.bavail, 231584u);
}

TEST(StatFs, MetadataFullLeavesNothingAvailable) {
  StatFsInput in = Fresh1GiB(true);
  in.metadata_full = true;
  EXPECT_GT(KernelStatFs(in).bavail, 0u) << "50 MiB of metadata free: more than the reserve";
  in.groups[1].used = in.groups[1].length - 4 * kMiB;  // 8 MiB free on the device: < 4 MiB + reserve
  EXPECT_EQ(KernelStatFs(in).bavail, 0u);
}

// Two 1 GiB devices, RAID1 data and metadata: everything counts half.
TEST(StatFs, Raid1HalvesTheFigures) {
  StatFsInput in;
  in.super_total_bytes = 2048 * kMiB;
  in.groups = {{kBlockGroupSystem | kBlockGroupRaid1, 8 * kMiB, 16384},
               {kBlockGroupMetadata | kBlockGroupRaid1, 107347968, 131072},
               {kBlockGroupData | kBlockGroupRaid1, 107347968, 0}};
  in.devices = {{1024 * kMiB, 223084544}, {1024 * kMiB, 223084544}};
  in.reserve_trees = 4;
  in.free_space_tree = true;
  in.devices_writable = false;
  const StatFsFigures ro = KernelStatFs(in);
  EXPECT_EQ(ro.blocks, 262144u);
  EXPECT_EQ(ro.bfree, 260700u);
  EXPECT_EQ(ro.bavail, 207424u);
  in.devices_writable = true;
  EXPECT_EQ(KernelStatFs(in).bavail, 233632u);
}

TEST(StatFs, GlobalReserveGrowsWithTheTreesUpTo512MiB) {
  StatFsInput in = Fresh1GiB(false);
  in.reserve_tree_bytes = 100 * kMiB;
  EXPECT_EQ(KernelGlobalReserve(in), 100 * kMiB);
  in.reserve_tree_bytes = 2048 * kMiB;
  EXPECT_EQ(KernelGlobalReserve(in), 512 * kMiB);
}

}  // namespace
}  // namespace ubtrfs::fsimpl
