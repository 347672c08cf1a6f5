// The bulk import behind `ubtrfs mkfs --rootdir` (fs::ImportContents with
// ImportOptions::bulk): generated trees with every kind of inode, xattrs
// (colliding name hashes included), hundreds of hard links, deep paths and
// large directories, at three node sizes. Each image must be btrfs-check
// clean and equal to the source through ubtrfs's read path, look the same
// as the item-by-item import of the same tree, and (where loop mounts work)
// look the same to the kernel.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "fs/import.h"
#include "io/block_device.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "txn/mkfs.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::TempDir;

// A fresh image of `nodesize` with `src` imported into its top directory.
void MakeImported(const std::string& img, const std::string& src, uint32_t nodesize, bool bulk,
                  fs::ImportStats* stats) {
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(img, 1ull << 30, &err)) << err;
  {
    auto dev = io::OpenFileDevice(img, io::OpenFlags{true});
    ASSERT_TRUE(dev.ok());
    txn::MkfsOptions opts;
    opts.nodesize = nodesize;
    ASSERT_TRUE(txn::MakeFilesystem(dev->get(), opts).ok());
  }
  OpenOptions o;
  o.writable = true;
  auto fs = Filesystem::Open(img, o);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  fs::ImportOptions io;
  io.bulk = bulk;
  Status st = fs::ImportContents(**fs, src, (*fs)->Root(), io, stats);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE((*fs)->Commit().ok());
}

class BulkImportTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(BulkImportTest, SameTreeAsTheSourceAndTheItemByItemImport) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  const uint32_t nodesize = GetParam();
  TempDir dir("ubtrfs-bulk-import");
  const std::string src = dir.Sub("src");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  auto gen = ubtrfs_test::GenerateTreeWithStats(src, 40 + nodesize, ubtrfs_test::ScaledTreeOptions(3000));
  ASSERT_GT(gen.hard_links, 0u);
  ASSERT_GT(gen.xattrs, 0u);
  const std::string bulk = dir.Sub("bulk.img"), plain = dir.Sub("plain.img");
  fs::ImportStats bs, ps;
  MakeImported(bulk, src, nodesize, true, &bs);
  MakeImported(plain, src, nodesize, false, &ps);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(bs.files, ps.files);
  EXPECT_EQ(bs.dirs, ps.dirs);
  EXPECT_EQ(bs.symlinks, ps.symlinks);
  EXPECT_EQ(bs.hardlinks, ps.hardlinks);
  EXPECT_EQ(bs.specials, ps.specials);
  EXPECT_EQ(bs.bytes, ps.bytes);
  EXPECT_EQ(bs.xattrs, ps.xattrs);
  ASSERT_EQ(BtrfsCheck(bulk), "");
  auto fs = Filesystem::Open(bulk);
  ASSERT_TRUE(fs.ok());
  auto mism = ubtrfs_test::CompareTreeToImage(src, **fs, {});
  EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  // The kernel's view of both images, file by file.
  const std::string a = dir.Sub("a"), b = dir.Sub("b");
  ASSERT_EQ(mkdir(a.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(b.c_str(), 0755), 0);
  ubtrfs_test::LoopMount ma, mb;
  ASSERT_EQ(ma.Mount(bulk, a, "ro"), "");
  ASSERT_EQ(mb.Mount(plain, b, "ro"), "");
  ubtrfs_test::CompareOptions kernel;
  kernel.compare_dir_size = true;
  kernel.compare_nbytes = true;
  mism = ubtrfs_test::CompareHostTrees(b, a, kernel);
  EXPECT_TRUE(mism.empty()) << "bulk vs item by item, as the kernel sees them:\n" << ubtrfs_test::FormatMismatches(mism);
  mism = ubtrfs_test::CompareHostTrees(src, a, {});
  EXPECT_TRUE(mism.empty()) << "source vs bulk, as the kernel sees it:\n" << ubtrfs_test::FormatMismatches(mism);
}

INSTANTIATE_TEST_SUITE_P(NodeSizes, BulkImportTest, ::testing::Values(4096u, 16384u, 65536u),
                         [](const auto& info) { return "node" + std::to_string(info.param); });

// Bad input gives clear errors naming the path; a destination that is not
// empty is imported item by item.
TEST(BulkImport, ClearErrors) {
  TempDir dir("ubtrfs-bulk-errors");
  const std::string img = dir.Sub("img");
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(img, 256ull << 20, &err)) << err;
  {
    auto dev = io::OpenFileDevice(img, io::OpenFlags{true});
    ASSERT_TRUE(dev.ok());
    ASSERT_TRUE(txn::MakeFilesystem(dev->get(), txn::MkfsOptions{}).ok());
  }
  OpenOptions o;
  o.writable = true;
  auto fs = Filesystem::Open(img, o);
  ASSERT_TRUE(fs.ok());
  fs::ImportOptions io;
  io.bulk = true;
  Status st = fs::ImportContents(**fs, img, (*fs)->Root(), io);
  EXPECT_EQ(st.code(), ENOTDIR);
  EXPECT_NE(st.message().find(img), std::string::npos) << st.ToString();
  st = fs::ImportContents(**fs, dir.Sub("missing"), (*fs)->Root(), io);
  EXPECT_EQ(st.code(), ENOENT);
  auto sub = (*fs)->Mkdir((*fs)->Root(), "x", NewInode{0755});
  ASSERT_TRUE(sub.ok());
  const std::string src = dir.Sub("src");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((src + "/y").c_str(), 0700), 0);
  st = fs::ImportContents(**fs, src, (*fs)->Root(), io);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto y = (*fs)->Lookup("/y");
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ((*fs)->GetStat(*y)->mode & 07777, 0700u);
  EXPECT_TRUE((*fs)->Lookup("/x").ok());
  ASSERT_TRUE((*fs)->Commit().ok());
  fs->reset();
  EXPECT_EQ(BtrfsCheck(img), "");
}

}  // namespace
