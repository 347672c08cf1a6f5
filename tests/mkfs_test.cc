// mkfs: images written by txn::MakeFilesystem and `ubtrfs mkfs` must pass
// `btrfs check`, open in ubtrfs for reading and for writing (TxnManager's
// free space tree check included), stay check-clean after a commit of ours,
// and mount in the kernel (where loop mounts work) for files to be created.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "format/checksum.h"
#include "format/superblock.h"
#include "io/block_device.h"
#include "support/host_files.h"
#include "support/items.h"
#include "support/mkfs_util.h"
#include "support/open_txn.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "tree/cursor.h"
#include "txn/devices.h"
#include "txn/mkfs.h"
#include "txn/transaction.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using namespace ubtrfs::format;
using ubtrfs_test::CommandResult;
using ubtrfs_test::LoopMount;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

const std::string kCli = UBTRFS_CLI_PATH;
constexpr uint64_t kMiB = 1ull << 20;

bool HaveBtrfsProgs() { return !ubtrfs_test::FindProgram("btrfs").empty(); }

// "" when `btrfs check --readonly` is clean; otherwise its exit and output.
using ubtrfs_test::BtrfsCheck;

Status MakeImage(const std::string& img, uint64_t size, const txn::MkfsOptions& opts,
                 txn::MkfsSummary* summary = nullptr) {
  std::string err;
  if (!ubtrfs_test::MakeSparseFile(img, size, &err)) return Status::IoError(err);
  UB_ASSIGN_OR_RETURN(auto dev, io::OpenFileDevice(img, io::OpenFlags{true}));
  return txn::MakeFilesystem(dev.get(), opts, summary);
}

using ubtrfs_test::XattrItem;

// The fresh image through ubtrfs's read path: an empty root directory and
// sane statfs numbers.
void ExpectEmptyAndSane(const std::string& img, const txn::MkfsOptions& opts, uint64_t total) {
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_TRUE((*fs)->Warnings().empty()) << (*fs)->Warnings().front();
  const FsInfo info = (*fs)->Info();
  EXPECT_EQ(info.label, opts.label);
  EXPECT_EQ(info.nodesize, opts.nodesize);
  EXPECT_EQ(info.sectorsize, 4096u);
  EXPECT_EQ(info.csum_type, CsumTypeName(opts.csum_type));
  EXPECT_EQ(info.total_bytes, total);
  EXPECT_EQ(info.num_devices, 1u);
  EXPECT_EQ(info.generation, 1u);
  auto root = (*fs)->GetStat((*fs)->Root());
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_EQ(root->mode, 040755u);
  EXPECT_EQ(root->nlink, 1u);
  EXPECT_EQ(root->size, 0u);
  auto entries = (*fs)->ReadDir((*fs)->Root());
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  EXPECT_TRUE(entries->empty()) << entries->size() << " entries, first " << entries->front().name;
  auto st = (*fs)->StatFs();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->block_size, 4096u);
  EXPECT_EQ(st->node_size, opts.nodesize);
  EXPECT_EQ(st->total_bytes, total);
  EXPECT_GT(st->used_bytes, 0u);
  EXPECT_LT(st->used_bytes, 64 * kMiB);
  EXPECT_GT(st->free_bytes, 0u);
  EXPECT_LT(st->free_bytes, total);
}

