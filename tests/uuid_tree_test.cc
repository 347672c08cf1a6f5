// The UUID tree (subvolumes found by uuid: send -p, receive) and the
// superblock's uuid_tree_generation, which tells the kernel whether to trust
// it. ubtrfs keeps the tree whole, so its mkfs says it is current and every
// commit keeps saying so where it was; the kernel then mounts without a
// rescan (which commits at mount, and on a --shrink image fails for want of
// space). A tree the kernel was still to rescan stays marked so.
#include <gtest/gtest.h>

#include <string>

#include "io/block_device.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/open_txn.h"
#include "support/test_util.h"
#include "txn/devices.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using namespace ubtrfs::format;
using ubtrfs_test::MustRun;
using ubtrfs_test::RunUbtrfs;
using ubtrfs_test::TempDir;

struct Gens {
  uint64_t generation = 0, uuid_tree = 0;
};

Gens ReadGens(const std::string& img) {
  auto dev = io::OpenFileDevice(img);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  if (!dev.ok()) return {};
  auto sc = txn::ReadSuperblock(**dev);
  EXPECT_TRUE(sc.ok()) << sc.status().ToString();
  if (!sc.ok()) return {};
  return {sc->sb.generation.get(), sc->sb.uuid_tree_generation.get()};
}

// "" when ubtrfs check finds no error and no warning about the UUID tree.
std::string UuidClean(const std::string& img) {
  auto r = RunUbtrfs({"check", img});
  if (!r.ok() || r.err.find("uuid tree") != std::string::npos || r.out.find("uuid tree") != std::string::npos) {
    return r.Describe();
  }
  return "";
}

// The kernel mounts and unmounts; "" or why not.
std::string MountUnmount(const std::string& img, const std::string& mnt) {
  ubtrfs_test::LoopMount m;
  if (std::string why = m.Mount(img, mnt); !why.empty()) return why;
  return m.Unmount();
}

TEST(UuidTree, KeptCurrentSoTheKernelMountsWithoutARescan) {
  TempDir dir("ubtrfs-uuid");
  const std::string img = dir.Sub("img"), mnt = dir.Sub("mnt"), src = dir.Sub("src");
  ASSERT_EQ(MustRun({"mkdir", mnt, src}), "");
  ubtrfs_test::WriteRandomFile(src + "/a", 300000, 1);
  ASSERT_TRUE(RunUbtrfs({"mkfs", "-q", "--shrink", "--rootdir", src, img}).ok());
  Gens g = ReadGens(img);
  EXPECT_EQ(g.uuid_tree, g.generation);
  for (const std::vector<std::string>& cmd :
       std::vector<std::vector<std::string>>{{"subvolume", "create", img + ":/sv"},
                                             {"subvolume", "snapshot", img + ":/sv", img + ":/snap"},
                                             {"subvolume", "snapshot", "-r", img + ":/", img + ":/top-ro"},
                                             {"subvolume", "create", img + ":/gone"},
                                             {"subvolume", "delete", img + ":/gone"}}) {
    auto r = RunUbtrfs(cmd);
    ASSERT_TRUE(r.ok()) << ubtrfs_test::ShellJoin(cmd) << ": " << r.Describe();
  }
  g = ReadGens(img);
  EXPECT_EQ(g.uuid_tree, g.generation) << "a commit let the UUID tree go stale";
  EXPECT_EQ(UuidClean(img), "");

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel part needs loop mounts: " << why;
  // A rescan at mount would commit: the generation would move.
  ASSERT_EQ(MountUnmount(img, mnt), "");
  const Gens after = ReadGens(img);
  EXPECT_EQ(after.generation, g.generation) << "the kernel rescanned the UUID tree at mount";
  EXPECT_EQ(ubtrfs_test::BtrfsCheck(img), "");
}

