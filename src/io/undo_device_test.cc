#include "io/undo_device.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

TEST(UndoDevice, RollbackRestoresEveryByteAfterOverlappingWrites) {
  std::vector<uint8_t> start(1 << 16);
  std::mt19937 rng(1);
  for (auto& b : start) b = static_cast<uint8_t>(rng());
  auto dev = std::make_unique<UndoDevice>(NewMemoryDevice("mem", start));
  UndoDevice& u = *dev;
  for (int i = 0; i < 200; ++i) {
    const uint64_t off = rng() % 60000, len = 1 + rng() % 5000;
    std::vector<uint8_t> data(std::min<uint64_t>(len, start.size() - off), static_cast<uint8_t>(i));
    ASSERT_TRUE(u.WriteAt(off, data).ok());
  }
  EXPECT_LE(u.held_bytes(), start.size());  // each byte saved at most once
  std::vector<uint8_t> now(start.size());
  ASSERT_TRUE(u.ReadAt(0, now).ok());
  EXPECT_NE(now, start);
  ASSERT_TRUE(u.Rollback().ok());
  ASSERT_TRUE(u.ReadAt(0, now).ok());
  EXPECT_EQ(now, start);
}

TEST(UndoDevice, ForgetKeepsTheWrites) {
  std::vector<uint8_t> start(4096, 1);
  UndoDevice u(NewMemoryDevice("mem", start));
  std::vector<uint8_t> two(100, 2), three(50, 3);
  ASSERT_TRUE(u.WriteAt(10, two).ok());
  u.Forget();
  ASSERT_TRUE(u.WriteAt(20, three).ok());
  ASSERT_TRUE(u.Rollback().ok());
  std::vector<uint8_t> now(4096);
  ASSERT_TRUE(u.ReadAt(0, now).ok());
  EXPECT_EQ(now[10], 2);   // before Forget: kept
  EXPECT_EQ(now[20], 2);   // after: back to what Forget saw
  EXPECT_EQ(now[69], 2);
  EXPECT_EQ(now[110], 1);
}

}  // namespace
}  // namespace ubtrfs::io
