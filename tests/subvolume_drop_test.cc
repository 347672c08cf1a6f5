// Deleting a subvolume whose blocks other trees still share, and deleting in
// steps that survive a crash.
//
// The sharing case that needs more than the shared block itself: a tree of
// three levels (4 KiB nodes), snapshotted, then written once, so that its
// root's children are shared between the two trees while the leaves under
// them are referenced only through those children, by the tree that owns
// them. When that tree goes, every block it owns below a shared one must be
// turned to references by parent: the snapshot later copies those leaves as
// its own, and their data extents must then carry the snapshot's references.
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "fs/open_device.h"
#include "io/block_device.h"
#include "io/fault_device.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

std::string FileData(int i, int round) { return SeededBytes(5000 + (i % 7) * 100, static_cast<uint64_t>(i * 10 + round)); }

TEST(SubvolumeDrop, OwnedBlocksBelowASharedOneAreHandedToTheSnapshot) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-drop");
  const std::string img = tmp.Sub("img");
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  constexpr int kFiles = 2500;
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    auto a = f.CreateSubvolume(f.Root(), "a", ubtrfs::NewInode{0755});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    for (int i = 0; i < kFiles; ++i) {
      auto c = f.Create(*a, "f" + std::to_string(i), ubtrfs::NewInode{0644});
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      ASSERT_TRUE(f.Write(*c, 0, SpanOf(FileData(i, 0))).ok());
    }
    ASSERT_TRUE(f.Commit().ok());
    auto snap = f.CreateSnapshot(*a, f.Root(), "s", false);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    // One write into a: its root is copied, the root's children become
    // shared, the leaves under them stay a's alone.
    auto f0 = f.Lookup("/a/f0");
    ASSERT_TRUE(f0.ok());
    ASSERT_TRUE(f.Write(*f0, 0, SpanOf(std::string("a's own"))).ok());
    ASSERT_TRUE(f.Commit().ok());
    ASSERT_TRUE(f.DeleteSubvolume(f.Root(), "a").ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "") << "after the delete";
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    // Every leaf of s is copied now: each file is rewritten in part.
    for (int i = 0; i < kFiles; i += 3) {
      auto id = f.Lookup("/s/f" + std::to_string(i));
      ASSERT_TRUE(id.ok());
      ASSERT_TRUE(f.Write(*id, 100, SpanOf(std::string("snapshot's change"))).ok());
    }
    ASSERT_TRUE(f.Commit().ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "") << "after writing into the snapshot";
  {
    auto fs = ubtrfs::Filesystem::Open(img, ubtrfs::OpenOptions{});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    for (int i = 0; i < kFiles; i += 37) {
      std::string want = FileData(i, 0);
      if (i % 3 == 0) want.replace(100, 17, "snapshot's change");
      EXPECT_TRUE(ReadImageFile(**fs, "/s/f" + std::to_string(i)) == want) << "s/f" << i;
    }
  }
}

// An image with subvolume a (kFiles files, 4 KiB nodes), a snapshot s of it
// and changes to most of a, whose deletion stopped half way: the device failed its
// flushes after `steps` drop steps were committed. Returns "" or what failed.
std::string MakeHalfDropped(const std::string& img, int files, int steps) {
  if (std::string e = RunMkfs(img, "", 4096, "crc32c", 512ull << 20); !e.empty()) return e;
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    if (!fs.ok()) return fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    auto a = f.CreateSubvolume(f.Root(), "a", ubtrfs::NewInode{0755});
    if (!a.ok()) return a.status().ToString();
    for (int i = 0; i < files; ++i) {
      auto c = f.Create(*a, "f" + std::to_string(i), ubtrfs::NewInode{0644});
      if (!c.ok() || !f.Write(*c, 0, SpanOf(FileData(i, 0))).ok()) return "writing a/f" + std::to_string(i);
    }
    if (!f.Commit().ok()) return "commit";
    auto snap = f.CreateSnapshot(*a, f.Root(), "s", true);
    if (!snap.ok()) return snap.status().ToString();
    // Most of a's leaves become its own; some stay shared with s.
    for (int i = 0; i < files * 2 / 3; i += 2) {
      auto id = f.Lookup("/a/f" + std::to_string(i));
      if (!id.ok() || !f.Write(*id, 0, SpanOf(std::string("a's own"))).ok()) return "a/f" + std::to_string(i);
    }
    if (!f.Commit().ok()) return "commit";
  }
  auto file = ubtrfs::io::OpenFileDevice(img, ubtrfs::io::OpenFlags{true});
  if (!file.ok()) return file.status().ToString();
  auto fault = std::make_unique<ubtrfs::io::FaultDevice>(std::move(*file));
  ubtrfs::io::FaultDevice* dev = fault.get();
  ubtrfs::OpenOptions o;
  o.writable = true;
  o.drop_blocks_per_commit = 8;
  auto fs = ubtrfs::OpenOnDevice(std::move(fault), o);
  if (!fs.ok()) return fs.status().ToString();
  // Two flushes a commit: the one marking a dead, then `steps` drop steps.
  dev->FailAfter(ubtrfs::io::FaultOp::kFlush, 2 * (1 + static_cast<uint64_t>(steps)));
  ubtrfs::Status st = (*fs)->DeleteSubvolume((*fs)->Root(), "a");
  if (st.ok()) return "the delete finished before the device failed (too few files for the steps)";
  return "";
}

