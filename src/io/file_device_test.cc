#include <unistd.h>

#include <cstdlib>
#include <gtest/gtest.h>
#include <string>
#include <vector>

#include "io/block_device.h"
#include "io/fault_device.h"

namespace ubtrfs::io {
namespace {

std::string TempFile() {
  std::string path = ::testing::TempDir() + "/ubtrfs_file_device_XXXXXX";
  int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  ::close(fd);
  return path;
}

// A gathered write puts the pieces back to back, as separate writes would,
// and more pieces than one pwritev call takes (IOV_MAX) still all land.
TEST(FileDevice, GatheredWriteEqualsPieceByPieceWrites) {
  const std::string path = TempFile();
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::span<const uint8_t>> pieces;
  for (int i = 0; i < 1500; ++i) bufs.emplace_back(7 + i % 5, static_cast<uint8_t>(i));
  for (const auto& b : bufs) pieces.emplace_back(b);
  ASSERT_TRUE((*dev)->WriteGather(100, pieces).ok());
  (*dev)->StartWriteback();
  ASSERT_TRUE((*dev)->Flush().ok());
  uint64_t off = 100;
  for (const auto& b : bufs) {
    std::vector<uint8_t> got(b.size());
    ASSERT_TRUE((*dev)->ReadAt(off, got).ok());
    ASSERT_EQ(got, b) << "piece at offset " << off;
    off += b.size();
  }
  EXPECT_EQ((*dev)->Size(), off);
  ::unlink(path.c_str());
}

// Devices that count or fail single writes see a gathered write as one write
// per piece, so crash points stay one block apart.
TEST(FileDevice, GatheredWriteThroughAFaultDeviceIsOneWritePerPiece) {
  auto mem = NewMemoryDevice("mem", std::vector<uint8_t>(4096));
  FaultDevice dev(mem.get());
  dev.FailNth(FaultOp::kWrite, 3);
  const std::vector<uint8_t> a(512, 1), b(512, 2), c(512, 3);
  const std::span<const uint8_t> pieces[] = {a, b, c};
  EXPECT_EQ(dev.WriteGather(0, pieces).code(), EIO);
  EXPECT_EQ(dev.writes(), 3u);
  std::vector<uint8_t> got(1536);
  ASSERT_TRUE(mem->ReadAt(0, got).ok());
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[512], 2);
  EXPECT_EQ(got[1024], 0);  // the failed third piece never reached the device
}

}  // namespace
}  // namespace ubtrfs::io