// Opens the image the way the write path does (TxnManager checks that the
// free space tree matches the extent tree), adds xattrs to the root
// directory, commits, and requires btrfs check to stay clean.
void CommitXattrs(const std::string& img, int n) {
  {
    auto o = ubtrfs_test::OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    auto& t = o->txn;
    auto w = t->Writer(kFsTreeObjectid);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (int i = 0; i < n; ++i) {
      const std::string name = "user.mkfs" + std::to_string(i), value(i * 7 % 300, 'v');
      Status st = (*w)->Insert(Key{256, kXattrItemKey, NameHash(name)}, XattrItem(name, value, t->transid()));
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    Status st = t->Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ASSERT_EQ(BtrfsCheck(img), "") << "after a ubtrfs commit";
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto names = (*fs)->ListXattr((*fs)->Root());
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(names->size(), static_cast<size_t>(n));
}

void WriteHostFile(const std::string& path, size_t size, char fill) {
  std::ofstream f(path, std::ios::binary);
  std::string chunk(64 * 1024, fill);
  for (size_t done = 0; done < size; done += chunk.size()) {
    f.write(chunk.data(), static_cast<std::streamsize>(std::min(chunk.size(), size - done)));
  }
  ASSERT_TRUE(f.good()) << path;
}

// Mounts the image in the kernel, creates directories and files, unmounts,
// requires btrfs check to stay clean and ubtrfs to read what the kernel wrote.
void KernelRoundTrip(const std::string& img, const std::string& mnt) {
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    ASSERT_EQ(mkdir((mnt + "/dir").c_str(), 0755), 0) << strerror(errno);
    ASSERT_EQ(mkdir((mnt + "/dir/sub").c_str(), 0700), 0) << strerror(errno);
    WriteHostFile(mnt + "/dir/small", 100, 's');
    WriteHostFile(mnt + "/dir/sub/big", 3 * kMiB + 123, 'b');
    for (int i = 0; i < 50; ++i) WriteHostFile(mnt + "/f" + std::to_string(i), 1000 * i, 'a' + i % 26);
    ASSERT_EQ(symlink("dir/small", (mnt + "/link").c_str()), 0);
    ASSERT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(BtrfsCheck(img), "") << "after the kernel wrote to it";
  {
    // The CLI refuses a mounted image, even with --force.
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    auto r = RunCommand({kCli, "mkfs", "--force", img});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("mounted"), std::string::npos) << r.err;
    ASSERT_EQ(m.Unmount(), "");
  }
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto big = (*fs)->Lookup("/dir/sub/big");
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  auto st = (*fs)->GetStat(*big);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->size, 3 * kMiB + 123);
  std::vector<uint8_t> buf(st->size);
  auto n = (*fs)->Read(*big, 0, buf);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  ASSERT_EQ(*n, buf.size());
  EXPECT_EQ(std::count(buf.begin(), buf.end(), 'b'), static_cast<long>(buf.size()));
  auto entries = (*fs)->ReadDir((*fs)->Root());
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 52u);
}

// ---- nodesize x checksum ---------------------------------------------------------------------

class MkfsMatrixTest : public ::testing::TestWithParam<std::tuple<uint32_t, uint16_t>> {};

TEST_P(MkfsMatrixTest, CheckCleanReadableWritableMountable) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  const auto [nodesize, csum] = GetParam();
  TempDir dir("ubtrfs-mkfs");
  const std::string img = dir.Sub("img");
  txn::MkfsOptions opts;
  opts.nodesize = nodesize;
  opts.csum_type = csum;
  opts.label = "mkfs-" + CsumTypeName(csum);
  txn::MkfsSummary sum;
  Status st = MakeImage(img, 512 * kMiB, opts, &sum);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(sum.total_bytes, 512 * kMiB);
  EXPECT_EQ(sum.superblock_copies, 2);  // 64 KiB and 64 MiB
  // Ten trees of one leaf each, but the root tree's eight ROOT_ITEMs take
  // two leaves and a node with 4 KiB blocks.
  EXPECT_EQ(sum.tree_blocks, nodesize == 4096 ? 12 : 10);
  ASSERT_EQ(BtrfsCheck(img), "");
  ASSERT_EQ(BtrfsCheck(img, "lowmem"), "");
  ExpectEmptyAndSane(img, opts, 512 * kMiB);
  CommitXattrs(img, 40);
  KernelRoundTrip(img, dir.Sub("mnt"));
}

INSTANTIATE_TEST_SUITE_P(
    NodeSizesAndChecksums, MkfsMatrixTest,
    ::testing::Combine(::testing::Values(4096u, 16384u, 65536u),
                       ::testing::Values(uint16_t{0}, uint16_t{1}, uint16_t{2}, uint16_t{3})),
    [](const auto& info) {
      return "node" + std::to_string(std::get<0>(info.param)) + "_" + CsumTypeName(std::get<1>(info.param));
    });

// ---- device sizes: the minimum, small devices, the 64 MiB mirror inside the
// metadata chunk, and many data chunks with the 256 GiB mirror inside one ----

struct SizeCase {
  const char* name;
  uint64_t size;
  uint32_t nodesize;
  uint64_t data_bytes;
  int copies;
};

void PrintTo(const SizeCase& c, std::ostream* os) { *os << c.name; }

class MkfsSizeTest : public ::testing::TestWithParam<SizeCase> {};

