#include "fs/compress_ahead.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace ubtrfs::fs {
namespace UBTRFS_UNITY_ID {

std::string WriteTemp(const std::string& bytes) {
  std::string path = ::testing::TempDir() + "/ubtrfs_ahead_XXXXXX";
  const int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return path;
}

std::string Words(size_t n) {
  std::string s;
  for (size_t i = 0; s.size() < n; ++i) s += "sector " + std::to_string(i % 97) + " extent ";
  s.resize(n);
  return s;
}

// The chunks come back in file order with their bytes, each compressible
// range compressed once; a missing file is an error naming it and the
// files after it still come; and the reader thread stops when the consumer
// leaves early. ./test runs this under ThreadSanitizer.
TEST(CompressAhead, ChunksInOrderErrorsNamedEarlyExitStops) {
  const std::string big = Words(3 << 20), small = Words(70000);
  const std::string a = WriteTemp(big), b = WriteTemp(small);
  WriteCompression zc;
  zc.type = 3;  // zstd
  std::vector<CompressAhead::File> files = {{a, big.size()}, {"/nonexistent/ubtrfs-x", 10}, {b, small.size()}};
  {
    CompressAhead ahead(zc, 4096, files);
    std::string got;
    size_t ranges = 0;
    for (;;) {
      auto c = ahead.Next(0);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      if (!*c) break;
      EXPECT_EQ((*c)->off, got.size());
      got.append(reinterpret_cast<const char*>((*c)->data().data()), (*c)->len);
      ranges += (*c)->pre.size();
      for (const auto& p : (*c)->pre) EXPECT_EQ(p.result.kind, RangeResult::kCompressed);
    }
    EXPECT_TRUE(got == big);
    EXPECT_EQ(ranges, big.size() / (128 << 10));
    auto missing = ahead.Next(1);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().ToString().find("/nonexistent/ubtrfs-x"), std::string::npos);
    auto c = ahead.Next(2);
    ASSERT_TRUE(c.ok() && *c);
    EXPECT_EQ((*c)->len, small.size());
    EXPECT_TRUE(std::string(reinterpret_cast<const char*>((*c)->data().data()), (*c)->len) == small);
  }
  {
    CompressAhead ahead(zc, 4096, std::vector<CompressAhead::File>(50, {a, big.size()}));
    ASSERT_TRUE(ahead.Next(0).ok());
  }  // leaves with most of it unread
  {
    CompressAhead none(zc, 4096, {});
    auto c = none.Next(0);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(*c);
  }
  ::unlink(a.c_str());
  ::unlink(b.c_str());
}

}  // namespace
}  // namespace ubtrfs::fs
