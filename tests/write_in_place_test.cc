// Writes that go into the extents already there (fs/write_in_place.cc), as
// the kernel's nocow path: preallocated space takes the writes it was
// reserved for even on a full image, and a NODATACOW file keeps its extents
// where they lie, unless a snapshot shares them (then the write copies, and
// the snapshot keeps its bytes). Our checker, btrfs check and the kernel's
// view judge each image.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <map>
#include <string>
#include <vector>

#include "format/ondisk.h"
#include "io/block_device.h"
#include "support/host_files.h"
#include "support/kernel_view.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "tree/cursor.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::CommandResult;
using ubtrfs_test::LoopMount;
using ubtrfs_test::ReadHostFile;
using ubtrfs_test::ReadImageFile;
using ubtrfs_test::RunUbtrfs;
using ubtrfs_test::SeededBytes;
using ubtrfs_test::SpanOf;
using ubtrfs_test::TempDir;
using ubtrfs_test::WriteHostFile;

constexpr uint64_t kMiB = 1ull << 20;

// The disk extent under each file extent item of `id`: file offset -> disk_bytenr.
std::map<uint64_t, uint64_t> DiskExtents(const std::string& img, InodeId id) {
  std::map<uint64_t, uint64_t> out;
  auto dev = io::OpenFileDevice(img);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  if (!dev.ok()) return out;
  auto vol = txn::Volume::Open(std::move(*dev), txn::VolumeOptions{});
  EXPECT_TRUE(vol.ok()) << vol.status().ToString();
  if (!vol.ok()) return out;
  auto root = (*vol)->FindRoot(id.root);
  EXPECT_TRUE(root.ok()) << root.status().ToString();
  if (!root.ok()) return out;
  tree::Cursor c((*vol)->reader(), root->ref);
  EXPECT_TRUE(c.Seek(format::Key{id.ino, format::kExtentDataKey, 0}).ok());
  for (; c.Valid() && c.key().objectid == id.ino && c.key().type == format::kExtentDataKey;) {
    if (c.data().size() == sizeof(format::FileExtentItem)) {
      const auto* fe = reinterpret_cast<const format::FileExtentItem*>(c.data().data());
      out[c.key().offset] = fe->disk_bytenr.get();
    }
    if (!c.Next().ok()) break;
  }
  return out;
}

void Judge(const std::string& img) {
  CommandResult ours = RunUbtrfs({"check", img});
  EXPECT_EQ(ours.exit_code, 0) << ours.Describe();
  EXPECT_EQ(BtrfsCheck(img), "");
}

// Each file (path from the top level) as ubtrfs reads it and, where loop
// mounts work, as the kernel does.
void ExpectFiles(const TempDir& tmp, const std::string& img, const std::map<std::string, std::string>& files) {
  {
    OpenOptions o;
    o.subvolid = 5;
    auto fs = Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    for (const auto& [path, bytes] : files) EXPECT_TRUE(ReadImageFile(**fs, path) == bytes) << "ubtrfs reads " << path;
  }
  LoopMount m;
  const std::string mnt = tmp.Sub("mnt");
  if (!ubtrfs_test::MountKernelView(m, img, mnt, "ro,subvolid=5")) return;
  for (const auto& [path, bytes] : files) EXPECT_TRUE(ReadHostFile(mnt + path) == bytes) << "the kernel reads " << path;
  EXPECT_EQ(m.Unmount(), "");
}

TEST(WriteInPlace, PreallocatedSpaceTakesItsWritesOnAFullImage) {
  TempDir tmp("ubtrfs-inplace-full");
  const std::string img = tmp.Sub("img");
  CommandResult mk = RunUbtrfs({"mkfs", "-q", "--size", "256M", img});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  std::string model;
  {
    std::unique_ptr<Filesystem> fs = ubtrfs_test::OpenWritable(img);
    ASSERT_NE(fs, nullptr);
    Filesystem& f = *fs;
    auto pre = f.Create(f.Root(), "pre", NewInode{0644});
    ASSERT_TRUE(pre.ok());
    ASSERT_TRUE(f.Fallocate(*pre, 0, 0, 40 * kMiB).ok());
    // Before any commit too: the extent is this transaction's.
    const std::string early = SeededBytes(kMiB, 1);
    ASSERT_TRUE(f.Write(*pre, 36 * kMiB, SpanOf(early)).ok());
    ASSERT_TRUE(f.Commit().ok());
    auto fill = f.Create(f.Root(), "fill", NewInode{0644});
    ASSERT_TRUE(fill.ok());
    const std::string chunk = SeededBytes(kMiB, 2);
    int full = 0;
    for (uint64_t off = 0; off < 512 * kMiB; off += kMiB) {
      auto n = f.Write(*fill, off, SpanOf(chunk));
      if (!n.ok()) {
        ASSERT_EQ(n.status().code(), ENOSPC) << n.status().ToString();
        full = 1;
        break;
      }
    }
    ASSERT_EQ(full, 1) << "the image never filled";
    ASSERT_TRUE(f.Commit().ok());

    model.assign(40 * kMiB, '\0');
    model.replace(36 * kMiB, early.size(), early);
    // The space fallocate reserved takes every write into it.
    for (uint64_t off = 0; off < 20 * kMiB; off += kMiB) {
      const std::string part = SeededBytes(kMiB, 100 + off / kMiB);
      auto n = f.Write(*pre, off, SpanOf(part));
      ASSERT_TRUE(n.ok()) << "write at " << off << ": " << n.status().ToString();
      model.replace(off, part.size(), part);
    }
    const std::string odd = "not a whole sector";
    auto n = f.Write(*pre, 30 * kMiB + 5, SpanOf(odd));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    model.replace(30 * kMiB + 5, odd.size(), odd);
    ASSERT_TRUE(f.Commit().ok());
  }
  Judge(img);
  ExpectFiles(tmp, img, {{"/pre", model}});
}

