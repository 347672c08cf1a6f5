#include "io/fault_device.h"

#include <gtest/gtest.h>

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

class FaultDeviceTest : public ::testing::Test {
 protected:
  FaultDeviceTest() : mem_(NewMemoryDevice("mem", std::vector<uint8_t>(1 << 16))), dev_(mem_.get()) {}
  Status Write(uint64_t off, uint8_t v = 1) {
    std::vector<uint8_t> b(512, v);
    return dev_.WriteAt(off, b);
  }
  Status Read(uint64_t off) {
    std::vector<uint8_t> b(512);
    return dev_.ReadAt(off, b);
  }
  std::unique_ptr<BlockDevice> mem_;
  FaultDevice dev_;
};

TEST_F(FaultDeviceTest, FailsTheNthWriteOnceAndItDoesNotReachTheDevice) {
  dev_.FailNth(FaultOp::kWrite, 3);
  EXPECT_TRUE(Write(0).ok());
  EXPECT_TRUE(Write(512).ok());
  Status st = Write(1024, 7);
  EXPECT_EQ(st.code(), EIO);
  EXPECT_NE(st.message().find("offset 1024"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("injected"), std::string::npos) << st.ToString();
  EXPECT_TRUE(Write(1536).ok());
  std::vector<uint8_t> b(1);
  ASSERT_TRUE(mem_->ReadAt(1024, b).ok());
  EXPECT_EQ(b[0], 0);
  EXPECT_EQ(dev_.writes(), 4u);
  EXPECT_EQ(dev_.faults(), 1u);
}

TEST_F(FaultDeviceTest, FailsEveryWriteAfterN) {
  dev_.FailAfter(FaultOp::kWrite, 2, EROFS);
  EXPECT_TRUE(Write(0).ok());
  EXPECT_TRUE(Write(0).ok());
  EXPECT_EQ(Write(0).code(), EROFS);
  EXPECT_EQ(Write(0).code(), EROFS);
  EXPECT_TRUE(Read(0).ok()) << "reads are not affected";
  dev_.Clear();
  EXPECT_TRUE(Write(0).ok());
}

TEST_F(FaultDeviceTest, FailsReadsTouchingARange) {
  dev_.FailRange(FaultOp::kRead, 4096, 4096);
  EXPECT_TRUE(Read(4096 - 512).ok());
  EXPECT_EQ(Read(4096 - 511).code(), EIO);
  EXPECT_EQ(Read(8191).code(), EIO);
  EXPECT_TRUE(Read(8192).ok());
  EXPECT_TRUE(Write(4096).ok()) << "writes are not affected";
  EXPECT_EQ(dev_.faults(), 2u);
}

TEST_F(FaultDeviceTest, NthReadAndFlush) {
  dev_.FailNth(FaultOp::kRead, 1);
  dev_.FailNth(FaultOp::kFlush, 2);
  EXPECT_EQ(Read(0).code(), EIO);
  EXPECT_TRUE(Read(0).ok());
  EXPECT_TRUE(dev_.Flush().ok());
  EXPECT_EQ(dev_.Flush().code(), EIO);
  EXPECT_TRUE(dev_.Flush().ok());
}

TEST_F(FaultDeviceTest, FullDeviceReportsEnospc) {
  dev_.SetFull(true);
  Status st = Write(0);
  EXPECT_EQ(st.code(), ENOSPC);
  EXPECT_NE(dev_.last_fault().find("device full"), std::string::npos);
  EXPECT_TRUE(Read(0).ok());
  dev_.SetFull(false);
  EXPECT_TRUE(Write(0).ok());
}

}  // namespace
}  // namespace ubtrfs::io