TEST_P(MkfsSizeTest, CheckCleanReadableWritableMountable) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  const SizeCase& c = GetParam();
  TempDir dir("ubtrfs-mkfs");
  const std::string img = dir.Sub("img");
  txn::MkfsOptions opts;
  opts.nodesize = c.nodesize;
  opts.data_bytes = c.data_bytes;
  txn::MkfsSummary sum;
  Status st = MakeImage(img, c.size, opts, &sum);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(sum.superblock_copies, c.copies);
  ASSERT_EQ(BtrfsCheck(img), "");
  if (c.size >= (100ull << 30)) {
    // Hundreds of chunks: the chunk, dev, block group and free space trees
    // are taller than one leaf.
    EXPECT_GT(sum.chunks.size(), 250u);
    auto dev = io::OpenFileDevice(img);
    ASSERT_TRUE(dev.ok());
    auto vol = txn::Volume::Open(std::move(*dev), {});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    EXPECT_GE((*vol)->super().chunk_root_level, 1);
    for (uint64_t id : {kBlockGroupTreeObjectid, kDevTreeObjectid, kFreeSpaceTreeObjectid}) {
      auto r = (*vol)->FindRoot(id);
      ASSERT_TRUE(r.ok());
      EXPECT_GE(r->ref.level, 1) << id;
    }
  }
  ExpectEmptyAndSane(img, opts, c.size);
  CommitXattrs(img, 300);
  KernelRoundTrip(img, dir.Sub("mnt"));
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, MkfsSizeTest,
    ::testing::Values(SizeCase{"min_node4k", txn::MkfsMinBytes(4096), 4096, 0, 1},
                      SizeCase{"min_node32k", txn::MkfsMinBytes(32768), 32768, 0, 2},
                      SizeCase{"min_node64k", txn::MkfsMinBytes(65536), 65536, 0, 2},
                      SizeCase{"min_node64k_alldata", txn::MkfsMinBytes(65536), 65536, txn::kMkfsAllSpace, 2},
                      SizeCase{"min_alldata", 64 * kMiB, 16384, txn::kMkfsAllSpace, 1},
                      SizeCase{"s100m", 100 * kMiB, 16384, 0, 2},
                      SizeCase{"s300m", 300 * kMiB, 16384, 0, 2},
                      SizeCase{"s1g_alldata", 1024 * kMiB, 16384, txn::kMkfsAllSpace, 2},
                      SizeCase{"s3g_node4k", 3072 * kMiB, 4096, 0, 2},
                      // 300 data chunks of 1 GiB: every tree but the fs trees has
                      // several leaves and a node with 4 KiB blocks.
                      SizeCase{"s300g_alldata_node4k", 300ull << 30, 4096, txn::kMkfsAllSpace, 3}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- the same kinds of items and superblock settings as mkfs.btrfs --------------------------

// (tree, key type, objectid when it names something) of every item of every
// tree, and the superblock fields that do not depend on placement.
struct Structure {
  std::set<std::tuple<uint64_t, uint8_t, uint64_t>> items;
  std::map<std::string, uint64_t> super;
};

Structure Describe(const std::string& img) {
  Structure out;
  auto dev = io::OpenFileDevice(img);
  EXPECT_TRUE(dev.ok());
  if (!dev.ok()) return out;
  auto vol = txn::Volume::Open(std::move(*dev), {});
  EXPECT_TRUE(vol.ok()) << vol.status().ToString();
  if (!vol.ok()) return out;
  txn::Volume& v = **vol;
  std::vector<std::pair<uint64_t, tree::RootPtr>> trees = {{kRootTreeObjectid, v.root_tree()},
                                                           {kChunkTreeObjectid, v.chunk_tree()}};
  std::vector<std::string> problems;
  auto walk = [&](uint64_t id, const tree::RootPtr& root) {
    tree::Cursor c(v.reader(), root);
    Status st = c.SeekFirst();
    for (; st.ok() && c.Valid(); st = c.Next()) {
      const Key k = c.key();
      const bool named = k.objectid < kFirstFreeObjectid || k.objectid >= kLastFreeObjectid;
      out.items.insert({id, k.type, named && k.type != kDevExtentKey && k.type != kUuidKeySubvol ? k.objectid : 0});
      if (id == kRootTreeObjectid && k.type == kRootItemKey) {
        auto r = v.FindRoot(k.objectid);
        EXPECT_TRUE(r.ok());
        if (r.ok()) trees.push_back({k.objectid, r->ref});
      }
    }
    EXPECT_TRUE(st.ok()) << st.ToString();
  };
  for (size_t i = 0; i < trees.size(); ++i) walk(trees[i].first, trees[i].second);
  const SuperBlock& sb = v.super();
  out.super = {{"flags", sb.flags.get()},
               {"incompat", sb.incompat_flags.get()},
               {"compat_ro", sb.compat_ro_flags.get()},
               {"compat", sb.compat_flags.get()},
               {"root_dir", sb.root_dir_objectid.get()},
               {"num_devices", sb.num_devices.get()},
               {"sys_array_size", sb.sys_chunk_array_size.get()},
               {"stripesize", sb.stripesize.get()},
               {"leafsize", sb.unused_leafsize.get()},
               {"cache_generation", sb.cache_generation.get()},
               {"log_root", sb.log_root.get()},
               {"root_level", sb.root_level},
               {"chunk_root_level", sb.chunk_root_level},
               {"dev_io_align", sb.dev_item.io_align.get()},
               {"dev_type", sb.dev_item.type.get()},
               {"total_bytes", sb.total_bytes.get()}};
  return out;
}

TEST(MkfsTest, SameItemKindsAndSuperblockAsMkfsBtrfs) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-mkfs");
  const std::string ours = dir.Sub("ours"), theirs = dir.Sub("theirs");
  ASSERT_EQ(ubtrfs_test::RunMkfs(theirs, "", 16384, "crc32c", 512 * kMiB), "");
  // Debian's mkfs.btrfs (6.2) cannot make the block group tree.
  txn::MkfsOptions without_bgt;
  without_bgt.block_group_tree = false;
  ASSERT_TRUE(MakeImage(ours, 512 * kMiB, without_bgt).ok());
  const Structure a = Describe(ours), b = Describe(theirs);
  EXPECT_EQ(a.super, b.super);
  // One deliberate difference: mkfs.btrfs leaves uuid_tree_generation 0, so
  // the kernel's first mount rescans and commits; ours says the UUID tree is
  // current (UuidTree.* below).
  auto sa = txn::ReadSuperblock(**io::OpenFileDevice(ours));
  ASSERT_TRUE(sa.ok());
  EXPECT_EQ(sa->sb.uuid_tree_generation.get(), sa->sb.generation.get());
  for (const auto& i : b.items) {
    EXPECT_TRUE(a.items.count(i)) << "mkfs.btrfs has, ubtrfs lacks: tree " << std::get<0>(i) << " "
                                  << KeyTypeName(std::get<1>(i)) << " objectid " << std::get<2>(i);
  }
  for (const auto& i : a.items) {
    EXPECT_TRUE(b.items.count(i)) << "ubtrfs has, mkfs.btrfs lacks: tree " << std::get<0>(i) << " "
                                  << KeyTypeName(std::get<1>(i)) << " objectid " << std::get<2>(i);
  }
}

