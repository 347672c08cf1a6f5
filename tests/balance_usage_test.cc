// Block groups emptied by moving their extents (RelocateGroups,
// txn/extent_relocation.h; `ubtrfs balance -dusage=N -musage=N`). Each test
// copies the whole filesystem out before (`ubtrfs cp IMAGE:/`, snapshots
// included) and compares the image with that copy after: a relocation
// changes nothing a user sees. `ubtrfs check`, `btrfs check` (qgroups included)
// and, where loop mounts work, the kernel judge the images; the kernel's
// own balance and scrub run over the result.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "format/ondisk.h"
#include "io/block_device.h"
#include "support/array_mount.h"
#include "support/chunk_layout.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/open_txn.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "tree/cursor.h"
#include "alloc/space_manager.h"
#include "txn/extent_refs.h"
#include "txn/transaction.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/resize.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using namespace ubtrfs::format;
using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::ExpectConsistent;
using Layout = ubtrfs_test::ChunkLayout;
using ubtrfs_test::ReadLayout;
using ubtrfs_test::RunCommand;
using ubtrfs_test::RunUbtrfs;
using ubtrfs_test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

std::string UbtrfsCheck(const std::string& img) {
  auto r = RunUbtrfs({"check", img});
  return r.ok() ? "" : r.Describe();
}

// The whole filesystem copied out to `out` (an empty directory is made).
void CopyOut(const std::string& img, const std::string& out) {
  auto r = RunUbtrfs({"cp", img + ":/", out});
  ASSERT_TRUE(r.ok()) << r.Describe();
}

// The image, read through the library, equals the host tree `before` (a
// copy out of it).
void ExpectImageEquals(const std::string& before, const std::string& img) {
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  ubtrfs_test::CompareOptions o;
  o.compare_top_attrs = false;
  ubtrfs_test::CompareStats stats;
  const auto diff = ubtrfs_test::CompareTreeToImage(before, **fs, o, "/", &stats);
  EXPECT_TRUE(diff.empty()) << ubtrfs_test::FormatMismatches(diff);
  EXPECT_GT(stats.files_read, 0u);
}

// After a balance: the filesystem equals its copy out in dir/before, the
// chunk layout is consistent, and both checkers are clean unless the image
// was damaged on purpose.
void ExpectUnchanged(const std::string& img, const TempDir& dir, bool clean = true) {
  ExpectImageEquals(dir.Sub("before"), img);
  ExpectConsistent(ReadLayout(img), "balanced");
  if (clean) {
    EXPECT_EQ(UbtrfsCheck(img), "");
    EXPECT_EQ(BtrfsCheck(img), "");
  }
}

// Whether loop mounts work here; if not, the log says the test's kernel
// part is skipped, and why.
bool KernelPartRuns() {
  std::string why;
  if (ubtrfs_test::LoopMountsAvailable(&why)) return true;
  GTEST_LOG_(INFO) << "kernel part skipped: loop mounts unavailable: " << why;
  return false;
}

// Tree blocks (or data extents) the extent tree has.
uint64_t Extents(const std::string& img, bool tree) {
  auto dev = io::OpenFileDevice(img);
  EXPECT_TRUE(dev.ok());
  if (!dev.ok()) return 0;
  auto vol = txn::Volume::Open(std::move(*dev), txn::VolumeOptions{});
  EXPECT_TRUE(vol.ok()) << vol.status().ToString();
  if (!vol.ok()) return 0;
  auto ext = (*vol)->FindRoot(kExtentTreeObjectid);
  EXPECT_TRUE(ext.ok());
  if (!ext.ok()) return 0;
  tree::Cursor c((*vol)->reader(), ext->ref);
  EXPECT_TRUE(c.SeekFirst().ok());
  uint64_t n = 0;
  while (c.Valid()) {
    if (c.key().type == kMetadataItemKey) n += tree;
    if (c.key().type == kExtentItemKey) {
      n += tree == bool(reinterpret_cast<const ExtentItem*>(c.data().data())->flags.get() & kExtentFlagTreeBlock);
    }
    if (!c.Next().ok()) break;
  }
  return n;
}
uint64_t TreeBlocks(const std::string& img) { return Extents(img, true); }
uint64_t DataExtents(const std::string& img) { return Extents(img, false); }

// The kernel writes into the image, moves everything again with its own
// balance (which walks every back reference: a shared block it takes for
// unshared makes it drop a reference that is not there) and scrubs it.
void ExpectKernelBalancesAndScrubs(const std::string& img, const std::string& mnt) {
  mkdir(mnt.c_str(), 0755);
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    auto k = RunCommand({"bash", "-c",
                         "set -e; head -c 8000000 /dev/urandom > '" + mnt + "/kernel'; btrfs balance start -dusage=100 -musage=100 '" +
                             mnt + "' >/dev/null; btrfs scrub start -B '" + mnt + "' >/dev/null"});
    EXPECT_TRUE(k.ok()) << "the kernel's balance and scrub over the result: " << k.Describe();
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(BtrfsCheck(img), "");
}

RelocateOptions Usage(const std::string& data, const std::string& metadata) {
  RelocateOptions o;
  if (!data.empty()) {
    EXPECT_TRUE(ParseUsageFilter("usage=" + data, &o.data).ok());
  }
  if (!metadata.empty()) {
    EXPECT_TRUE(ParseUsageFilter("usage=" + metadata, &o.metadata).ok());
  }
  return o;
}

std::string Notes(const RelocateResult& r) {
  std::string s;
  for (const auto& n : r.notes) s += "\n  " + n;
  return s;
}

