// ubtrfs cp HOST IMAGE:PATH, mkdir and rm against btrfs check and the read path.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::ProgsSpace;
using ubtrfs_test::SpaceFromDumpTree;

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
  const ProgsSpace fresh = SpaceFromDumpTree(img);
  ASSERT_GT(fresh.data_groups, 0);
  ASSERT_EQ(fresh.data_used, 0u);
  uint64_t used_fresh = 0;
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto st = (*fs)->StatFs();
    ASSERT_TRUE(st.ok());
    used_fresh = st->used_bytes;
    EXPECT_EQ(used_fresh, fresh.data_used + fresh.metadata_used + fresh.system_used);
  }

  r = RunCommand({UBTRFS_CLI_PATH, "mkdir", "-p", img + ":/x/y"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "cp", src, img + ":/x/y"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(BtrfsCheck(img), "");
  const ProgsSpace copied = SpaceFromDumpTree(img);
  ASSERT_GT(copied.data_used, 1u << 20) << "the generated tree has too little data to see it freed";
  EXPECT_GT(copied.data_extents, 0u);
  uint64_t free_copied = 0, used_copied = 0;
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto st = (*fs)->StatFs();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->used_bytes, copied.data_used + copied.metadata_used + copied.system_used);
    EXPECT_GE(st->used_bytes, used_fresh + copied.data_used);
    free_copied = st->free_bytes;
    used_copied = st->used_bytes;
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
  // Everything freed: only metadata and no data extents remain. The
  // extent tree (read by btrfs-progs) holds no data extent, every data
  // block group is back to 0 bytes used, and the superblock's bytes_used
  // (what StatFs reports) is the sum of the block groups' used bytes, so
  // none of the copied data is still counted anywhere.
  const ProgsSpace after = SpaceFromDumpTree(img);
  EXPECT_EQ(after.data_extents, 0u);
  EXPECT_EQ(after.data_used, 0u);
  EXPECT_EQ(after.data_groups, copied.data_groups);
  auto sfs = (*fs)->StatFs();
  ASSERT_TRUE(sfs.ok());
  EXPECT_EQ(sfs->used_bytes, after.data_used + after.metadata_used + after.system_used);
  // Free is what the kernel's statfs says: less than total - used (DUP
  // metadata counts twice, the global reserve is taken off).
  EXPECT_LE(sfs->free_bytes + sfs->used_bytes, sfs->total_bytes);
  // All of the copied data came back as free space (and the metadata of the
  // removed tree with it).
  EXPECT_GE(sfs->free_bytes, free_copied + copied.data_used) << "removing the tree freed less than its data";
  EXPECT_LE(sfs->used_bytes, used_copied - copied.data_used);
}

}  // namespace