// ---- library behaviour ------------------------------------------------------------------------

std::unique_ptr<io::BlockDevice> MemDevice(uint64_t size) {
  return io::NewMemoryDevice("mem", std::vector<uint8_t>(size, 0xa5));
}

TEST(MkfsTest, LayoutOfTheDefaultImage) {
  auto dev = MemDevice(256 * kMiB);
  txn::MkfsSummary sum;
  ASSERT_TRUE(txn::MakeFilesystem(dev.get(), {}, &sum).ok());
  ASSERT_EQ(sum.chunks.size(), 3u);
  EXPECT_EQ(sum.chunks[0].type, kBlockGroupSystem | kBlockGroupDup);
  EXPECT_EQ(sum.chunks[0].length, 8 * kMiB);
  EXPECT_EQ(sum.chunks[0].physical, (std::vector<uint64_t>{1 * kMiB, 9 * kMiB}));
  EXPECT_EQ(sum.chunks[1].type, kBlockGroupMetadata | kBlockGroupDup);
  EXPECT_EQ(sum.chunks[1].length, 32 * kMiB);
  EXPECT_EQ(sum.chunks[2].type, kBlockGroupData);
  EXPECT_EQ(sum.chunks[2].length, 64 * kMiB);
  EXPECT_EQ(sum.bytes_used, 10u * 16384);
  // The first MiB was wiped (old signatures), apart from the superblock.
  std::vector<uint8_t> head(kMiB);
  ASSERT_TRUE(dev->ReadAt(0, head).ok());
  EXPECT_EQ(std::count(head.begin(), head.begin() + kSuperInfoOffset, 0), static_cast<long>(kSuperInfoOffset));
  auto has = txn::HasBtrfsSignature(dev.get());
  ASSERT_TRUE(has.ok());
  EXPECT_TRUE(*has);
  // Volume opens it; both superblock copies validate.
  std::vector<uint8_t> sb(kSuperInfoSize);
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(dev->ReadAt(SuperblockOffset(m), sb).ok());
    EXPECT_TRUE(ValidateSuperblock(sb, SuperblockOffset(m)).ok()) << m;
  }
  auto vol = txn::Volume::Open(std::move(dev), {});
  ASSERT_TRUE(vol.ok()) << vol.status().ToString();
  EXPECT_EQ((*vol)->super().incompat_flags.get(),
            kIncompatMixedBackref | kIncompatExtendedIref | kIncompatSkinnyMetadata | kIncompatNoHoles);
  EXPECT_EQ((*vol)->super().compat_ro_flags.get(),
            kCompatRoFreeSpaceTree | kCompatRoFreeSpaceTreeValid | kCompatRoBlockGroupTree);
  for (uint64_t id : {kExtentTreeObjectid, kDevTreeObjectid, kFsTreeObjectid, kCsumTreeObjectid, kUuidTreeObjectid,
                      kFreeSpaceTreeObjectid, kDataRelocTreeObjectid, kBlockGroupTreeObjectid}) {
    EXPECT_TRUE((*vol)->FindRoot(id).ok()) << id;
  }
}