// RelocateGroups; a failure carries its status and the notes.
::testing::AssertionResult Relocated(const std::vector<std::string>& devices, const RelocateOptions& o,
                                     RelocateResult* r) {
  Status st = RelocateGroups(devices, o, r);
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << st.ToString() << Notes(*r);
}

std::string MakeImage(const TempDir& dir, const std::string& size) {
  const std::string img = dir.Sub("img");
  auto r = RunUbtrfs({"mkfs", "-q", "--size", size, img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  return img;
}

// A 1 GiB image with 60 files of up to 9 MiB copied in over several data
// groups, two thirds of them removed again: groups left partly used.
std::string PartlyUsedImage(const TempDir& dir) {
  const std::string src = dir.Sub("src");
  mkdir(src.c_str(), 0755);
  for (int i = 1; i <= 60; ++i) {
    ubtrfs_test::WriteRandomFile(src + "/f" + std::to_string(i), (i * 97000ull) % (9 * kMiB) + 5000, i);
  }
  const std::string img = MakeImage(dir, "1G");
  EXPECT_TRUE(RunUbtrfs({"cp", src, img + ":/src"}).ok());
  std::vector<std::string> rm{"rm"};
  for (int i = 1; i <= 60; ++i) {
    if (i % 3 != 0) rm.push_back(img + ":/src/f" + std::to_string(i));
  }
  EXPECT_TRUE(RunUbtrfs(rm).ok());
  return img;
}

// Files over several data groups, two thirds deleted: the groups left
// partly used are emptied into fewer, and their device space comes back.
TEST(BalanceUsage, PartlyUsedDataGroupsAreEmptied) {
  TempDir dir("ubtrfs-balance");
  const std::string img = PartlyUsedImage(dir);
  if (HasFatalFailure()) return;
  const Layout before = ReadLayout(img);
  ASSERT_GE(before.Count(kBlockGroupData), 3) << before.Describe();
  CopyOut(img, dir.Sub("before"));
  const uint64_t extents = DataExtents(img);

  RelocateResult r;
  ASSERT_TRUE(Relocated({img}, Usage("50", ""), &r));
  EXPECT_EQ(r.groups_emptied, r.groups_selected) << Notes(r);
  EXPECT_GE(r.groups_emptied, 3u);
  // Each moved once: the groups still to be emptied take none of them.
  EXPECT_EQ(r.data_extents, extents);
  EXPECT_EQ(r.tree_blocks, 0u);
  const Layout after = ReadLayout(img);
  ExpectConsistent(after, "balanced");
  EXPECT_LT(after.Count(kBlockGroupData), before.Count(kBlockGroupData)) << after.Describe();
  EXPECT_LT(r.chunk_bytes_after, r.chunk_bytes_before);
  EXPECT_EQ(after.dev_bytes_used, r.chunk_bytes_after + 2 * 8 * kMiB) << "the system chunk (DUP) aside";
  ExpectUnchanged(img, dir);
  if (!KernelPartRuns()) return;
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    const auto diff = ubtrfs_test::CompareHostTrees(dir.Sub("before") + "/src", mnt + "/src");
    EXPECT_TRUE(diff.empty()) << ubtrfs_test::FormatMismatches(diff);
    ubtrfs_test::WriteRandomFile(mnt + "/kernel", 50 * kMiB, 99);
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  EXPECT_EQ(UbtrfsCheck(img), "");
}

// Extents referenced in ways that test how far the planner looks for them:
// a range cloned to a file offset below the range's place in its extent
// (the reference's offset, file offset minus extent offset, wraps below
// zero), a compressed file cloned the same way, and a file whose scattered
// overwrites split one extent into hundreds of items among hundreds of small
// extents. Every one moves; none is left with a note.
TEST(BalanceUsage, ClonedAndSplitExtentsAllMove) {
  TempDir dir("ubtrfs-balance");
  const std::string img = MakeImage(dir, "512M");
  std::mt19937_64 rng(11);
  auto bytes = [&](size_t n) {
    std::string b(n, 0);
    for (auto& c : b) c = static_cast<char>(rng());
    return b;
  };
  for (bool compressed : {false, true}) {
    OpenOptions o{.writable = true};
    if (compressed) o.compress.algorithm = CompressAlgorithm::kZstd;
    auto fs = Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    Filesystem& f = **fs;
    const std::string tag = compressed ? "z" : "p";
    auto a = f.Create(f.Root(), tag + "a", NewInode{.mode = 0644});
    ASSERT_TRUE(a.ok());
    std::string data = bytes(kMiB);
    if (compressed) data = std::string(kMiB, 'x') + data.substr(0, 4096);
    ASSERT_TRUE(f.Write(*a, 0, ubtrfs_test::SpanOf(data)).ok());
    ASSERT_TRUE(f.Commit().ok());
    for (uint64_t at : {0ull, 4096ull, 65536ull}) {
      auto b = f.Create(f.Root(), tag + "b" + std::to_string(at), NewInode{.mode = 0644});
      ASSERT_TRUE(b.ok());
      ASSERT_TRUE(f.Clone(*a, 512 * 1024, *b, at, 256 * 1024).ok());
    }
    ASSERT_TRUE(f.Commit().ok());
  }
  {
    auto fs = Filesystem::Open(img, OpenOptions{.writable = true});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    Filesystem& f = **fs;
    auto s = f.Create(f.Root(), "split", NewInode{.mode = 0644});
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(f.Write(*s, 0, ubtrfs_test::SpanOf(bytes(8 * kMiB))).ok());
    ASSERT_TRUE(f.Commit().ok());
    for (int i = 0; i < 600; ++i) {
      const std::string b = bytes(4096 * (1 + rng() % 3));
      ASSERT_TRUE(f.Write(*s, (rng() % (8 * kMiB / 4096)) * 4096, ubtrfs_test::SpanOf(b)).ok());
      if (i % 7 == 0) {
        ASSERT_TRUE(f.Commit().ok());
      }
    }
    ASSERT_TRUE(f.Commit().ok());
  }
  CopyOut(img, dir.Sub("before"));
  const uint64_t extents = DataExtents(img);
  ASSERT_GT(extents, 300u);
  RelocateResult r;
  ASSERT_TRUE(Relocated({img}, Usage("100", ""), &r));
  EXPECT_EQ(r.groups_emptied, r.groups_selected) << Notes(r);
  EXPECT_TRUE(r.notes.empty()) << Notes(r);
  EXPECT_EQ(r.data_extents, extents);
  ExpectUnchanged(img, dir);
}

// The data groups of an image: start -> bytes used.
std::map<uint64_t, uint64_t> DataGroups(const std::string& img) {
  std::map<uint64_t, uint64_t> out;
  auto o = ubtrfs_test::OpenForWrite(img);
  EXPECT_TRUE(o.ok()) << o.status().ToString();
  if (!o.ok()) return out;
  o->txn->space().ForEachGroup([&](const alloc::BlockGroup& g) {
    if ((g.flags() & kBlockGroupTypeMask) == kBlockGroupData) out[g.start()] = g.used_bytes();
  });
  return out;
}

// btrfs balance's other filters choose the groups: limit (the least used
// first; none unless MIN qualify), vrange, devid and drange.
TEST(BalanceUsage, FiltersChooseTheGroups) {
  TempDir dir("ubtrfs-balance");
  const std::string img = PartlyUsedImage(dir);
  if (HasFatalFailure()) return;
  CopyOut(img, dir.Sub("before"));
  const auto groups = DataGroups(img);
  ASSERT_GE(groups.size(), 3u);
  auto run = [&](const RelocateOptions& o, uint64_t selected) {
    RelocateResult r;
    EXPECT_TRUE(Relocated({img}, o, &r));
    EXPECT_EQ(r.groups_selected, selected);
    EXPECT_EQ(r.groups_emptied, selected) << Notes(r);
  };
  RelocateOptions o;
  ASSERT_TRUE(ParseUsageFilter("usage=100", &o.data).ok());

  // limit=1: the least used group, and only it.
  o.data_groups.on = true;
  o.data_groups.limit_max = 1;
  const uint64_t least = std::min_element(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
                           return a.second < b.second;
                         })->first;
  run(o, 1);
  auto after = DataGroups(img);
  EXPECT_FALSE(after.contains(least));
  for (const auto& [start, used] : groups) {
    if (start != least) {
      EXPECT_TRUE(after.contains(start)) << start;
    }
  }

  // limit=MIN..MAX with fewer than MIN qualifying: none.
  const std::string sum = ubtrfs_test::Sha256(img);
  o.data_groups.limit_min = after.size() + 1;
  o.data_groups.limit_max = UINT64_MAX;
  run(o, 0);
  EXPECT_EQ(ubtrfs_test::Sha256(img), sum);

  // vrange: the group at one logical address.
  o.data_groups = GroupFilter{};
  o.data_groups.on = true;
  o.data_groups.vrange = true;
  const uint64_t last = after.rbegin()->first;
  o.data_groups.vrange_start = last;
  o.data_groups.vrange_end = last + 1;
  run(o, 1);
  const auto after_vrange = DataGroups(img);
  EXPECT_FALSE(after_vrange.contains(last));
  for (const auto& [start, used] : after) {
    if (start != last) {
      EXPECT_TRUE(after_vrange.contains(start)) << start;
    }
  }

  // devid: no device 2 here; drange below 1 MiB, where no stripe lies.
  o.data_groups = GroupFilter{};
  o.data_groups.on = true;
  o.data_groups.devid = 2;
  run(o, 0);
  o.data_groups.devid = 1;
  o.data_groups.drange = true;
  o.data_groups.drange_end = kMiB;
  run(o, 0);
  // Without usage, devid=1 takes every data group.
  o.data = UsageFilter{};
  o.data_groups.drange = false;
  run(o, DataGroups(img).size());
  ExpectUnchanged(img, dir);

  // The filter lists btrfs-progs takes.
  UsageFilter u;
  GroupFilter g;
  std::string convert;
  ASSERT_TRUE(ParseBalanceFilters("usage=20..50,limit=2,devid=3,drange=1G..2G,vrange=..4G", &u, &g, &convert).ok());
  EXPECT_TRUE(u.on && g.on);
  EXPECT_EQ(u.min_percent, 20u);
  EXPECT_EQ(u.max_percent, 50u);
  EXPECT_EQ(g.limit_max, 2u);
  EXPECT_EQ(g.devid, 3u);
  EXPECT_EQ(g.drange_start, 1ull << 30);
  EXPECT_EQ(g.drange_end, 2ull << 30);
  EXPECT_EQ(g.vrange_start, 0u);
  EXPECT_EQ(g.vrange_end, 4ull << 30);
  g = GroupFilter{};
  ASSERT_TRUE(ParseBalanceFilters("convert=raid1,soft", &u, &g, &convert).ok());
  EXPECT_EQ(convert, "raid1");
  EXPECT_FALSE(g.on);
  for (const char* bad : {"drange=0..1", "limit=", "foo=1", "usage=50,,limit=1", "raid1,usage=5", "vrange=5..1",
                          "devid=0", "usage=101"}) {
    UsageFilter bu;
    GroupFilter bg;
    std::string bc;
    EXPECT_FALSE(ParseBalanceFilters(bad, &bu, &bg, &bc).ok()) << bad;
  }
  auto cli = RunUbtrfs({"balance", "-dusage=100,limit=1", img});
  EXPECT_TRUE(cli.ok()) << cli.Describe();
  EXPECT_NE(cli.out.find("Relocated 1 of 1 block groups"), std::string::npos) << cli.out;
  cli = RunUbtrfs({"balance", "-ddrange=0..1G", img});
  EXPECT_EQ(cli.exit_code, 2) << cli.Describe();
}

// Snapshots that share most of their blocks and data: every data and
// metadata group is emptied, and the moved blocks are still shared (copy
// on write per tree would have copied them once per snapshot).
TEST(BalanceUsage, SnapshotsKeepSharingWhatTheyShare) {
  TempDir dir("ubtrfs-balance");
  const std::string src = dir.Sub("src");
  mkdir(src.c_str(), 0755);
  for (int d = 0; d < 8; ++d) {
    const std::string sub = src + "/d" + std::to_string(d);
    mkdir(sub.c_str(), 0755);
    for (int i = 0; i < 150; ++i) ubtrfs_test::WriteRandomFile(sub + "/f" + std::to_string(i), (d * 131 + i * 37) % 9000 + 10, d * 1000 + i);
  }
  for (int i = 0; i < 4; ++i) ubtrfs_test::WriteRandomFile(src + "/big" + std::to_string(i), (i + 1) * 3 * kMiB, 500 + i);
  const std::string img = MakeImage(dir, "1G");
  auto run = [&](const std::vector<std::string>& args) {
    auto r = RunUbtrfs(args);
    ASSERT_TRUE(r.ok()) << r.Describe();
  };
  run({"subvolume", "create", img + ":/sv"});
  run({"cp", src, img + ":/sv/tree"});
  run({"subvolume", "snapshot", img + ":/sv", img + ":/snap1"});
  run({"rm", "-r", img + ":/sv/tree/d1", img + ":/sv/tree/big1", img + ":/snap1/tree/d2/f7"});
  run({"cp", src + "/big3", img + ":/sv/tree/d0/big3.again"});
  run({"subvolume", "snapshot", "-r", img + ":/sv", img + ":/snap2"});
  run({"rm", "-r", img + ":/sv/tree/d3", img + ":/sv/tree/big2", img + ":/snap1/tree/big0"});
  if (HasFatalFailure()) return;
  CopyOut(img, dir.Sub("before"));
  const uint64_t blocks = TreeBlocks(img);
  ASSERT_GT(blocks, 50u);

  RelocateResult r;
  ASSERT_TRUE(Relocated({img}, Usage("100", "100"), &r));
  EXPECT_EQ(r.groups_emptied, r.groups_selected) << Notes(r);
  EXPECT_GT(r.data_extents, 0u);
  EXPECT_GT(r.tree_blocks, blocks / 2);
  // Trees that copied a shared block each would have about twice as many
  // blocks; the few more are the extent and checksum trees' new items.
  EXPECT_LE(TreeBlocks(img), blocks + blocks / 20 + 4) << "before: " << blocks;
  ExpectUnchanged(img, dir);
  // Once more over the result: blocks the first run made move again.
  ASSERT_TRUE(Relocated({img}, Usage("100", "100"), &r));
  EXPECT_EQ(r.groups_emptied, r.groups_selected) << Notes(r);
  ExpectImageEquals(dir.Sub("before"), img);
  EXPECT_EQ(BtrfsCheck(img), "");
  if (!KernelPartRuns()) return;
  ExpectKernelBalancesAndScrubs(img, dir.Sub("mnt"));
}

// Rounds of random changes through the library (snapshots, overwrites,
// deletions, new files, reflinks from snapshots) on 4 KiB nodes, each
// followed by a balance of everything: blocks moved by one balance are
// shared, copied and moved again by the next. After each, the files are as
// before and both checkers agree.
TEST(BalanceUsage, RandomChangesBetweenBalances) {
  TempDir dir("ubtrfs-balance");
  const std::string img = dir.Sub("img");
  ASSERT_TRUE(RunUbtrfs({"mkfs", "-q", "-n", "4096", "--size", "512M", img}).ok());
  std::mt19937_64 rng(7);
  auto bytes = [&](size_t n) { return ubtrfs_test::SeededBytes(n, rng()); };
  std::vector<std::string> writable{"sv"};
  int snapshots = 0;
  {
    auto fs = Filesystem::Open(img, OpenOptions{.writable = true});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto sv = (*fs)->CreateSubvolume((*fs)->Root(), "sv", NewInode{.mode = 0755});
    ASSERT_TRUE(sv.ok()) << sv.status().ToString();
    for (int i = 0; i < 1500; ++i) {
      auto f = (*fs)->Create(*sv, "f" + std::to_string(i), NewInode{.mode = 0644});
      ASSERT_TRUE(f.ok());
      const std::string b = bytes(i % 4 == 0 ? 5000 + rng() % 20000 : 10 + rng() % 1500);
      ASSERT_TRUE((*fs)->Write(*f, 0, ubtrfs_test::SpanOf(b)).ok());
    }
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  for (int round = 0; round < 4; ++round) {
    {
      auto fs = Filesystem::Open(img, OpenOptions{.writable = true});
      ASSERT_TRUE(fs.ok()) << fs.status().ToString();
      Filesystem& f = **fs;
      const std::string snap = "snap" + std::to_string(++snapshots);
      const bool ro = round % 2 == 1;
      auto from = f.Lookup("/" + writable[rng() % writable.size()]);
      ASSERT_TRUE(from.ok());
      ASSERT_TRUE(f.CreateSnapshot(*from, f.Root(), snap, ro).ok());
      if (!ro) writable.push_back(snap);
      for (int k = 0; k < 300; ++k) {
        const std::string top = "/" + writable[rng() % writable.size()];
        auto d = f.Lookup(top);
        ASSERT_TRUE(d.ok());
        const std::string name = "f" + std::to_string(rng() % 1600);
        auto id = f.LookupChild(*d, name);
        const int op = static_cast<int>(rng() % 4);
        if (op == 0 && id.ok()) {
          ASSERT_TRUE(f.Unlink(*d, name).ok());
        } else if (op == 1 && id.ok()) {
          const std::string b = bytes(1 + rng() % 6000);
          ASSERT_TRUE(f.Write(*id, rng() % 8000, ubtrfs_test::SpanOf(b)).ok());
        } else if (op == 2 && !id.ok()) {
          auto n = f.Create(*d, name, NewInode{.mode = 0644});
          ASSERT_TRUE(n.ok());
          const std::string b = bytes(rng() % 30000);
          ASSERT_TRUE(f.Write(*n, 0, ubtrfs_test::SpanOf(b)).ok());
        } else if (op == 3) {
          auto src = f.Lookup("/snap" + std::to_string(1 + rng() % snapshots) + "/" + name);
          const std::string copy = "c" + std::to_string(round) + "_" + std::to_string(k);
          if (!src.ok()) continue;
          auto n = f.Create(*d, copy, NewInode{.mode = 0644});
          ASSERT_TRUE(n.ok());
          ASSERT_TRUE(f.Clone(*src, 0, *n, 0, 0).ok());
        }
      }
      ASSERT_TRUE(f.Commit().ok());
    }
    const std::string before = dir.Sub("before" + std::to_string(round));
    CopyOut(img, before);
    RelocateResult r;
    ASSERT_TRUE(Relocated({img}, Usage("100", "100"), &r)) << "round " << round;
    EXPECT_EQ(r.groups_emptied, r.groups_selected) << "round " << round << Notes(r);
    ExpectImageEquals(before, img);
    ASSERT_EQ(BtrfsCheck(img), "") << "round " << round;
    ASSERT_EQ(UbtrfsCheck(img), "") << "round " << round;
    ubtrfs_test::RemoveTree(before);
  }
  if (!KernelPartRuns()) return;
  ExpectKernelBalancesAndScrubs(img, dir.Sub("mnt"));
}

// What the kernel writes: snapshots that it changed on both sides (blocks
// with FULL_BACKREF, data referenced by leaf), reflinks, compressed and
// preallocated extents, a nodatacow file, quotas; without skinny metadata,
// with the block group tree, and with mixed data and metadata groups.
struct KernelCase {
  const char* name;
  std::vector<std::string> mkfs;  // mkfs.btrfs options; ubtrfs mkfs (block group tree) when empty
  bool quotas;
  bool many;  // thousands of files under five snapshots (deeper trees, nodes shared and copied)
};

class BalanceUsageKernel : public ::testing::TestWithParam<KernelCase> {};

TEST_P(BalanceUsageKernel, EverythingMovesAndTheKernelAgrees) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  TempDir dir("ubtrfs-balance");
  const std::string img = dir.Sub("img"), mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(img, 1024 * kMiB, &err)) << err;
  std::vector<std::string> mkfs{"mkfs.btrfs", "-q", "-f"};
  mkfs.insert(mkfs.end(), GetParam().mkfs.begin(), GetParam().mkfs.end());
  if (GetParam().mkfs.empty()) mkfs = {UBTRFS_CLI_PATH, "mkfs", "-q", "-f"};
  mkfs.push_back(img);
  auto mk = RunCommand(mkfs);
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  const std::string script = std::string(R"(set -e
cd ")") + mnt + R"("
)" + (GetParam().quotas ? "btrfs quota enable .\n" : "") + R"(
btrfs subvolume create sv >/dev/null
for d in 1 2 3 4; do mkdir sv/d$d; for i in $(seq 1 200); do head -c $(( (d*i*131) % 12000 + 1 )) /dev/urandom > sv/d$d/f$i; done; done
for i in 1 2 3 4 5; do head -c $((i*400000)) /dev/urandom > sv/big$i; done
yes "a line that compresses well" | head -c 2000000 > sv/text
cp --reflink=always sv/big3 sv/big3.clone
fallocate -l 4M sv/prealloc
touch sv/nocow; chattr +C sv/nocow; head -c 2000000 /dev/urandom > sv/nocow
btrfs subvolume snapshot sv snapA >/dev/null
for i in $(seq 2 2 200); do rm sv/d1/f$i; done
echo change >> snapA/d2/f7
head -c 300000 /dev/urandom | dd of=sv/big2 bs=256K seek=1 conv=notrunc 2>/dev/null
btrfs subvolume snapshot -r sv snapB >/dev/null
rm -f sv/big4 sv/big5 snapA/big1
for i in $(seq 3 3 200); do rm -f sv/d3/f$i snapA/d4/f$i; done
)" + (!GetParam().many ? "" : R"(
# Thousands of small files (split: one process), then more snapshots, each
# followed by changes on both sides: nodes shared by several trees, copied
# by some (FULL_BACKREF), over several data groups.
mkdir sv/many
for b in 700 3000 9000; do head -c $((b * 1500)) /dev/urandom | split -d -a 4 -b $b - sv/many/s$b.; done
for s in C D E; do
  btrfs subvolume snapshot sv snap$s >/dev/null
  for i in $(seq 1 40); do rm -f sv/many/s700.$(printf '%04d' $((i * 37 % 1500))); done
  for f in $(ls snap$s/many | head -300 | tail -40); do echo more >> snap$s/many/$f; done
  head -c 1000000 /dev/urandom > sv/new$s
done
)") + (GetParam().quotas ? "btrfs quota rescan -w . >/dev/null\n" : "");
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "compress=zstd"), "");
    auto r = RunCommand({"bash", "-c", script});
    ASSERT_TRUE(r.ok()) << r.Describe();
    ASSERT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(BtrfsCheck(img), "") << "the kernel's image";
  CopyOut(img, dir.Sub("before"));

  RelocateResult r;
  if (std::string(GetParam().name) == "Mixed") {
    // Mixed groups hold both kinds: one filter for them, as the kernel asks.
    const std::string sum = ubtrfs_test::Sha256(img);
    Status st = RelocateGroups({img}, Usage("50", "60"), &r);
    EXPECT_EQ(st.code(), EINVAL) << st.ToString();
    EXPECT_EQ(ubtrfs_test::Sha256(img), sum);
  }
  ASSERT_TRUE(Relocated({img}, Usage("100", "100"), &r));
  EXPECT_EQ(r.groups_emptied, r.groups_selected) << Notes(r);
  EXPECT_GT(r.data_extents, 0u);
  EXPECT_GT(r.tree_blocks, 0u);
  ExpectUnchanged(img, dir);
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    const auto diff = ubtrfs_test::CompareHostTrees(dir.Sub("before") + "/snapA", mnt + "/snapA");
    EXPECT_TRUE(diff.empty()) << ubtrfs_test::FormatMismatches(diff);
    ASSERT_EQ(m.Unmount(), "");
  }
  ExpectKernelBalancesAndScrubs(img, mnt);
}

