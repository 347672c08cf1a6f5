// ubtrfs under the name mkfs.btrfs: image builders that run `mkfs.btrfs` by
// name (systemd-repart, and mkosi through it) build with ubtrfs when a
// mkfs.btrfs linked to mkfs.ubtrfs (or to ubtrfs, which then is its mkfs
// verb) comes first in PATH. The arguments are the ones systemd's
// make_filesystem() passes.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif
#ifndef UBTRFS_MKFS_PATH
#error "UBTRFS_MKFS_PATH must name the mkfs.ubtrfs executable"
#endif

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

constexpr char kUuid[] = "3e4807d8-a87a-4125-94b5-25c5eef8b14e";

// A directory holding mkfs.btrfs, a symbolic link to `target`.
std::string LinkAsMkfsBtrfs(const TempDir& dir, const std::string& target = UBTRFS_MKFS_PATH) {
  const std::string bin = dir.Sub("bin");
  if (::mkdir(bin.c_str(), 0755) != 0) return "";
  if (::symlink(target.c_str(), (bin + "/mkfs.btrfs").c_str()) != 0) return "";
  return bin;
}

// Linked to mkfs.ubtrfs, and to ubtrfs.
class MkfsBtrfsName : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Programs, MkfsBtrfsName, ::testing::Values(UBTRFS_MKFS_PATH, UBTRFS_CLI_PATH),
                         [](const auto& info) { return info.index == 0 ? "MkfsUbtrfs" : "Ubtrfs"; });

TEST_P(MkfsBtrfsName, TakesTheArgumentsSystemdRepartPasses) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-as-mkfs-btrfs");
  const std::string bin = LinkAsMkfsBtrfs(dir, GetParam());
  ASSERT_FALSE(bin.empty());
  const std::string src = dir.Sub("src"), img = dir.Sub("part.img");
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  GenerateTree(src, 7, ScaledTreeOptions(200));
  std::string err;
  ASSERT_TRUE(MakeSparseFile(img, 256ull << 20, &err)) << err;

  // systemd 255+: mkfs.btrfs -L LABEL -U UUID NODE [--nodiscard] [-r ROOT] [-q]
  auto r = RunCommand({bin + "/mkfs.btrfs", "-L", "root-x86-64", "-U", kUuid, img, "--nodiscard", "-r", src, "-q"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out, "") << "-q prints nothing";
  EXPECT_EQ(BtrfsCheck(img), "");
  auto fs = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_EQ((*fs)->Info().label, "root-x86-64");
  EXPECT_EQ((*fs)->Info().fsid, kUuid);
  auto mism = CompareTreeToImage(src, **fs, CompareOptions{});
  EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);

  // Under that name a missing image is mkfs's error, not "a subcommand is required".
  r = RunCommand({bin + "/mkfs.btrfs", "-q"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.find("subcommand"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("image"), std::string::npos) << r.err;
  // And an existing filesystem is refused without -f, as mkfs.btrfs does.
  r = RunCommand({bin + "/mkfs.btrfs", "-q", img});
  EXPECT_NE(r.exit_code, 0);
  fs = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_EQ((*fs)->Info().fsid, kUuid);
}

// systemd-repart itself, as root: it makes the partition table, runs
// mkfs.btrfs on a loop device of the partition, then mounts it with the
// kernel and copies the files in (systemd 252; newer ones pass -r).
TEST(MkfsBtrfsRepart, SystemdRepartFormatsWithIt) {
  const std::string repart = FindProgram("systemd-repart");
  if (repart.empty()) GTEST_SKIP() << "systemd-repart not installed";
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << why;
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-repart");
  const std::string bin = LinkAsMkfsBtrfs(dir);
  ASSERT_FALSE(bin.empty());
  const std::string src = dir.Sub("src"), defs = dir.Sub("repart.d"), disk = dir.Sub("disk.img");
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(defs.c_str(), 0755), 0);
  GenerateTree(src, 11, ScaledTreeOptions(300));
  std::ofstream(defs + "/10-root.conf") << "[Partition]\nType=root\nFormat=btrfs\nLabel=built\n"
                                        << "CopyFiles=" << src << ":/\nSizeMinBytes=300M\n";
  // What repart runs is logged by a mkfs.btrfs ahead in PATH that hands on
  // to the link, so the log shows that repart ran ubtrfs under that name.
  const std::string logbin = dir.Sub("logbin"), logged = dir.Sub("args.log");
  ASSERT_EQ(::mkdir(logbin.c_str(), 0755), 0);
  std::ofstream(logbin + "/mkfs.btrfs") << "#!/bin/sh\necho \"$@\" >> '" << logged << "'\nexec '" << bin
                                        << "/mkfs.btrfs' \"$@\"\n";
  ASSERT_EQ(::chmod((logbin + "/mkfs.btrfs").c_str(), 0755), 0);

  const std::string path = logbin + ":" + (std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin");
  auto r = RunCommand({"env", "PATH=" + path, repart, "--empty=create", "--size=auto", "--dry-run=no",
                       "--definitions=" + defs, disk});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.err.find("successfully formatted as btrfs"), std::string::npos) << r.err;
  std::string args;
  std::getline(std::ifstream(logged), args);
  EXPECT_NE(args.find("-L built"), std::string::npos) << "mkfs.btrfs was run as: " << args;

  // The partition, cut out of the disk, is the filesystem ubtrfs made and
  // the kernel filled.
  auto part = RunCommand({"sh", "-c",
                          "set -e; start=$(sfdisk -J \"$0\" | sed -n 's/.*\"start\": *\\([0-9]*\\).*/\\1/p'); "
                          "size=$(sfdisk -J \"$0\" | sed -n 's/.*\"size\": *\\([0-9]*\\).*/\\1/p'); "
                          "dd if=\"$0\" of=\"$1\" bs=512 skip=$start count=$size conv=sparse status=none",
                          disk, dir.Sub("part.img")});
  ASSERT_TRUE(part.ok()) << part.Describe();
  EXPECT_EQ(BtrfsCheck(dir.Sub("part.img")), "");
  auto fs = ubtrfs::Filesystem::Open(dir.Sub("part.img"));
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_EQ((*fs)->Info().label, "built");
  CompareOptions co;
  co.compare_top_attrs = false;  // repart makes the top directory itself
  // What systemd 252's copy does not keep, whatever the filesystem:
  // trusted.* xattrs, and hard links between symbolic links.
  co.ignore_xattr_prefixes = {"trusted."};
  co.compare_nlink = false;
  co.compare_hardlink_identity = false;
  auto mism = CompareTreeToImage(src, **fs, co);
  EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
}

}  // namespace
}  // namespace ubtrfs_test