TEST(UuidTree, AStaleTreeStaysStaleAndTheKernelRebuildsIt) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-uuid");
  const std::string img = dir.Sub("img"), mnt = dir.Sub("mnt");
  ASSERT_EQ(MustRun({"mkdir", mnt}), "");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 16384, "crc32c", 256ull << 20), "");
  ASSERT_EQ(ReadGens(img).uuid_tree, 0u);  // mkfs.btrfs leaves the scan to the kernel
  auto r = RunUbtrfs({"subvolume", "create", img + ":/sv"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  Gens g = ReadGens(img);
  EXPECT_EQ(g.uuid_tree, 0u) << "ubtrfs claimed a UUID tree current that it had not checked";
  EXPECT_EQ(UuidClean(img), "");  // a stale tree is not held to it

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel part needs loop mounts: " << why;
  ASSERT_EQ(MountUnmount(img, mnt), "");
  g = ReadGens(img);
  EXPECT_EQ(g.uuid_tree, g.generation) << "the kernel did not rescan";
  // ubtrfs entries and the kernel's scan agree, and ubtrfs keeps it so.
  EXPECT_EQ(UuidClean(img), "");
  r = RunUbtrfs({"subvolume", "snapshot", img + ":/sv", img + ":/snap"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  g = ReadGens(img);
  EXPECT_EQ(g.uuid_tree, g.generation);
  EXPECT_EQ(UuidClean(img), "");
}

// Received subvolumes are found by their received uuid (receive -p); a
// read-only snapshot of one keeps it, and the kernel files the snapshot
// under it too.
TEST(UuidTree, ReceivedUuidsAndTheirReadOnlySnapshots) {
  TempDir dir("ubtrfs-uuid");
  const std::string a = dir.Sub("a"), b = dir.Sub("b"), stream = dir.Sub("stream"), mnt = dir.Sub("mnt");
  ASSERT_EQ(MustRun({"mkdir", mnt}), "");
  for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
           {"mkfs", "-q", "--size", "256M", a},
           {"mkfs", "-q", "--size", "256M", b},
           {"subvolume", "create", a + ":/sv"},
           {"subvolume", "snapshot", "-r", a + ":/sv", a + ":/sv.ro"},
           {"send", "-f", stream, a + ":/sv.ro"},
           {"receive", "-f", stream, b + ":/"},
           {"subvolume", "snapshot", "-r", b + ":/sv.ro", b + ":/again"},
           {"subvolume", "snapshot", b + ":/sv.ro", b + ":/writable"}}) {
    auto r = RunUbtrfs(cmd);
    ASSERT_TRUE(r.ok()) << ubtrfs_test::ShellJoin(cmd) << ": " << r.Describe();
  }
  const Gens g = ReadGens(b);
  EXPECT_EQ(g.uuid_tree, g.generation);
  EXPECT_EQ(UuidClean(b), "");
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel part needs loop mounts: " << why;
  // A forced kernel rescan (it adds what is missing, drops what is stale)
  // leaves an image both checkers pass, and the tree current.
  ubtrfs_test::LoopMount m;
  ASSERT_EQ(m.Mount(b, mnt, "rescan_uuid_tree"), "");
  ASSERT_EQ(m.Unmount(), "");
  const Gens k = ReadGens(b);
  EXPECT_EQ(k.uuid_tree, k.generation);
  EXPECT_EQ(UuidClean(b), "");
  EXPECT_EQ(ubtrfs_test::BtrfsCheck(b), "");
}

TEST(UuidTree, CheckReportsAMissingEntryOnlyWhereTheTreeIsCurrent) {
  TempDir dir("ubtrfs-uuid");
  const std::string img = dir.Sub("img");
  ASSERT_TRUE(RunUbtrfs({"mkfs", "-q", "--size", "256M", img}).ok());
  auto r = RunUbtrfs({"subvolume", "create", img + ":/sv"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(UuidClean(img), "");
  {
    // Take the subvolume's entry out, as a writer that forgot it would.
    auto o = ubtrfs_test::OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    auto root = o->vol->FindRoot(256);
    ASSERT_TRUE(root.ok());
    const uint8_t* u = root->item.uuid;
    auto w = o->txn->Writer(kUuidTreeObjectid);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Delete(Key{LoadLe<uint64_t>(u), kUuidKeySubvol, LoadLe<uint64_t>(u + 8)}).ok());
    ASSERT_TRUE(o->txn->Commit().ok());
  }
  r = RunUbtrfs({"check", img});
  EXPECT_FALSE(r.ok());
  const std::string said = r.out + r.err;
  EXPECT_NE(said.find("uuid tree: no entry for the uuid"), std::string::npos) << r.Describe();
  EXPECT_NE(said.find("of subvolume 256"), std::string::npos) << r.Describe();
}

}  // namespace