INSTANTIATE_TEST_SUITE_P(Images, BalanceUsageKernel,
                         ::testing::Values(KernelCase{"QuotasManySnapshots", {"-n", "4096"}, true, true},
                                           KernelCase{"NoSkinnyMetadata", {"-n", "4096", "-O", "^skinny-metadata"}, false, false},
                                           KernelCase{"BlockGroupTree", {}, false, false},
                                           KernelCase{"Mixed", {"--mixed"}, false, false}),
                         [](const ::testing::TestParamInfo<KernelCase>& i) { return std::string(i.param.name); });

// Two 400 MiB images made one filesystem (data `profile`, metadata RAID1),
// 24 files of step, 2 * step, ... bytes copied into /src.
std::vector<std::string> TwoDevices(const TempDir& dir, const std::string& profile, uint64_t step) {
  std::vector<std::string> images{dir.Sub("d1.img"), dir.Sub("d2.img")};
  for (const auto& img : images) {
    std::string err;
    EXPECT_TRUE(ubtrfs_test::MakeSparseFile(img, 400 * kMiB, &err)) << err;
  }
  std::vector<std::string> args{"mkfs", "-q", "-f", "-d", profile, "-m", "raid1"};
  args.insert(args.end(), images.begin(), images.end());
  EXPECT_TRUE(RunUbtrfs(args).ok());
  const std::string src = dir.Sub("src");
  mkdir(src.c_str(), 0755);
  for (int i = 0; i < 24; ++i) ubtrfs_test::WriteRandomFile(src + "/f" + std::to_string(i), (i + 1) * step, i);
  EXPECT_TRUE(RunUbtrfs({"cp", src, ubtrfs_test::JoinDevices(images) + ":/src"}).ok());
  return images;
}