TEST(WriteInPlace, NodatacowFilesKeepTheirExtentsUnlessASnapshotSharesThem) {
  TempDir tmp("ubtrfs-inplace-nocow");
  const std::string src = tmp.Sub("src"), img = tmp.Sub("img");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((src + "/a").c_str(), 0755), 0);
  const std::string t0 = SeededBytes(kMiB, 7), f0 = SeededBytes(kMiB, 8);
  WriteHostFile(src + "/t", t0);
  WriteHostFile(src + "/a/f", f0);
  CommandResult mk = RunUbtrfs({"mkfs", "-q", "--size", "256M", "--rootdir", src, "--subvol", "rw:a", "--inode-flags",
                                "nodatacow:t", "--inode-flags", "nodatacow:a/f", img});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  InodeId t, af;
  {
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto a = (*fs)->Lookup("/t");
    auto b = (*fs)->Lookup("/a/f");
    ASSERT_TRUE(a.ok() && b.ok());
    t = *a;
    af = *b;
  }
  const auto t_before = DiskExtents(img, t), f_before = DiskExtents(img, af);
  ASSERT_FALSE(t_before.empty());
  ASSERT_FALSE(f_before.empty());
  const std::string patch = SeededBytes(300 * 1024, 9);
  std::string t1 = t0, f1 = f0;
  t1.replace(40960, patch.size(), patch);
  f1.replace(40960, patch.size(), patch);
  {
    std::unique_ptr<Filesystem> fs = ubtrfs_test::OpenWritable(img);
    ASSERT_NE(fs, nullptr);
    Filesystem& f = *fs;
    auto a = f.Lookup("/a");
    ASSERT_TRUE(a.ok());
    auto snap = f.CreateSnapshot(*a, f.Root(), "snap", true);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    ASSERT_TRUE(f.Write(t, 40960, SpanOf(patch)).ok());
    ASSERT_TRUE(f.Write(af, 40960, SpanOf(patch)).ok());
    ASSERT_TRUE(f.Commit().ok());
  }
  Judge(img);
  // Unshared: written where it lies. Shared with the snapshot: copied.
  EXPECT_EQ(DiskExtents(img, t), t_before);
  EXPECT_NE(DiskExtents(img, af), f_before);
  // /snap/f: the snapshot's copy keeps the bytes it had.
  ExpectFiles(tmp, img, {{"/t", t1}, {"/a/f", f1}, {"/snap/f", f0}});
}

// A clone shares an extent without a snapshot: another file's, or the same
// file's at another offset (one EXTENT_DATA_REF, counted twice, with another
// offset). A write into either copies, and the other keeps its bytes.
TEST(WriteInPlace, ClonedNodatacowExtentsAreCopiedOnWrite) {
  TempDir tmp("ubtrfs-inplace-clone");
  const std::string src = tmp.Sub("src"), img = tmp.Sub("img");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  const std::string c0 = SeededBytes(kMiB, 11), e0 = SeededBytes(kMiB, 13);
  WriteHostFile(src + "/c", c0);
  WriteHostFile(src + "/e", e0);
  WriteHostFile(src + "/d", "");
  CommandResult mk = RunUbtrfs({"mkfs", "-q", "--size", "256M", "--rootdir", src, "--inode-flags", "nodatacow:c",
                                "--inode-flags", "nodatacow:d", "--inode-flags", "nodatacow:e", img});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  const std::string patch = SeededBytes(64 * 1024, 12);
  std::string c1 = c0 + c0, e1 = e0;
  {
    std::unique_ptr<Filesystem> fs = ubtrfs_test::OpenWritable(img);
    ASSERT_NE(fs, nullptr);
    Filesystem& f = *fs;
    auto c = f.Lookup("/c");
    auto d = f.Lookup("/d");
    auto e = f.Lookup("/e");
    ASSERT_TRUE(c.ok() && d.ok() && e.ok());
    ASSERT_TRUE(f.Clone(*c, 0, *c, kMiB, kMiB).ok());  // /c's extent twice in /c
    ASSERT_TRUE(f.Clone(*e, 0, *d, 0, kMiB).ok());     // /e's extent in /d too
    ASSERT_TRUE(f.Commit().ok());
    ASSERT_TRUE(f.Write(*c, 4096, SpanOf(patch)).ok());
    ASSERT_TRUE(f.Write(*e, 4096, SpanOf(patch)).ok());
    c1.replace(4096, patch.size(), patch);
    e1.replace(4096, patch.size(), patch);
    ASSERT_TRUE(f.Commit().ok());
  }
  Judge(img);
  // /c's second MiB is the clone within the file, /d the clone of /e: both
  // keep the bytes they had.
  ExpectFiles(tmp, img, {{"/c", c1}, {"/e", e1}, {"/d", e0}});
}

}  // namespace UBTRFS_UNITY_ID
