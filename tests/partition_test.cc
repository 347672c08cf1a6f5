// A filesystem inside a partition of a whole-disk image (issue 18, part 6):
// every subcommand and the mount take --partition N (GPT or MBR, through
// libblkid) and --offset N, and nothing outside the partition changes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/fuse_mount.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs_test;
const std::string kCli = UBTRFS_CLI_PATH;
constexpr uint64_t kMiB = 1ull << 20;

std::string ReadRange(const std::string& path, uint64_t off, uint64_t len) {
  std::string out(len, '\0');
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const ssize_t n = ::pread(fd, out.data(), len, static_cast<off_t>(off));
  ::close(fd);
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

class PartitionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (FindProgram("sfdisk").empty()) GTEST_SKIP() << "sfdisk (fdisk package) not installed";
    disk_ = tmp_.Sub("disk.img");
    std::string err;
    ASSERT_TRUE(MakeSparseFile(disk_, 320 * kMiB, &err)) << err;
    // Partition 1: 40 MiB of a pattern that must survive; 2: the filesystem.
    const std::string table = GetParam() == "gpt" ? "label: gpt\nsize=40M, type=linux\nsize=200M, type=linux\n"
                                                  : "label: dos\nsize=40M, type=83\nsize=200M, type=83\n";
    auto sf = RunCommand({"sh", "-c", "printf '" + table + "' | sfdisk -q \"$0\"", disk_});
    ASSERT_TRUE(sf.ok()) << sf.Describe();
    auto dump = RunCommand({"sfdisk", "-J", disk_});
    ASSERT_TRUE(dump.ok()) << dump.Describe();
    // The partitions' starts and sizes, in sectors, from sfdisk's JSON.
    std::vector<uint64_t> starts, sizes;
    for (size_t at = 0; (at = dump.out.find("\"start\":", at)) != std::string::npos; at += 8) {
      starts.push_back(std::stoull(dump.out.substr(at + 8)));
      const size_t sz = dump.out.find("\"size\":", at);
      sizes.push_back(std::stoull(dump.out.substr(sz + 7)));
    }
    ASSERT_EQ(starts.size(), 2u) << dump.out;
    p2_start_ = starts[1] * 512;
    p2_size_ = sizes[1] * 512;
    std::string pattern(kMiB, '\0');
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<char>(i * 7 + 3);
    std::ofstream f(disk_, std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t at = starts[0] * 512; at < starts[0] * 512 + 40 * kMiB; at += kMiB) {
      f.seekp(static_cast<std::streamoff>(at));
      f.write(pattern.data(), static_cast<std::streamsize>(pattern.size()));
    }
    f.close();
    src_ = tmp_.Sub("src");
    ASSERT_EQ(::mkdir(src_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((src_ + "/d").c_str(), 0755), 0);
    std::ofstream(src_ + "/d/file") << "in a partition\n";
    std::ofstream(src_ + "/big", std::ios::binary) << std::string(3 * kMiB, 'q');
    auto mk = Cli({"mkfs", "-q", "--partition", "2", "--rootdir", src_, disk_});
    ASSERT_TRUE(mk.ok()) << mk.Describe();
    outside_before_ = Outside();
  }
  CommandResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), kCli);
    return RunCommand(args);
  }
  // Every byte of the disk image outside partition 2.
  std::string Outside() {
    struct stat s;
    ::stat(disk_.c_str(), &s);
    const uint64_t end = p2_start_ + p2_size_;
    return ReadRange(disk_, 0, p2_start_) + ReadRange(disk_, end, static_cast<uint64_t>(s.st_size) - end);
  }
  // The partition as an image file of its own, for btrfs check.
  std::string Extract() {
    const std::string out = tmp_.Sub("p2.img");
    std::ofstream(out, std::ios::binary | std::ios::trunc) << ReadRange(disk_, p2_start_, p2_size_);
    return out;
  }

  TempDir tmp_{"ubtrfs-part"};
  std::string disk_, src_;
  uint64_t p2_start_ = 0, p2_size_ = 0;
  std::string outside_before_;
};

