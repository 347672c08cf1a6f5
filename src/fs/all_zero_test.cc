#include "fs/all_zero.h"

#include <gtest/gtest.h>

#include <vector>

namespace ubtrfs::fs {
namespace UBTRFS_UNITY_ID {

// Every length across the 64-byte blocks and the tail, and a single set
// byte at every place of it (unaligned starts too).
TEST(AllZero, FindsASetByteAnywhere) {
  std::vector<uint8_t> buf(4096 + 200, 0);
  for (size_t start : {size_t{0}, size_t{3}}) {
    for (size_t len = 0; len <= 200; ++len) {
      std::span<const uint8_t> d(buf.data() + start, len);
      ASSERT_TRUE(AllZero(d)) << len;
      for (size_t at = 0; at < len; ++at) {
        buf[start + at] = 0x80;
        ASSERT_FALSE(AllZero(d)) << "len " << len << " byte " << at;
        buf[start + at] = 0;
      }
    }
  }
  EXPECT_TRUE(AllZero(std::span<const uint8_t>(buf.data(), 4096)));
  buf[4095] = 1;
  EXPECT_FALSE(AllZero(std::span<const uint8_t>(buf.data(), 4096)));
}

}  // namespace
}  // namespace ubtrfs::fs