// RAID1 over two devices: moved extents get both copies.
TEST(BalanceUsage, MirroredOverTwoDevices) {
  TempDir dir("ubtrfs-balance");
  const std::vector<std::string> images = TwoDevices(dir, "raid1", 400 * 1024);
  if (HasFatalFailure()) return;
  const std::string joined = ubtrfs_test::JoinDevices(images);
  std::vector<std::string> rm{"rm"};
  for (int i = 0; i < 24; i += 2) rm.push_back(joined + ":/src/f" + std::to_string(i));
  ASSERT_TRUE(RunUbtrfs(rm).ok());
  CopyOut(joined, dir.Sub("before"));
  const Layout before = ReadLayout(images);

  RelocateResult r;
  ASSERT_TRUE(Relocated(images, Usage("90", "90"), &r));
  EXPECT_GT(r.groups_emptied, 0u) << Notes(r);
  const Layout after = ReadLayout(images);
  ExpectConsistent(after, "balanced");
  EXPECT_EQ(after.stripes, 2 * after.chunks.size()) << after.Describe();  // RAID1 everywhere
  EXPECT_LT(after.Count(kBlockGroupData), before.Count(kBlockGroupData)) << after.Describe();
  ExpectImageEquals(dir.Sub("before"), joined);
  EXPECT_EQ(UbtrfsCheck(joined), "");
  // With a device missing, nothing moves: the new chunks would lack its
  // copies, and the old ones could not go.
  {
    const std::string gone = dir.Sub("gone.img");
    ASSERT_EQ(rename(images[1].c_str(), gone.c_str()), 0);
    const std::string before = ubtrfs_test::Sha256(images[0]);
    RelocateOptions o = Usage("100", "100");
    o.degraded = true;
    Status missing = RelocateGroups({images[0]}, o, &r);
    EXPECT_EQ(missing.code(), EINVAL) << missing.ToString();
    EXPECT_NE(missing.message().find("missing"), std::string::npos) << missing.ToString();
    EXPECT_EQ(ubtrfs_test::Sha256(images[0]), before);
    ASSERT_EQ(rename(gone.c_str(), images[1].c_str()), 0);
  }
  if (!KernelPartRuns()) return;
  auto check = ubtrfs_test::ArrayMount::CheckOnce(images);
  EXPECT_TRUE(check.ok()) << check.Describe();
}