TEST(MkfsTest, SameOptionsSameBytes) {
  txn::MkfsOptions opts;
  opts.fsid = txn::ParseUuid("01234567-89ab-cdef-0123-456789abcdef");
  opts.dev_uuid = txn::ParseUuid("11111111-2222-4333-8444-555555555555");
  opts.chunk_tree_uuid = txn::ParseUuid("21111111-2222-4333-8444-555555555555");
  opts.fs_tree_uuid = txn::ParseUuid("31111111-2222-4333-8444-555555555555");
  ASSERT_TRUE(opts.fsid && opts.dev_uuid && opts.chunk_tree_uuid && opts.fs_tree_uuid);
  opts.time_sec = 1700000000;
  opts.label = "same";
  auto a = MemDevice(64 * kMiB), b = MemDevice(64 * kMiB);
  ASSERT_TRUE(txn::MakeFilesystem(a.get(), opts).ok());
  ASSERT_TRUE(txn::MakeFilesystem(b.get(), opts).ok());
  std::vector<uint8_t> x(64 * kMiB), y(64 * kMiB);
  ASSERT_TRUE(a->ReadAt(0, x).ok());
  ASSERT_TRUE(b->ReadAt(0, y).ok());
  EXPECT_TRUE(x == y);
  std::vector<uint8_t> sb(kSuperInfoSize);
  ASSERT_TRUE(a->ReadAt(kSuperInfoOffset, sb).ok());
  EXPECT_EQ(UuidToString(sb.data() + offsetof(SuperBlock, fsid)), "01234567-89ab-cdef-0123-456789abcdef");
  EXPECT_FALSE(txn::ParseUuid("01234567-89ab-cdef-0123-456789abcdeg"));
  EXPECT_FALSE(txn::ParseUuid("0123456789ab-cdef-0123-456789abcdef0"));
}

TEST(MkfsTest, RandomUuidsDiffer) {
  auto a = MemDevice(64 * kMiB), b = MemDevice(64 * kMiB);
  txn::MkfsSummary sa, sb;
  ASSERT_TRUE(txn::MakeFilesystem(a.get(), {}, &sa).ok());
  ASSERT_TRUE(txn::MakeFilesystem(b.get(), {}, &sb).ok());
  EXPECT_NE(sa.fsid, sb.fsid);
  EXPECT_NE(sa.dev_uuid, sb.dev_uuid);
  EXPECT_NE(sa.fsid, sa.dev_uuid);
  EXPECT_EQ(sa.fsid[6] >> 4, 4);  // version 4
}

