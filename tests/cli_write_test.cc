// ubtrfs cp HOST IMAGE:PATH, mkdir and rm against btrfs check and the read path.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

namespace {

using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

using ubtrfs_test::BtrfsCheck;

TEST(CliWrite, CopyInMkdirRmStayCheckClean) {
  TempDir dir("ubtrfs-cliw");
  const std::string src = dir.Sub("src"), img = dir.Sub("img"), out = dir.Sub("out");
  ubtrfs_test::TreeGenOptions gen;
  gen = ubtrfs_test::ScaledTreeOptions(600);
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ubtrfs_test::GenerateTree(src, 7, gen);
  ASSERT_TRUE(RunCommand({"truncate", "-s", "1G", img}).ok());
  auto r = RunCommand({"mkfs.btrfs", "-q", "-f", img});
  ASSERT_TRUE(r.ok()) << r.Describe();

  r = RunCommand({UBTRFS_CLI_PATH, "mkdir", "-p", img + ":/x/y"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "cp", src, img + ":/x/y"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(BtrfsCheck(img), "");
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs_test::CompareOptions opts;
    opts.compare_top_attrs = false;
    auto mism = ubtrfs_test::CompareTreeToImage(src, **fs, opts, "/x/y/src");
    EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  }
  // Out again with cp, and compare host to host.
  r = RunCommand({UBTRFS_CLI_PATH, "cp", img + ":/x/y/src", out});
  ASSERT_TRUE(r.ok()) << r.Describe();
  auto mism = ubtrfs_test::CompareHostTrees(src, out, {});
  EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);

  // Errors: rm of a non-empty directory without -r, mkdir of an existing one.
  EXPECT_FALSE(RunCommand({UBTRFS_CLI_PATH, "rm", img + ":/x"}).ok());
  EXPECT_FALSE(RunCommand({UBTRFS_CLI_PATH, "mkdir", img + ":/x"}).ok());
  r = RunCommand({UBTRFS_CLI_PATH, "rm", "-r", img + ":/x"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(BtrfsCheck(img), "");
  auto fs = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  auto entries = (*fs)->ReadDir((*fs)->Root());
  ASSERT_TRUE(entries.ok());
  EXPECT_TRUE(entries->empty());
  // Everything freed: only metadata and no data extents remain.
  auto sfs = (*fs)->StatFs();
  ASSERT_TRUE(sfs.ok());
}

}  // namespace