// Conversion takes the choosing filters too (`-dconvert=raid1,limit=1`),
// and one run converts one kind while it empties another.
TEST(BalanceUsage, ConvertTakesTheFiltersToo) {
  TempDir dir("ubtrfs-balance");
  const std::vector<std::string> images = TwoDevices(dir, "single", 700 * 1024);
  if (HasFatalFailure()) return;
  const std::string joined = ubtrfs_test::JoinDevices(images);
  CopyOut(joined, dir.Sub("before"));
  auto raid1_data = [&] {
    const Layout l = ReadLayout(images);
    int n = 0;
    for (const auto& [logical, type] : l.chunks) n += (type & kBlockGroupData) && (type & kBlockGroupRaid1);
    return std::pair<int, int>{n, l.Count(kBlockGroupData)};
  };
  ASSERT_GE(raid1_data().second, 2);
  ASSERT_EQ(raid1_data().first, 0);

  std::vector<std::string> bal{"balance", "-dconvert=raid1,limit=1"};
  bal.insert(bal.end(), images.begin(), images.end());
  auto r = RunUbtrfs(bal);
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Converted 1 chunks"), std::string::npos) << r.out;
  EXPECT_EQ(raid1_data().first, 1);
  if (KernelPartRuns()) {
    // Half converted (single and RAID1 data side by side), as an
    // interrupted kernel balance leaves it: the kernel reads every file.
    const std::string mnt = dir.Sub("mnt");
    mkdir(mnt.c_str(), 0755);
    ubtrfs_test::ArrayMount m;
    ASSERT_EQ(m.Mount(images, mnt, "ro"), "");
    const auto diff = ubtrfs_test::CompareHostTrees(dir.Sub("before") + "/src", mnt + "/src");
    EXPECT_TRUE(diff.empty()) << ubtrfs_test::FormatMismatches(diff);
    m.Unmount();
    auto check = ubtrfs_test::ArrayMount::CheckOnce(images);
    EXPECT_TRUE(check.ok()) << check.Describe();
  }
  // The rest, soft, and metadata emptied in the same run.
  bal = {"balance", "-dconvert=raid1,soft", "-musage=100"};
  bal.insert(bal.end(), images.begin(), images.end());
  r = RunUbtrfs(bal);
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Converted "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Relocated "), std::string::npos) << r.out;
  const auto [raid1, data] = raid1_data();
  EXPECT_EQ(raid1, data);
  ExpectConsistent(ReadLayout(images), "converted");
  ExpectImageEquals(dir.Sub("before"), joined);
  EXPECT_EQ(UbtrfsCheck(joined), "");
  if (!KernelPartRuns()) return;
  auto check = ubtrfs_test::ArrayMount::CheckOnce(images);
  EXPECT_TRUE(check.ok()) << check.Describe();
}