TEST_P(PartitionTest, EverySubcommandWorksInsideThePartition) {
  const std::string p2 = "--partition";
  auto ls = Cli({"ls", p2, "2", disk_, "/d"});
  ASSERT_TRUE(ls.ok()) << ls.Describe();
  EXPECT_EQ(ls.out, "file\n");
  EXPECT_EQ(Cli({"cat", p2, "2", disk_, "/d/file"}).out, "in a partition\n");
  EXPECT_TRUE(Cli({"info", p2, "2", disk_}).ok());
  EXPECT_TRUE(Cli({"stats", p2, "2", disk_}).ok());
  EXPECT_NE(Cli({"dump-tree", p2, "2", "-t", "fs", disk_}).out.find("INODE_ITEM"), std::string::npos);
  auto check = Cli({"check", p2, "2", disk_});
  EXPECT_EQ(check.exit_code, 0) << check.Describe();
  // Changes: cp in, mkdir, rm, a verb and an edit script.
  ASSERT_TRUE(Cli({"cp", p2, "2", src_ + "/d", disk_ + ":/copy"}).ok());
  ASSERT_TRUE(Cli({"mkdir", p2, "2", disk_ + ":/new"}).ok());
  ASSERT_TRUE(Cli({"rm", p2, "2", disk_ + ":/big"}).ok());
  ASSERT_TRUE(Cli({"touch", p2, "2", disk_ + ":/new/t"}).ok());
  const std::string script = tmp_.Sub("script");
  std::ofstream(script) << "mv /new/t /new/u\nsetfattr -n user.a -v b /new/u\n";
  auto ed = Cli({"edit", p2, "2", disk_, "-f", script});
  ASSERT_TRUE(ed.ok()) << ed.Describe();
  auto find = Cli({"find", p2, "2", disk_ + ":/", "-type", "f"});
  EXPECT_EQ(find.out, "/d/file\n/copy/file\n/new/u\n") << find.Describe();
  const std::string out = tmp_.Sub("out");
  ASSERT_TRUE(Cli({"cp", p2, "2", disk_ + ":/copy", out}).ok());
  std::ifstream in(out + "/file");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "in a partition\n");
  // The same through --offset.
  auto off = Cli({"ls", "--offset", std::to_string(p2_start_), disk_, "/new"});
  EXPECT_EQ(off.out, "u\n") << off.Describe();
  // Nothing outside the partition changed; btrfs check agrees.
  EXPECT_TRUE(Outside() == outside_before_) << "bytes outside partition 2 changed";
  EXPECT_EQ(BtrfsCheck(Extract()), "");
}

TEST_P(PartitionTest, TheMountServesThePartition) {
  const std::string reason = FuseUnavailableReason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const std::string mnt = tmp_.Sub("mnt");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  MountProcess m;
  std::string skip, error;
  if (!m.Start(disk_, mnt, tmp_.Sub("log"), {"--partition", "2"}, &skip, &error)) {
    if (!skip.empty()) GTEST_SKIP() << skip;
    FAIL() << error;
  }
  std::ofstream(mnt + "/via-mount") << "written through FUSE\n";
  auto fs_out = RunCommand({"cat", mnt + "/d/file"});
  EXPECT_EQ(fs_out.out, "in a partition\n");
  EXPECT_EQ(m.Unmount(&error), 0) << error << m.Log();
  EXPECT_EQ(Cli({"cat", "--partition", "2", disk_, "/via-mount"}).out, "written through FUSE\n");
  EXPECT_TRUE(Outside() == outside_before_) << "bytes outside partition 2 changed";
  EXPECT_EQ(BtrfsCheck(Extract()), "");
}

TEST_P(PartitionTest, TheKernelMountsWhatUbtrfsWrote) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << why;
  ASSERT_TRUE(Cli({"cp", "--partition", "2", src_ + "/d", disk_ + ":/copy"}).ok());
  LoopMount mnt;
  const std::string dir = tmp_.Sub("kmnt");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(mnt.Mount(disk_, dir, "ro,offset=" + std::to_string(p2_start_) + ",sizelimit=" + std::to_string(p2_size_)),
            "");
  auto fs = ubtrfs::Filesystem::Open(disk_, ubtrfs::OpenOptions{.partition = 2});
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  CompareOptions o = KernelMountCompareOptions();
  auto mism = CompareTreeToImage(dir, **fs, o);
  EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
  EXPECT_EQ(mnt.Unmount(), "");
}

TEST_P(PartitionTest, BadPlacementsAreClearErrors) {
  auto none = Cli({"ls", disk_});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("holds a partition table (partitions 1, 2)"), std::string::npos) << none.err;
  auto p3 = Cli({"ls", "--partition", "3", disk_});
  EXPECT_EQ(p3.exit_code, 1);
  EXPECT_NE(p3.err.find("has no partition 3 (it has 1, 2)"), std::string::npos) << p3.err;
  auto past = Cli({"ls", "--offset", "999999999999", disk_});
  EXPECT_NE(past.err.find("is past the end"), std::string::npos) << past.err;
  auto p1 = Cli({"ls", "--partition", "1", disk_});  // the pattern, no filesystem
  EXPECT_EQ(p1.exit_code, 1);
  EXPECT_NE(p1.err.find("no valid btrfs superblock"), std::string::npos) << p1.err;
  auto mk = Cli({"mkfs", "--partition", "2", "--size", "1G", disk_});
  EXPECT_NE(mk.exit_code, 0);
  EXPECT_TRUE(Outside() == outside_before_);
}

INSTANTIATE_TEST_SUITE_P(Tables, PartitionTest, ::testing::Values("gpt", "mbr"));

}  // namespace
