// Open files past their last name (Filesystem::PinInode): unlinked or
// renamed over while pinned, an inode stays with nlink 0 and an orphan item,
// readable and writable by id, until its last UnpinInode deletes it. A crash
// in between (the image as committed, pins gone) leaves the orphan item:
// btrfs check accepts the image, and both the next writable open here and
// the kernel's mount delete the inode.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <chrono>
#include <atomic>

#include <string>
#include <vector>

#include "support/fuse_mount.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::LoopMount;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

std::string MakeImage(const TempDir& dir, const std::string& name = "img") {
  const std::string img = dir.Sub(name);
  EXPECT_EQ(ubtrfs_test::RunMkfs(img, "", 0, "", 256ull << 20), "");
  return img;
}


InodeId NewFile(Filesystem& fs, const std::string& name, const std::vector<uint8_t>& data) {
  NewInode a;
  a.mode = 0100644;
  auto f = fs.Create(fs.Root(), name, a);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!data.empty()) {
    EXPECT_TRUE(fs.Write(*f, 0, data).ok());
  }
  return *f;
}

// The fs tree's items of inode `ino` and its orphan item, as btrfs-progs
// reads them.
std::pair<bool, bool> InodeAndOrphan(const std::string& img, uint64_t ino) {
  auto dump = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "5", img});
  EXPECT_TRUE(dump.ok()) << dump.Describe();
  const std::string s = std::to_string(ino);
  return {dump.out.find("key (" + s + " INODE_ITEM 0)") != std::string::npos,
          dump.out.find("key (ORPHAN ORPHAN_ITEM " + s + ")") != std::string::npos};
}

bool HaveTools() { return !ubtrfs_test::FindProgram("mkfs.btrfs").empty(); }

// A loop mount of `image` (an orphan `ino`, once at `path`, in it) runs the
// kernel's orphan cleanup: the inode and its orphan item go, check-clean.
// Skips where loop mounts are unavailable.
void ExpectTheKernelDropsTheOrphan(const TempDir& dir, const std::string& image, uint64_t ino, const std::string& path) {
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string mnt = dir.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(image, mnt, ""), "");
    struct stat st {};
    EXPECT_NE(stat((mnt + path).c_str(), &st), 0);
    ASSERT_EQ(m.Unmount(), "");
  }
  auto [has_inode, has_orphan] = InodeAndOrphan(image, ino);
  EXPECT_FALSE(has_inode || has_orphan) << "the kernel's orphan cleanup left the inode";
  EXPECT_EQ(BtrfsCheck(image), "");
}

TEST(Orphans, PinnedFileOutlivesItsNameUntilUnpinned) {
  if (!HaveTools()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-orphan");
  const std::string img = MakeImage(dir, "img");
  auto fs = ubtrfs_test::OpenWritable(img);
  ASSERT_TRUE(fs);
  const std::vector<uint8_t> data(300000, 'a');
  const InodeId f = NewFile(*fs, "open", data);
  const InodeId g = NewFile(*fs, "target", std::vector<uint8_t>(5000, 'g'));
  const InodeId h = NewFile(*fs, "linked", std::vector<uint8_t>(100, 'h'));
  ASSERT_TRUE(fs->Link(h, fs->Root(), "second").ok());
  fs->PinInode(f);
  fs->PinInode(f);  // two handles
  fs->PinInode(g);
  fs->PinInode(h);
  ASSERT_TRUE(fs->Unlink(fs->Root(), "open").ok());
  ASSERT_TRUE(fs->Rename(fs->Root(), "linked", fs->Root(), "target").ok());  // g renamed over
  EXPECT_FALSE(fs->Lookup("/open").ok());
  for (InodeId id : {f, g}) {
    auto st = fs->GetStat(id);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->nlink, 0u);
  }
  auto sh = fs->GetStat(h);
  ASSERT_TRUE(sh.ok());
  EXPECT_EQ(sh->nlink, 2u);  // renamed, its names kept: no orphan
  // Still a file: read, written, truncated, by id.
  std::vector<uint8_t> back(data.size());
  auto n = fs->Read(f, 0, back);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(fs->Write(f, 300000, std::vector<uint8_t>(4096, 'b')).ok());
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  auto [fi, fo] = InodeAndOrphan(img, f.ino);
  EXPECT_TRUE(fi && fo) << "the committed image keeps the open file as an orphan";
  EXPECT_EQ(BtrfsCheck(img), "");

  // Open again: what the last session left pinned is deleted now.
  fs = ubtrfs_test::OpenWritable(img);
  ASSERT_TRUE(fs);
  EXPECT_FALSE(fs->GetStat(f).ok());
  EXPECT_FALSE(fs->GetStat(g).ok());
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  auto [fi2, fo2] = InodeAndOrphan(img, f.ino);
  EXPECT_FALSE(fi2 || fo2);
  EXPECT_EQ(BtrfsCheck(img), "");
}