// Groups nearly full on a device with no room for another chunk: the moves
// cannot find room, which is an ENOSPC, and nothing is lost.
TEST(BalanceUsage, NoRoomIsAnErrorAndLosesNothing) {
  TempDir dir("ubtrfs-balance");
  const std::string img = MakeImage(dir, "256M");
  int files = 0;
  {
    auto fs = Filesystem::Open(img, OpenOptions{.writable = true});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    const std::string bytes = ubtrfs_test::SeededBytes(4 * kMiB, 1);
    for (;; ++files) {
      NewInode a;
      a.mode = 0644;
      auto id = (*fs)->Create((*fs)->Root(), "f" + std::to_string(files), a);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      auto w = (*fs)->Write(*id, 0, ubtrfs_test::SpanOf(bytes));
      if (!w.ok()) {
        ASSERT_EQ(w.status().code(), ENOSPC) << w.status().ToString();
        ASSERT_TRUE((*fs)->Unlink((*fs)->Root(), "f" + std::to_string(files)).ok());
        break;
      }
      ASSERT_TRUE((*fs)->Commit().ok());
    }
    ASSERT_GE(files, 30);
    // A little room in each group, far from a group's worth in all.
    for (int i = 0; i < files; i += 12) ASSERT_TRUE((*fs)->Unlink((*fs)->Root(), "f" + std::to_string(i)).ok());
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  CopyOut(img, dir.Sub("before"));
  RelocateResult r;
  Status st = RelocateGroups({img}, Usage("100", ""), &r);
  EXPECT_EQ(st.code(), ENOSPC) << st.ToString() << Notes(r);
  EXPECT_EQ(r.groups_emptied, 0u);
  ExpectUnchanged(img, dir);
}

// A data extent whose reference counts one file extent item more than
// there is: the move cannot account for every pointer to it, so it stays
// (named), and the rest of its group moves out.
TEST(BalanceUsage, AnExtentItsReferencesDoNotAccountForStays) {
  TempDir dir("ubtrfs-balance");
  const std::string src = dir.Sub("src");
  mkdir(src.c_str(), 0755);
  for (int i = 0; i < 6; ++i) ubtrfs_test::WriteRandomFile(src + "/f" + std::to_string(i), 300 * 1024 + i, i);
  const std::string img = MakeImage(dir, "512M");
  ASSERT_TRUE(RunUbtrfs({"cp", src, img + ":/src"}).ok());
  uint64_t damaged = 0;
  {
    auto o = ubtrfs_test::OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    auto ext = o->vol->FindRoot(kExtentTreeObjectid);
    ASSERT_TRUE(ext.ok());
    tree::Cursor c(o->vol->reader(), ext->ref);
    ASSERT_TRUE(c.SeekFirst().ok());
    Key key;
    std::vector<uint8_t> item;
    while (c.Valid() && item.empty()) {
      const auto* ei = reinterpret_cast<const ExtentItem*>(c.data().data());
      if (c.key().type == kExtentItemKey && (ei->flags.get() & kExtentFlagData)) {
        key = c.key();
        item.assign(c.data().begin(), c.data().end());
      }
      ASSERT_TRUE(c.Next().ok());
    }
    ASSERT_FALSE(item.empty());
    damaged = key.objectid;
    auto refs = txn::ParseInlineRefs(item, sizeof(ExtentItem), key);
    ASSERT_TRUE(refs.ok() && refs->size() == 1 && (*refs)[0].type == kExtentDataRefKey);
    txn::SetInlineCount(item, (*refs)[0], 2);
    auto* ei = reinterpret_cast<ExtentItem*>(item.data());
    ei->refs = ei->refs.get() + 1;
    auto w = o->txn->Writer(kExtentTreeObjectid);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Update(key, item).ok());
    ASSERT_TRUE(o->txn->Commit().ok());
  }
  CopyOut(img, dir.Sub("before"));
  const uint64_t extents = DataExtents(img);
  ASSERT_GE(extents, 6u);
  RelocateResult r;
  ASSERT_TRUE(Relocated({img}, Usage("100", ""), &r));
  EXPECT_EQ(r.groups_emptied, 0u) << Notes(r);
  EXPECT_EQ(r.data_extents, extents - 1) << Notes(r);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes[0].find("data extent " + std::to_string(damaged) + " stays"), std::string::npos) << Notes(r);
  ExpectUnchanged(img, dir, /*clean=*/false);
}