TEST(MkfsTest, RefusesBadOptionsAndSmallDevices) {
  auto expect_invalid = [](uint64_t size, const txn::MkfsOptions& o, const std::string& needle) {
    auto dev = MemDevice(size);
    Status st = txn::MakeFilesystem(dev.get(), o);
    EXPECT_EQ(st.code(), EINVAL) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    // Nothing was written.
    std::vector<uint8_t> sb(4096);
    ASSERT_TRUE(dev->ReadAt(kSuperInfoOffset, sb).ok());
    EXPECT_EQ(sb[100], 0xa5);
  };
  txn::MkfsOptions o;
  EXPECT_EQ(txn::MkfsMinBytes(4096), 64 * kMiB);
  EXPECT_EQ(txn::MkfsMinBytes(16384), 64 * kMiB);
  expect_invalid(64 * kMiB - 4096, o, "too small");
  o.nodesize = 65536;
  expect_invalid(txn::MkfsMinBytes(65536) - 4096, o, "too small");
  o = {};
  expect_invalid(1 * kMiB, o, "too small");
  for (uint32_t n : {2048u, 12288u, 131072u, 0u}) {
    o = {};
    o.nodesize = n;
    expect_invalid(kMiB, o, "nodesize");
  }
  o = {};
  o.sectorsize = 8192;
  expect_invalid(kMiB, o, "sectorsize");
  o = {};
  o.csum_type = 7;
  expect_invalid(kMiB, o, "checksum");
  o = {};
  o.label = std::string(256, 'x');
  expect_invalid(kMiB, o, "label");
  o = {};
  o.total_bytes = 256 * kMiB;
  expect_invalid(kMiB, o, "larger than");
  o = {};
  o.data_bytes = 200 * kMiB;
  expect_invalid(128 * kMiB, o, "do not fit");
  o = {};
  o.metadata_chunk_bytes = 100 * kMiB;
  expect_invalid(128 * kMiB, o, "does not fit");
  // The largest label is fine.
  o = {};
  o.label = std::string(255, 'x');
  auto dev = MemDevice(128 * kMiB);
  EXPECT_TRUE(txn::MakeFilesystem(dev.get(), o).ok());
}

TEST(MkfsTest, TotalBytesSmallerThanTheDevice) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs");
  const std::string img = dir.Sub("img");
  txn::MkfsOptions opts;
  opts.total_bytes = 100 * kMiB;
  ASSERT_TRUE(MakeImage(img, 200 * kMiB, opts).ok());
  ASSERT_EQ(BtrfsCheck(img), "");
  ExpectEmptyAndSane(img, opts, 100 * kMiB);
}

// The library's public write API on a fresh image (what `mkfs --rootdir`
// will build on).
TEST(MkfsTest, WriteApiOnAFreshImage) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs");
  const std::string img = dir.Sub("img");
  ASSERT_TRUE(MakeImage(img, 256 * kMiB, {}).ok());
  {
    OpenOptions oo;
    oo.writable = true;
    auto fs = Filesystem::Open(img, oo);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    NewInode dattr;
    dattr.mode = 0755;
    auto d = (*fs)->Mkdir((*fs)->Root(), "dir", dattr);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    NewInode fattr;
    fattr.mode = 0644;
    auto f = (*fs)->Create(*d, "file", fattr);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    std::vector<uint8_t> data(300000, 'q');
    auto n = (*fs)->Write(*f, 0, data);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  auto f = (*fs)->Lookup("/dir/file");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto st = (*fs)->GetStat(*f);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->size, 300000u);
}

// ---- the CLI ---------------------------------------------------------------------------------

CommandResult Cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kCli};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