TEST(Orphans, LastUnpinDeletes) {
  if (!HaveTools()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-orphan-unpin");
  const std::string img = MakeImage(dir, "img");
  auto fs = ubtrfs_test::OpenWritable(img);
  ASSERT_TRUE(fs);
  const InodeId f = NewFile(*fs, "f", std::vector<uint8_t>(1 << 20, 'x'));
  ASSERT_TRUE(fs->Commit().ok());
  auto before = fs->StatFs();
  ASSERT_TRUE(before.ok());
  fs->PinInode(f);
  fs->PinInode(f);
  ASSERT_TRUE(fs->Unlink(fs->Root(), "f").ok());
  ASSERT_TRUE(fs->UnpinInode(f).ok());
  EXPECT_TRUE(fs->GetStat(f).ok()) << "one handle is still open";
  ASSERT_TRUE(fs->UnpinInode(f).ok());
  EXPECT_FALSE(fs->GetStat(f).ok());
  ASSERT_TRUE(fs->UnpinInode(f).ok()) << "an unpin too many is harmless";
  ASSERT_TRUE(fs->Commit().ok());
  auto after = fs->StatFs();
  ASSERT_TRUE(after.ok());
  EXPECT_GE(after->avail_bytes, before->avail_bytes + (1 << 20) - (256 << 10)) << "the data's space came back";
  fs.reset();
  auto [fi, fo] = InodeAndOrphan(img, f.ino);
  EXPECT_FALSE(fi || fo);
  EXPECT_EQ(BtrfsCheck(img), "");
}

// What a crash leaves (the orphan committed, the pin gone) is the kernel's
// own format: its mount deletes the inode, and btrfs check agrees before and
// after. An fsync of the open, nameless file makes nothing of it durable.
TEST(Orphans, TheKernelCleansUpWhatACrashLeft) {
  if (!HaveTools()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-orphan-kernel");
  const std::string img = MakeImage(dir, "img");
  uint64_t ino = 0;
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    const InodeId f = NewFile(*fs, "f", std::vector<uint8_t>(200000, 'k'));
    ASSERT_TRUE(fs->Commit().ok());
    ino = f.ino;
    fs->PinInode(f);
    ASSERT_TRUE(fs->Unlink(fs->Root(), "f").ok());
    ASSERT_TRUE(fs->Commit().ok());
    ASSERT_TRUE(fs->Write(f, 0, std::vector<uint8_t>(4096, 'z')).ok());
    ASSERT_TRUE(fs->Fsync(f, false).ok());
    // The crash: the image as it is now (the fsync's log included).
    ASSERT_TRUE(RunCommand({"cp", "--sparse=always", img, dir.Sub("crash.img")}).ok());
  }
  const std::string crash = dir.Sub("crash.img");
  EXPECT_EQ(BtrfsCheck(crash), "");
  {
    auto ro = Filesystem::Open(crash);
    ASSERT_TRUE(ro.ok()) << ro.status().ToString();
    EXPECT_FALSE((*ro)->Lookup("/f").ok());
  }
  ExpectTheKernelDropsTheOrphan(dir, crash, ino, "/f");
}

// A file of many extents is dropped in steps, each a change of its own
// (orphans.cc). The steps ran back to back and took the operation lock
// again before a waiting commit was woken, so no commit got in until the
// whole drop was done. Now one commits while the unlink runs, and that
// commit's image -- an orphan whose size is partly cut -- is what a crash
// there leaves: btrfs check accepts it, and both the kernel's orphan
// cleanup and a writable open here finish the drop.
TEST(Orphans, CommitsGoOnBetweenTheStepsOfALargeFilesDrop) {
  if (!HaveTools()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-orphan-steps");
  const std::string img = MakeImage(dir, "img"), mid = dir.Sub("mid.img");
  constexpr uint64_t kExtents = 64 * 150;  // 150 steps
  constexpr uint64_t kStride = 8192, kSize = (kExtents - 1) * kStride + 4096;
  uint64_t ino = 0;
  std::string name;
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    // A try whose drop ends before the polling thread runs again (a loaded
    // machine) shows nothing either way: it is made again with a new file.
    bool step_seen = false;
    for (int attempt = 0; attempt < 3 && !step_seen; ++attempt) {
      name = "big" + std::to_string(attempt);
      const InodeId f = NewFile(*fs, name, {});
      ino = f.ino;
      const std::vector<uint8_t> block(4096, 'e');
      for (uint64_t i = 0; i < kExtents; ++i) {  // a hole between each two: no extent merges with the last
        ASSERT_TRUE(fs->Write(f, i * kStride, block).ok()) << i;
      }
      ASSERT_TRUE(fs->Commit().ok());
      std::atomic<bool> done{false};
      Status unlinked;
      std::thread dropper([&] {
        unlinked = fs->Unlink(fs->Root(), name);
        done.store(true);
      });
      // Once the first step has cut the size, a commit: it gets in before
      // the next step. Its image is copied before any other commit, so it
      // is that commit's (the steps go on meanwhile, into space no
      // committed tree uses; they may even end while its superblocks are
      // flushed).
      for (;;) {
        auto st = fs->GetStat(f);
        if (st.ok() && st->size < kSize) {
          step_seen = true;
          break;
        }
        if (!st.ok() || done.load()) break;
      }
      // (Nor does one whose drop ended while this thread was off the CPU
      // after it saw the step.)
      if (step_seen && done.load()) step_seen = false;
      Status committed;
      bool copy_ok = true;
      if (step_seen) {
        committed = fs->Commit();
        copy_ok = RunCommand({"cp", "--sparse=always", img, mid}).ok();
      }
      dropper.join();  // (before any ASSERT returns)
      ASSERT_TRUE(committed.ok()) << committed.ToString();
      ASSERT_TRUE(copy_ok);
      ASSERT_TRUE(unlinked.ok()) << unlinked.ToString();
    }
    ASSERT_TRUE(step_seen) << "in 3 tries the drop was over before its first step was seen";
    ASSERT_TRUE(fs->Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  auto [gone_i, gone_o] = InodeAndOrphan(img, ino);
  EXPECT_FALSE(gone_i || gone_o);

  // The image of a commit inside the drop.
  EXPECT_EQ(BtrfsCheck(mid), "");
  {
    auto ro = Filesystem::Open(mid);
    ASSERT_TRUE(ro.ok()) << ro.status().ToString();
    EXPECT_FALSE((*ro)->Lookup("/" + name).ok());
    auto st = (*ro)->GetStat(InodeId{5, ino});
    ASSERT_TRUE(st.ok()) << "the commit waited for the whole drop: " << st.status().ToString();
    EXPECT_EQ(st->nlink, 0u);
    EXPECT_LT(st->size, kSize) << "no step of the drop was committed";
    EXPECT_GT(st->size, 0u) << "the drop was committed whole";
  }
  ASSERT_TRUE(RunCommand({"cp", "--sparse=always", mid, dir.Sub("mid2.img")}).ok());
  {
    auto fs = ubtrfs_test::OpenWritable(dir.Sub("mid2.img"));  // its orphan cleanup
    ASSERT_TRUE(fs);
  }
  auto [i2, o2] = InodeAndOrphan(dir.Sub("mid2.img"), ino);
  EXPECT_FALSE(i2 || o2) << "a writable open here finished the drop";
  EXPECT_EQ(BtrfsCheck(dir.Sub("mid2.img")), "");

  ExpectTheKernelDropsTheOrphan(dir, mid, ino, "/" + name);
}

// Through the mount: a file unlinked while open leaves no name in its
// directory, and a kill -9 of the mount after a commit leaves an image that
// is check-clean and, opened again, without the file.
TEST(Orphans, MountKilledWithAnOpenUnlinkedFile) {
  SKIP_IF_NO_FUSE();
  ubtrfs_test::Scratch s;
  ASSERT_EQ(s.Make(256ull << 20), "");
  ubtrfs_test::MountProcess m;
  START_MOUNT(m, s);
  const std::string path = s.mnt + "/victim";
  int fd = open(path.c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(pwrite(fd, "still here", 10, 0), 10);
  ASSERT_EQ(unlink(path.c_str()), 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  auto ls = ubtrfs_test::RunCommand({"ls", "-A", s.mnt});
  EXPECT_EQ(ls.out, "") << "a name is left in the directory";
  // A commit (fsync of the mount's top directory), then the crash.
  int top = open(s.mnt.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(top, 0);
  ASSERT_EQ(fsync(top), 0);
  close(top);
  char back[10] = {};
  ASSERT_EQ(pread(fd, back, 10, 0), 10);
  EXPECT_EQ(std::string(back, 10), "still here");
  ASSERT_EQ(kill(m.pid(), SIGKILL), 0);
  EXPECT_EQ(m.Wait(30), 128 + SIGKILL);
  close(fd);
  m.Cleanup();
  EXPECT_EQ(BtrfsCheck(s.img), "");
  auto fs = ubtrfs_test::OpenWritable(s.img);
  ASSERT_TRUE(fs);
  auto entries = fs->ReadDir(fs->Root());
  ASSERT_TRUE(entries.ok());
  EXPECT_TRUE(entries->empty());
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  EXPECT_EQ(BtrfsCheck(s.img), "");
}

}  // namespace