// Relocation trees the kernel left (a balance of its own interrupted) are
// the kernel's to merge: nothing moves.
TEST(BalanceUsage, AnInterruptedKernelBalanceIsLeftToTheKernel) {
  TempDir dir("ubtrfs-balance");
  const std::string img = MakeImage(dir, "256M");
  {
    auto o = ubtrfs_test::OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    auto fs_root = o->vol->FindRoot(kFsTreeObjectid);
    ASSERT_TRUE(fs_root.ok());
    auto w = o->txn->Writer(kRootTreeObjectid);
    ASSERT_TRUE(w.ok());
    const auto* bytes = reinterpret_cast<const uint8_t*>(&fs_root->item);
    ASSERT_TRUE((*w)->Insert(Key{kTreeRelocObjectid, kRootItemKey, kFsTreeObjectid},
                             std::span(bytes, fs_root->item_size)).ok());
    ASSERT_TRUE(o->txn->Commit().ok());
  }
  const std::string before = ubtrfs_test::Sha256(img);
  RelocateResult r;
  Status st = RelocateGroups({img}, Usage("100", "100"), &r);
  EXPECT_EQ(st.code(), EINVAL) << st.ToString();
  EXPECT_NE(st.message().find("relocation trees"), std::string::npos) << st.ToString();
  EXPECT_EQ(ubtrfs_test::Sha256(img), before);
}

