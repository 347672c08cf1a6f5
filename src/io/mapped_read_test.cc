#include "io/mapped_read.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <gtest/gtest.h>
#include <string>
#include <vector>

#include "io/block_device.h"

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

std::string TempFileWith(const std::string& bytes) {
  std::string path = ::testing::TempDir() + "/ubtrfs_mapped_read_XXXXXX";
  int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return path;
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 4096) % 251);
  return s;
}

std::string Str(const MappedBytes& m) { return std::string(m.bytes().begin(), m.bytes().end()); }

// A map of any range, page aligned or not, holds the file's bytes there.
TEST(MappedRead, ARangeMapsToTheFilesBytes) {
  const std::string bytes = Pattern(5 * 4096 + 123);
  const std::string path = TempFileWith(bytes);
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (auto [off, len] : std::vector<std::pair<size_t, size_t>>{{0, 4096}, {4096, 8192}, {100, 5000}, {4095, 2},
                                                                  {0, bytes.size()}}) {
    MappedBytes m = MapFileRange(fd, off, len);
    ASSERT_FALSE(m.empty()) << off << "+" << len;
    EXPECT_EQ(Str(m), bytes.substr(off, len)) << off << "+" << len;
  }
  EXPECT_TRUE(MapFileRange(fd, 0, 0).empty());
  // Past the end nothing reads: empty, not a crash.
  EXPECT_TRUE(MapFileRange(fd, 8 * 4096, 4096).empty());
  ::close(fd);
  ::unlink(path.c_str());
}

bool SumIsOdd(const void* ctx) {
  const auto& m = *static_cast<const MappedBytes*>(ctx);
  unsigned sum = 0;
  for (uint8_t b : m.bytes()) sum += b;
  return sum % 2 == 1;
}

// A page that goes away under a map (the file cut short by someone else)
// is an I/O error from TouchMapped, not the end of the process; a second
// touch fails the same way, and a map of what is left reads.
TEST(MappedRead, APageCutAwayUnderTheMapIsAnErrorNotACrash) {
  const std::string bytes = Pattern(4 * 4096);
  const std::string path = TempFileWith(bytes);
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  MappedBytes m = MapFileRange(fd, 0, bytes.size());
  ASSERT_FALSE(m.empty());
  unsigned sum = 0;
  for (char c : bytes) sum += static_cast<uint8_t>(c);
  auto before = TouchMapped(SumIsOdd, &m);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_EQ(*before, sum % 2 == 1);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  for (int i = 0; i < 2; ++i) {
    auto after = TouchMapped(SumIsOdd, &m);
    ASSERT_FALSE(after.ok());
    EXPECT_EQ(after.status().code(), EIO);
    EXPECT_NE(after.status().ToString().find("SIGBUS"), std::string::npos) << after.status().ToString();
  }
  MappedBytes first = MapFileRange(fd, 0, 4096);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(Str(first), bytes.substr(0, 4096));
  ::close(fd);
  ::unlink(path.c_str());
}

// An image file maps what a read would give: its bytes, writes gathered
// but not yet in the file included; past the device's end nothing maps.
TEST(MappedRead, AFileDeviceMapsWhatReadAtGives) {
  const std::string path = TempFileWith(std::string(1 << 20, 'x'));
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  // Small writes are gathered into a batch before they reach the file.
  for (int i = 0; i < 4; ++i) {
    const std::vector<uint8_t> block(4096, static_cast<uint8_t>('a' + i));
    ASSERT_TRUE((*dev)->WriteAt(65536 + i * 4096, block).ok());
  }
  MappedBytes m = (*dev)->MapForRead(65536 - 4096, 6 * 4096);
  ASSERT_FALSE(m.empty());
  std::vector<uint8_t> via_read(6 * 4096);
  ASSERT_TRUE((*dev)->ReadAt(65536 - 4096, via_read).ok());
  EXPECT_EQ(Str(m), std::string(via_read.begin(), via_read.end()));
  EXPECT_EQ(Str(m), std::string(4096, 'x') + std::string(4096, 'a') + std::string(4096, 'b') +
                        std::string(4096, 'c') + std::string(4096, 'd') + std::string(4096, 'x'));
  EXPECT_TRUE((*dev)->MapForRead((1 << 20) - 4096, 8192).empty());
  // A device that is not a file maps nothing: the caller reads.
  const std::string mem(8192, 'm');
  auto memdev = NewMemoryDevice("mem", std::span(reinterpret_cast<const uint8_t*>(mem.data()), mem.size()));
  EXPECT_TRUE(memdev->MapForRead(0, 4096).empty());
  dev->reset();
  ::unlink(path.c_str());
}

}  // namespace UBTRFS_UNITY_ID
}  // namespace ubtrfs::io