// The drop's place as btrfs-progs prints it; "" when the tree is not dead.
std::string DropProgress(const std::string& img, uint64_t id) {
  CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "root", img});
  const std::string item = "(" + std::to_string(id) + " ROOT_ITEM";
  size_t at = r.out.find(item);
  if (at == std::string::npos) return "";
  size_t d = r.out.find("drop_progress", at);
  size_t refs = r.out.find("refs ", at);
  if (d == std::string::npos || refs == std::string::npos || refs > d) return "";
  if (r.out.compare(refs, 6, "refs 0") != 0 || std::isdigit(static_cast<unsigned char>(r.out[refs + 6]))) return "";
  return r.out.substr(d, r.out.find('\n', d) - d);
}

bool HasOrphanItem(const std::string& img, uint64_t id) {
  CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "root", img});
  return r.out.find("ORPHAN ORPHAN_ITEM " + std::to_string(id) + ")") != std::string::npos;
}

// Tree blocks and data extents still referenced by tree `id`.
size_t RefsOfTree(const std::string& img, uint64_t id) {
  CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "extent", img});
  size_t n = 0;
  for (const std::string& w : {"tree block backref root " + std::to_string(id) + "\n",
                               "TREE_BLOCK_REF " + std::to_string(id) + ")",
                               "extent data backref root " + std::to_string(id) + " "}) {
    for (size_t at = r.out.find(w); at != std::string::npos; at = r.out.find(w, at + 1)) ++n;
  }
  return n;
}

TEST(SubvolumeDrop, HalfDroppedTreeIsFinishedByUsAndByTheKernel) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-halfdrop");
  const std::string img = tmp.Sub("img");
  ASSERT_EQ(MakeHalfDropped(img, 2500, 3), "");
  const std::string progress = DropProgress(img, 256);
  EXPECT_NE(progress, "") << "the tree is not dead with a drop_progress";
  EXPECT_EQ(progress.find("drop_progress key (0 UNKNOWN.0 0)"), std::string::npos) << progress;
  EXPECT_TRUE(HasOrphanItem(img, 256));
  EXPECT_GT(RefsOfTree(img, 256), 0u);
  ASSERT_EQ(BtrfsCheck(img), "") << "half dropped";
  const std::string copy = tmp.Sub("copy");
  std::filesystem::copy_file(img, copy);
  // Read-only: the dead tree is invisible, the snapshot whole.
  {
    auto fs = ubtrfs::Filesystem::Open(img, ubtrfs::OpenOptions{});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_FALSE((*fs)->Lookup("/a").ok());
    auto list = (*fs)->ListSubvolumes();
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].path, "s");
    EXPECT_TRUE(ReadImageFile(**fs, "/s/f7") == FileData(7, 0));
  }
  // Ours: a writable open finishes the drop.
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  }
  EXPECT_EQ(DropProgress(img, 256), "");
  EXPECT_FALSE(HasOrphanItem(img, 256));
  EXPECT_EQ(RefsOfTree(img, 256), 0u);
  ASSERT_EQ(BtrfsCheck(img), "") << "after ubtrfs finished the drop";
  // The kernel's: its cleaner finishes the same drop from where we stopped.
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel's resume not tried: loop mounts unavailable: " << why;
  const std::string mnt = tmp.Sub("mnt");
  ASSERT_TRUE(std::filesystem::create_directory(mnt));
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(copy, mnt), "");
    EXPECT_EQ(ReadHostFile(mnt + "/s/f7"), FileData(7, 0));
    // The cleaner runs in the background; wait for the drop to end.
    EXPECT_EQ(MustRun({"btrfs", "subvolume", "sync", mnt}), "");
    EXPECT_EQ(m.Unmount(), "");
  }
  EXPECT_FALSE(HasOrphanItem(copy, 256));
  EXPECT_EQ(RefsOfTree(copy, 256), 0u);
  EXPECT_EQ(BtrfsCheck(copy), "") << "after the kernel finished the drop";
}

}  // namespace
}  // namespace ubtrfs_test