TEST(BalanceUsage, CommandLine) {
  TempDir dir("ubtrfs-balance");
  const std::string img = MakeImage(dir, "256M");
  const std::string src = dir.Sub("src");
  mkdir(src.c_str(), 0755);
  for (int i = 0; i < 8; ++i) ubtrfs_test::WriteRandomFile(src + "/f" + std::to_string(i), 2 * kMiB, i);
  ASSERT_TRUE(RunUbtrfs({"cp", src, img + ":/src"}).ok());
  auto r = RunUbtrfs({"balance", "-dusage=100", "-musage=100", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Relocated 2 of 2 block groups"), std::string::npos) << r.out;
  r = RunUbtrfs({"balance", "-q", "--dusage", "10..100", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out, "");
  struct Bad {
    std::vector<std::string> args;
    const char* says;
  };
  for (const Bad& b : {Bad{{"-dusage=x"}, "not a percentage"}, Bad{{"-dusage=101"}, "not a percentage"},
                       Bad{{"-dusage=50..10"}, "the range is empty"}, Bad{{"-d", "usage=5,,limit=1"}, "an empty filter"},
                       Bad{{"-dfoo=5"}, "supported are usage="}, Bad{{"-susage=5"}, "system chunks"},
                       Bad{{"-d", "raid1,usage=5"}, "supported are"}, Bad{{"-ddrange=1..2"}, "needs devid"},
                       Bad{{}, "give what to do"}}) {
    std::vector<std::string> args{"balance"};
    args.insert(args.end(), b.args.begin(), b.args.end());
    args.push_back(img);
    auto bad = RunUbtrfs(args);
    EXPECT_EQ(bad.exit_code, 2) << bad.Describe();
    EXPECT_NE(bad.err.find(b.says), std::string::npos) << bad.Describe();
  }
  EXPECT_EQ(UbtrfsCheck(img), "");
}

}  // namespace UBTRFS_UNITY_ID
