// mkfs --rootdir --reflink and cp --reflink from the host (issue 19): on a
// host btrfs (a kernel loop mount) the image file shares the source files'
// extents, and its checksums are right (btrfs check --check-data-csum).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::CommandResult;
using ubtrfs_test::LoopMount;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;
using ubtrfs_test::RunUbtrfs;
using ubtrfs_test::WriteRandomFile;

// Bytes of `path` in extents the file system marks shared (FIEMAP).
uint64_t SharedBytes(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return 0;
  uint64_t shared = 0, start = 0;
  constexpr int kN = 256;
  std::vector<uint8_t> buf(sizeof(fiemap) + kN * sizeof(fiemap_extent));
  for (;;) {
    auto* fm = reinterpret_cast<fiemap*>(buf.data());
    std::fill(buf.begin(), buf.end(), 0);
    fm->fm_start = start;
    fm->fm_length = FIEMAP_MAX_OFFSET - start;
    fm->fm_extent_count = kN;
    if (ioctl(fd, FS_IOC_FIEMAP, fm) != 0) {
      ADD_FAILURE() << "FIEMAP " << path << ": " << strerror(errno);
      break;
    }
    if (fm->fm_mapped_extents == 0) break;
    bool last = false;
    for (uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
      const fiemap_extent& e = fm->fm_extents[i];
      if (e.fe_flags & FIEMAP_EXTENT_SHARED) shared += e.fe_length;
      start = e.fe_logical + e.fe_length;
      last |= (e.fe_flags & FIEMAP_EXTENT_LAST) != 0;
    }
    if (last) break;
  }
  close(fd);
  return shared;
}

void MakeSource(const std::string& src) {
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((src + "/d").c_str(), 0755), 0);
  WriteRandomFile(src + "/big", 6 << 20, 1);
  WriteRandomFile(src + "/d/tail", (1 << 20) + 123, 2);  // a partial last sector: written, not cloned
  WriteRandomFile(src + "/d/small", 100, 3);             // inline
  // Sparse: data, a hole, data.
  int fd = open((src + "/d/sparse").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  std::vector<char> b(256 << 10, 'x');
  ASSERT_EQ(pwrite(fd, b.data(), b.size(), 0), static_cast<ssize_t>(b.size()));
  ASSERT_EQ(pwrite(fd, b.data(), b.size(), 8 << 20), static_cast<ssize_t>(b.size()));
  close(fd);
  ASSERT_EQ(symlink("big", (src + "/link").c_str()), 0);
}

void ExpectImageEquals(const std::string& src, const std::string& img, const std::string& at = "/") {
  auto fs = ubtrfs::Filesystem::Open(img, {});
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto mism = ubtrfs_test::CompareTreeToImage(src, **fs, ubtrfs_test::MkfsRootdirCompareOptions(), at);
  EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
}

TEST(MkfsReflinkTest, SharesExtentsOnHostBtrfs) {
  if (ubtrfs_test::FindProgram("mkfs.btrfs").empty()) GTEST_SKIP() << "btrfs-progs not installed";
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  TempDir dir("ubtrfs-reflink");
  const std::string host_img = dir.Sub("host.img"), host = dir.Sub("host");
  std::ofstream(host_img).close();
  ASSERT_EQ(truncate(host_img.c_str(), 512ll << 20), 0);
  auto mk = RunCommand({"mkfs.btrfs", "-q", "-f", host_img});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  ASSERT_EQ(mkdir(host.c_str(), 0755), 0);
  LoopMount m;
  ASSERT_EQ(m.Mount(host_img, host), "");
  const std::string src = host + "/src", img = host + "/img";
  MakeSource(src);

  auto r = RunUbtrfs({"mkfs", "--reflink", "--size", "128M", "--rootdir", src, img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("reflink:"), std::string::npos) << r.out;
  ::sync();
  // big (6 MiB), tail's first MiB and sparse's two 256 KiB runs are shared.
  const uint64_t want = (6u << 20) + (1u << 20) + (512u << 10);
  EXPECT_GE(SharedBytes(img), want);
  EXPECT_GE(SharedBytes(src + "/big"), uint64_t{6} << 20);
  ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  auto full = RunCommand({"btrfs", "check", "--readonly", "--check-data-csum", img});
  EXPECT_TRUE(full.ok()) << full.Describe();
  ExpectImageEquals(src, img);

  // cp --reflink from the host into the image: more shared bytes.
  const uint64_t before = SharedBytes(img);
  WriteRandomFile(src + "/later", 3 << 20, 9);
  ::sync();
  r = RunUbtrfs({"cp", "--reflink", src + "/later", img + ":/later"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_GE(SharedBytes(img), before + (3u << 20));
  ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  full = RunCommand({"btrfs", "check", "--readonly", "--check-data-csum", img});
  EXPECT_TRUE(full.ok()) << full.Describe();
  ExpectImageEquals(src, img);  // `later` is in both now
  ASSERT_EQ(m.Unmount(), "");
}

// Where the host cannot clone (whatever holds the temp directory, or
// another file system than the sources'), --reflink still makes the same
// image: copied by the kernel or written.
TEST(MkfsReflinkTest, FallsBackWhereNoClone) {
  if (ubtrfs_test::FindProgram("btrfs").empty()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-reflink-fallback");
  const std::string src = dir.Sub("src"), img = dir.Sub("img");
  MakeSource(src);
  auto r = RunUbtrfs({"mkfs", "--reflink", "--size", "128M", "--rootdir", src, img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  auto full = RunCommand({"btrfs", "check", "--readonly", "--check-data-csum", img});
  EXPECT_TRUE(full.ok()) << full.Describe();
  ExpectImageEquals(src, img);
  r = RunUbtrfs({"mkfs", "--reflink", "--compress", "zstd", "--size", "128M", "-f", "--rootdir", src, img});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.err.find("exclude each other"), std::string::npos) << r.err;
}

}  // namespace