std::string FsidOf(const std::string& img) {
  auto fs = Filesystem::Open(img);
  return fs.ok() ? (*fs)->Info().fsid : "";
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

TEST(MkfsCliTest, CreatesRefusesAndForces) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs-cli");
  const std::string img = dir.Sub("new.img");
  auto r = Cli({"mkfs", img, "--size", "256M", "--label", "cli-label", "--csum", "xxhash", "--nodesize", "32k"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("xxhash64"), std::string::npos) << r.out;
  EXPECT_EQ(FileSize(img), 256 * kMiB);
  ASSERT_EQ(BtrfsCheck(img), "");
  {
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_EQ((*fs)->Info().label, "cli-label");
    EXPECT_EQ((*fs)->Info().csum_type, "xxhash64");
    EXPECT_EQ((*fs)->Info().nodesize, 32768u);
  }
  const std::string fsid = FsidOf(img);
  ASSERT_FALSE(fsid.empty());

  // An existing btrfs is not overwritten without --force.
  r = Cli({"mkfs", img});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(FsidOf(img), fsid);
  r = Cli({"mkfs", img, "--size", "300M"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(FileSize(img), 256 * kMiB);  // not extended either

  // --force replaces it (new fsid); --size extends the file.
  r = Cli({"mkfs", "-q", "--force", img, "--size", "1G", "--uuid", "01234567-89ab-4def-8123-456789abcdef"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(FileSize(img), 1024 * kMiB);
  EXPECT_EQ(FsidOf(img), "01234567-89ab-4def-8123-456789abcdef");
  ASSERT_EQ(BtrfsCheck(img), "");

  // A file that is not btrfs (zeros) needs no --force; without --size its
  // size is kept.
  const std::string plain = dir.Sub("plain.img");
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(plain, 80 * kMiB, &err)) << err;
  r = Cli({"mkfs", "-q", plain, "--sectorsize", "4096", "--csum", "blake2"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(FileSize(plain), 80 * kMiB);
  ASSERT_EQ(BtrfsCheck(plain), "");

  // --size below the file size: the filesystem covers --size bytes.
  const std::string part = dir.Sub("part.img");
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(part, 200 * kMiB, &err)) << err;
  r = Cli({"mkfs", "-q", part, "--size", "100M"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(FileSize(part), 200 * kMiB);
  ASSERT_EQ(BtrfsCheck(part), "");
  auto fs = Filesystem::Open(part);
  ASSERT_TRUE(fs.ok());
  EXPECT_EQ((*fs)->Info().total_bytes, 100 * kMiB);
}

TEST(MkfsCliTest, ClearErrors) {
  TempDir dir("ubtrfs-mkfs-cli");
  const std::string img = dir.Sub("x.img");
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"mkfs", img, "--size", "10M"}, "too small"},
      {{"mkfs", img, "--size", "63M"}, "too small"},
      {{"mkfs", img, "--size", "100M", "--nodesize", "64k"}, "too small"},
      {{"mkfs", img, "--size", "lots"}, "--size"},
      {{"mkfs", img}, "does not exist"},
      {{"mkfs", img, "--size", "256M", "--nodesize", "12345"}, "nodesize"},
      {{"mkfs", img, "--size", "256M", "--nodesize", "128k"}, "nodesize"},
      {{"mkfs", img, "--size", "256M", "--nodesize", "big"}, "nodesize"},
      {{"mkfs", img, "--size", "256M", "--csum", "md5"}, "csum"},
      {{"mkfs", img, "--size", "256M", "--sectorsize", "8192"}, "sectorsize"},
      {{"mkfs", img, "--size", "256M", "--label", std::string(300, 'L')}, "label"},
      {{"mkfs", img, "--size", "256M", "--uuid", "nope"}, "uuid"},
  };
  for (const auto& c : cases) {
    auto r = Cli(c.args);
    EXPECT_NE(r.exit_code, 0) << ubtrfs_test::ShellJoin(c.args);
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << ubtrfs_test::ShellJoin(c.args) << ": " << r.err;
    // A refused mkfs leaves no file behind.
    EXPECT_NE(access(img.c_str(), F_OK), 0) << ubtrfs_test::ShellJoin(c.args);
  }
  // An existing file that is too small, without --size.
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(img, 10 * kMiB, &err)) << err;
  auto r = Cli({"mkfs", img});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("too small"), std::string::npos) << r.err;
  EXPECT_EQ(FileSize(img), 10 * kMiB);
}

// --rootdir: a generated host tree (every kind of inode, xattrs, hard
// links, odd names) plus more data than the first data chunk holds.
// A file of `mib` MiB, each MiB's pattern from `mult`; whether it was written.
bool WritePatternFile(const std::string& path, int mib, int mult) {
  std::ofstream f(path, std::ios::binary);
  std::string block(1 << 20, '\0');
  for (int i = 0; i < mib; ++i) {
    for (size_t j = 0; j < block.size(); j += 8) block[j] = static_cast<char>(i * mult + j / 8);
    f.write(block.data(), static_cast<std::streamsize>(block.size()));
  }
  return f.good();
}

TEST(MkfsCliTest, RootdirImportsTheTree) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs-rootdir");
  const std::string src = dir.Sub("src"), img = dir.Sub("img.img");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ubtrfs_test::GenerateTree(src, 11, ubtrfs_test::ScaledTreeOptions(500));
  ASSERT_TRUE(WritePatternFile(src + "/large", 100, 31));
  auto r = Cli({"mkfs", img, "--size", "768M", "--rootdir", src, "--nodesize", "4096"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Rootdir:"), std::string::npos) << r.out;
  ASSERT_EQ(BtrfsCheck(img), "");
  {
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto mism = ubtrfs_test::CompareTreeToImage(src, **fs, {});
    EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  }
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string mnt = dir.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  auto mism = ubtrfs_test::CompareHostTrees(src, mnt, {});
  EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  ASSERT_EQ(m.Unmount(), "");

  // A --rootdir that is neither a directory nor a tar archive is refused,
  // and no image is left behind.
  r = Cli({"mkfs", dir.Sub("other.img"), "--size", "256M", "--rootdir", src + "/large"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("not a tar archive"), std::string::npos) << r.err;
  EXPECT_NE(access(dir.Sub("other.img").c_str(), F_OK), 0);
}

// mkfs -M: a SYSTEM and one DATA|METADATA chunk, 4 KiB nodes, the
// MIXED_GROUPS flag; a tree imported into it and more written after, with
// btrfs check and the kernel as judges; and the options that cannot go
// with it refused by name.
TEST(MkfsCliTest, MixedBlockGroups) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs-mixed");
  const std::string src = dir.Sub("src"), img = dir.Sub("img.img");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ubtrfs_test::GenerateTree(src, 12, ubtrfs_test::ScaledTreeOptions(300));
  auto r = Cli({"mkfs", img, "-M", "--size", "200M", "--rootdir", src});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Data+Metadata:"), std::string::npos) << r.out;
  ASSERT_EQ(BtrfsCheck(img), "");
  {
    auto dev = io::OpenFileDevice(img);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    auto vol = txn::Volume::Open(std::move(*dev), txn::VolumeOptions{});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    EXPECT_TRUE((*vol)->super().incompat_flags.get() & kIncompatMixedGroups);
    EXPECT_EQ((*vol)->super().nodesize.get(), 4096u);
    std::map<uint64_t, int> types;
    for (const auto& [logical, c] : (*vol)->chunks().chunks()) ++types[c.type];
    EXPECT_EQ(types, (std::map<uint64_t, int>{{kBlockGroupSystem, 1}, {kBlockGroupData | kBlockGroupMetadata, 1}}));
  }
  // More than the first chunk holds, so new chunks are made (mixed ones).
  ASSERT_TRUE(WritePatternFile(src + "/mixed-big", 120, 29));
  r = Cli({"cp", src + "/mixed-big", img + ":/mixed-big"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(BtrfsCheck(img), "");
  // The top directory changed after the import on both sides, at other times.
  ubtrfs_test::CompareOptions co;
  co.skip_times = [](const std::string& rel) { return rel.empty() || rel == "."; };
  {
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto mism = ubtrfs_test::CompareTreeToImage(src, **fs, co);
    EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  }
  {
    auto dev = io::OpenFileDevice(img);
    ASSERT_TRUE(dev.ok());
    auto vol = txn::Volume::Open(std::move(*dev), txn::VolumeOptions{});
    ASSERT_TRUE(vol.ok());
    int mixed = 0;
    for (const auto& [logical, c] : (*vol)->chunks().chunks()) {
      if (c.type & kBlockGroupSystem) continue;
      EXPECT_EQ(c.type & (kBlockGroupData | kBlockGroupMetadata), kBlockGroupData | kBlockGroupMetadata);
      ++mixed;
    }
    EXPECT_GT(mixed, 1);
  }

  EXPECT_NE(Cli({"mkfs", dir.Sub("n.img"), "-M", "-n", "16384", "--size", "200M"}).exit_code, 0);
  r = Cli({"mkfs", dir.Sub("p.img"), "-M", "-d", "dup", "-m", "single", "--size", "200M"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("must be the same"), std::string::npos) << r.err;
  // --shrink: the mixed chunks cut to what they hold, smaller than the
  // separate-chunk layout's image of the same tree.
  const std::string shrunk = dir.Sub("s.img"), plain_shrunk = dir.Sub("ps.img");
  r = Cli({"mkfs", shrunk, "-M", "--shrink", "--rootdir", src});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = Cli({"mkfs", plain_shrunk, "--shrink", "--rootdir", src});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_LT(ubtrfs_test::HostFileSize(shrunk), ubtrfs_test::HostFileSize(plain_shrunk));
  EXPECT_EQ(BtrfsCheck(shrunk), "");

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string mnt = dir.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  auto mism = ubtrfs_test::CompareHostTrees(src, mnt, co);
  EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  ASSERT_EQ(m.Unmount(), "");
  // The shrunk one mounts writable and lets the kernel delete and commit.
  ASSERT_EQ(m.Mount(shrunk, mnt), "");
  mism = ubtrfs_test::CompareHostTrees(src, mnt, co);
  EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  ASSERT_EQ(ubtrfs_test::MustRun({"rm", mnt + "/mixed-big"}), "");
  ASSERT_EQ(m.Unmount(), "");
  EXPECT_EQ(BtrfsCheck(shrunk), "");
}

}  // namespace
