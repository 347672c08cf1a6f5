#include "txn/space_reserve.h"

#include <gtest/gtest.h>

namespace ubtrfs::txn {
namespace UBTRFS_UNITY_ID {

constexpr uint64_t kMiB = 1ull << 20;

TEST(GlobalReserve, FloorSixteenthAndCap) {
  // Small metadata: the floor of 128 tree blocks.
  EXPECT_EQ(GlobalReserveBytes(8 * kMiB, 16384), kGlobalReserveMinBlocks * 16384);
  EXPECT_EQ(GlobalReserveBytes(0, 4096), kGlobalReserveMinBlocks * 4096);
  // A sixteenth of the metadata chunks, in whole tree blocks.
  EXPECT_EQ(GlobalReserveBytes(1024 * kMiB, 16384), 64 * kMiB);
  EXPECT_EQ(GlobalReserveBytes(1024 * kMiB + 5, 16384) % 16384, 0u);
  // At most 512 MiB.
  EXPECT_EQ(GlobalReserveBytes(64ull * 1024 * kMiB, 16384), kGlobalReserveMax);
  // Never less than what a deletion reserves on top of the commit reserve
  // (4 items of 16 blocks: write_ops.cc), so deletions run where changes stop.
  for (uint32_t node : {4096u, 16384u, 65536u}) EXPECT_GT(GlobalReserveBytes(0, node), 4u * 16 * node);
}

}  // namespace
}  // namespace ubtrfs::txn
