#include "io/overlay_device.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

// Random overlapping writes at any alignment: reads through the overlay see
// them as a plain device would, the device below never changes, and a
// shared handle sees the same bytes.
TEST(OverlayDevice, ReadsSeeWritesAndTheDeviceBelowStaysAsItWas) {
  std::vector<uint8_t> start(3 * 4096 * 7 + 1000);  // not a whole number of pages
  std::mt19937 rng(7);
  for (auto& b : start) b = static_cast<uint8_t>(rng());
  auto inner = NewMemoryDevice("mem", start);
  BlockDevice* below = inner.get();
  OverlayDevice overlay(std::move(inner));
  std::vector<uint8_t> model = start;
  for (int i = 0; i < 300; ++i) {
    const uint64_t off = rng() % model.size();
    const uint64_t len = 1 + rng() % std::min<uint64_t>(9000, model.size() - off);
    std::vector<uint8_t> data(len);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    ASSERT_TRUE(overlay.WriteAt(off, data).ok());
    std::copy(data.begin(), data.end(), model.begin() + static_cast<long>(off));
    const uint64_t roff = rng() % model.size(), rlen = 1 + rng() % (model.size() - roff);
    std::vector<uint8_t> got(rlen);
    ASSERT_TRUE(overlay.ReadAt(roff, got).ok());
    ASSERT_TRUE(std::equal(got.begin(), got.end(), model.begin() + static_cast<long>(roff))) << "read " << i;
  }
  std::vector<uint8_t> all(model.size());
  ASSERT_TRUE(overlay.ReadAt(0, all).ok());
  EXPECT_EQ(all, model);
  auto shared = overlay.Share();
  std::fill(all.begin(), all.end(), 0);
  ASSERT_TRUE(shared->ReadAt(0, all).ok());
  EXPECT_EQ(all, model);
  ASSERT_TRUE(below->ReadAt(0, all).ok());
  EXPECT_EQ(all, start) << "the overlay wrote to the device below";
  EXPECT_GT(overlay.held_bytes(), 0u);
  EXPECT_EQ(overlay.Size(), start.size());
}

TEST(OverlayDevice, WritesPastTheEndFailAndChangeNothing) {
  std::vector<uint8_t> start(8192, 0xab);
  OverlayDevice overlay(NewMemoryDevice("mem", start));
  std::vector<uint8_t> data(100, 1);
  EXPECT_FALSE(overlay.WriteAt(8150, data).ok());
  EXPECT_FALSE(overlay.WriteAt(UINT64_MAX - 10, data).ok());
  EXPECT_EQ(overlay.held_bytes(), 0u);
  std::vector<uint8_t> buf(100);
  EXPECT_FALSE(overlay.ReadAt(8150, buf).ok());
}

}  // namespace
}  // namespace ubtrfs::io
