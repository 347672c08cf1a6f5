// Block groups left empty are deleted with their chunks (txn/unused_groups.cc),
// as the kernel's btrfs_delete_unused_bgs: the device space they held goes
// back to the unallocated pool, where data and metadata can both have it.
// Each test reads the layout back (chunk items, dev extents, DEV_ITEM
// bytes_used), and `ubtrfs check`, `btrfs check` and, where loop mounts
// work, the kernel judge the images.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "format/ondisk.h"
#include "io/block_device.h"
#include "support/array_mount.h"
#include "support/chunk_layout.h"
#include "support/mkfs_util.h"
#include "support/open_txn.h"
#include "support/test_util.h"
#include "tree/cursor.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

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
using ubtrfs_test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

std::string UbtrfsCheck(const std::string& img) {
  auto r = RunCommand({UBTRFS_CLI_PATH, "check", img});
  return r.ok() ? "" : r.Describe();
}

std::vector<uint8_t> Pattern(uint64_t len, uint64_t seed) {
  std::vector<uint8_t> v(len);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

std::vector<uint8_t> HostFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Writes a file through a kernel mount; false if any of it failed.
bool WriteHostFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  return out.good();
}

NewInode Attrs() {
  NewInode a;
  a.mode = 0644;
  return a;
}

// Writes `len` bytes of Pattern(seed) in 1 MiB pieces; the bytes written
// before the first failure, which goes to *failure.
uint64_t WriteFile(Filesystem& fs, InodeId id, uint64_t len, uint64_t seed, Status* failure) {
  const std::vector<uint8_t> bytes = Pattern(len, seed);
  uint64_t done = 0;
  *failure = Status::Ok();
  while (done < len) {
    const uint64_t n = std::min<uint64_t>(kMiB, len - done);
    auto w = fs.Write(id, done, std::span(bytes).subspan(done, n));
    if (!w.ok()) {
      *failure = w.status();
      break;
    }
    done += *w;
  }
  return done;
}

// Files f0, f1, ... of `len` bytes each (Pattern(len, i)) in the top
// directory, with a commit after each where asked.
void WriteNumberedFiles(Filesystem& fs, int n, uint64_t len, bool commit_each) {
  for (int i = 0; i < n; ++i) {
    auto id = fs.Create(fs.Root(), "f" + std::to_string(i), Attrs());
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    Status failure;
    ASSERT_EQ(WriteFile(fs, *id, len, i, &failure), len) << failure.ToString();
    if (commit_each) {
      ASSERT_TRUE(fs.Commit().ok());
    }
  }
}

bool ReadsBack(Filesystem& fs, const std::string& name, uint64_t len, uint64_t seed) {
  auto id = fs.LookupChild(fs.Root(), name);
  if (!id.ok()) return false;
  std::vector<uint8_t> buf(len + 1);
  auto n = fs.Read(*id, 0, buf);
  if (!n.ok() || *n != len) return false;
  buf.resize(len);
  return buf == Pattern(len, seed);
}

std::string MakeUbtrfsImage(const TempDir& dir, const std::string& size) {
  const std::string img = dir.Sub("img");
  auto r = RunCommand({UBTRFS_CLI_PATH, "mkfs", "--size", size, img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  return img;
}

// Three files over several data chunks, all deleted: the commit that frees
// their extents deletes every data group but one. The kernel then uses the
// space given back, and both checkers agree with the result.
TEST(UnusedGroups, DeletedFilesGiveTheirDataChunksBack) {
  TempDir dir("ubtrfs-unused");
  const std::string img = MakeUbtrfsImage(dir, "256M");
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    ASSERT_NO_FATAL_FAILURE(WriteNumberedFiles(*fs, 3, 30 * kMiB, /*commit_each=*/true));
  }
  const Layout full = ReadLayout(img);
  ASSERT_GE(full.Count(kBlockGroupData), 3) << full.Describe();  // mkfs: 64 MiB, new ones: 25 MiB
  ExpectConsistent(full, "filled");
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(fs->Unlink(fs->Root(), "f" + std::to_string(i)).ok());
    ASSERT_TRUE(fs->Commit().ok());
    // The commit that freed the extents deleted the groups: nothing is left
    // for the close.
    const Layout after = ReadLayout(img);
    EXPECT_EQ(after.Count(kBlockGroupData), 1) << after.Describe();
    EXPECT_EQ(after.Count(kBlockGroupMetadata), full.Count(kBlockGroupMetadata)) << after.Describe();
    EXPECT_EQ(after.Count(kBlockGroupSystem), full.Count(kBlockGroupSystem)) << after.Describe();
    ExpectConsistent(after, "emptied");
    EXPECT_LE(after.dev_bytes_used + 2 * 25 * kMiB, full.dev_bytes_used);
  }
  EXPECT_EQ(UbtrfsCheck(img), "");
  EXPECT_EQ(BtrfsCheck(img), "");
  // New chunks for new data take the device space given back.
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    auto id = fs->Create(fs->Root(), "again", Attrs());
    ASSERT_TRUE(id.ok());
    Status failure;
    ASSERT_EQ(WriteFile(*fs, *id, 150 * kMiB, 7, &failure), 150 * kMiB) << failure.ToString();
    ASSERT_TRUE(fs->Commit().ok());
  }
  ExpectConsistent(ReadLayout(img), "written again");
  EXPECT_EQ(UbtrfsCheck(img), "");
  EXPECT_EQ(BtrfsCheck(img), "");

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    GTEST_LOG_(INFO) << "kernel part skipped: loop mounts unavailable: " << why;
    return;
  }
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    EXPECT_TRUE(HostFile(mnt + "/again") == Pattern(150 * kMiB, 7)) << "the kernel reads another file";
    ASSERT_TRUE(WriteHostFile(mnt + "/kernel", Pattern(20 * kMiB, 8))) << "the kernel's write failed";
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  EXPECT_EQ(UbtrfsCheck(img), "");
  auto fs = ubtrfs_test::OpenWritable(img);
  ASSERT_TRUE(fs);
  EXPECT_TRUE(ReadsBack(*fs, "kernel", 20 * kMiB, 8));
}

// The case of session 41: data took the whole device, the data was
// deleted, and then metadata needed a chunk of its own. It gets one; and
// once the files that needed it are gone too, their metadata chunks go
// back to data.
TEST(UnusedGroups, DeviceSpaceMovesBetweenDataAndMetadata) {
  TempDir dir("ubtrfs-unused");
  const std::string img = MakeUbtrfsImage(dir, "256M");
  auto fs = ubtrfs_test::OpenWritable(img);
  ASSERT_TRUE(fs);
  // Data to ENOSPC.
  uint64_t big = 0;
  {
    auto id = fs->Create(fs->Root(), "big", Attrs());
    ASSERT_TRUE(id.ok());
    Status failure;
    big = WriteFile(*fs, *id, 400 * kMiB, 1, &failure);
    ASSERT_EQ(failure.code(), ENOSPC) << failure.ToString();
    ASSERT_GE(big, 150 * kMiB);
    ASSERT_TRUE(fs->Commit().ok());
  }
  const int meta_full = ReadLayout(img).Count(kBlockGroupMetadata);
  ASSERT_TRUE(fs->Unlink(fs->Root(), "big").ok());
  ASSERT_TRUE(fs->Commit().ok());
  EXPECT_EQ(ReadLayout(img).Count(kBlockGroupData), 1) << ReadLayout(img).Describe();
  // Small files (inline: metadata only) until metadata has two chunks more.
  auto d = fs->Mkdir(fs->Root(), "small", NewInode{.mode = 0755});
  ASSERT_TRUE(d.ok());
  const std::vector<uint8_t> body = Pattern(2000, 3);
  int files = 0;
  for (; files < 200000 && ReadLayout(img).Count(kBlockGroupMetadata) < meta_full + 2; files += 2000) {
    for (int i = files; i < files + 2000; ++i) {
      auto id = fs->Create(*d, std::to_string(i), Attrs());
      ASSERT_TRUE(id.ok()) << "file " << i << ": " << id.status().ToString();
      auto w = fs->Write(*id, 0, body);
      ASSERT_TRUE(w.ok()) << "file " << i << ": " << w.status().ToString();
    }
    ASSERT_TRUE(fs->Commit().ok());
  }
  const Layout meta = ReadLayout(img);
  ASSERT_GE(meta.Count(kBlockGroupMetadata), meta_full + 2) << files << " files: " << meta.Describe();
  ExpectConsistent(meta, "metadata grown");
  EXPECT_EQ(UbtrfsCheck(img), "");
  EXPECT_EQ(BtrfsCheck(img), "");
  // Gone again: metadata shrinks to what is left, and data gets the room.
  // (In batches, as they were made: blocks that one transaction copies
  // land in whichever group has room, so a group is empty only once every
  // block in it was freed.)
  for (int i = 0; i < files; ++i) {
    ASSERT_TRUE(fs->Unlink(*d, std::to_string(i)).ok()) << i;
    if (i % 2000 == 1999) {
      ASSERT_TRUE(fs->Commit().ok());
    }
  }
  ASSERT_TRUE(fs->Commit().ok());
  const Layout emptied = ReadLayout(img);
  EXPECT_LT(emptied.Count(kBlockGroupMetadata), meta.Count(kBlockGroupMetadata)) << emptied.Describe();
  ExpectConsistent(emptied, "metadata emptied");
  {
    auto id = fs->Create(fs->Root(), "big2", Attrs());
    ASSERT_TRUE(id.ok());
    Status failure;
    const uint64_t big2 = WriteFile(*fs, *id, 400 * kMiB, 2, &failure);
    ASSERT_EQ(failure.code(), ENOSPC) << failure.ToString();
    EXPECT_GE(big2 + 8 * kMiB, big) << "the metadata chunks' space did not come back";
    ASSERT_TRUE(fs->Commit().ok());
    EXPECT_TRUE(ReadsBack(*fs, "big2", big2, 2));
  }
  fs.reset();
  ExpectConsistent(ReadLayout(img), "refilled");
  EXPECT_EQ(UbtrfsCheck(img), "");
  EXPECT_EQ(BtrfsCheck(img), "");
}

// An image mkfs.btrfs made (block group items in the extent tree) and the
// kernel filled: ubtrfs deletes the files and the groups, the kernel mounts
// the result and writes again.
TEST(UnusedGroups, KernelWrittenImage) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  TempDir dir("ubtrfs-unused");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 16384, "", 384 * kMiB), "");
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(WriteHostFile(mnt + "/k" + std::to_string(i), Pattern(50 * kMiB, 10 + i)));
    }
    ASSERT_EQ(m.Unmount(), "");
  }
  const Layout kernel = ReadLayout(img);
  ASSERT_GE(kernel.Count(kBlockGroupData), 3) << kernel.Describe();
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(fs->Unlink(fs->Root(), "k" + std::to_string(i)).ok());
  }  // the close commits
  const Layout after = ReadLayout(img);
  EXPECT_LT(after.Count(kBlockGroupData), kernel.Count(kBlockGroupData)) << after.Describe();
  ExpectConsistent(after, "after ubtrfs");
  EXPECT_EQ(UbtrfsCheck(img), "");
  EXPECT_EQ(BtrfsCheck(img), "");
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    EXPECT_TRUE(HostFile(mnt + "/k3") == Pattern(50 * kMiB, 13));
    ASSERT_TRUE(WriteHostFile(mnt + "/again", Pattern(150 * kMiB, 20))) << "the kernel's write failed";
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  auto fs = ubtrfs_test::OpenWritable(img);
  ASSERT_TRUE(fs);
  EXPECT_TRUE(ReadsBack(*fs, "again", 150 * kMiB, 20));
}

// RAID1 over two devices: each deleted chunk gives back a stripe on both,
// and each device's DEV_ITEM follows. The kernel mounts the pair and
// writes where the chunks were.
TEST(UnusedGroups, MirroredOverTwoDevices) {
  TempDir dir("ubtrfs-unused");
  std::vector<std::string> images{dir.Sub("d1.img"), dir.Sub("d2.img")};
  for (const auto& img : images) {
    std::string err;
    ASSERT_TRUE(ubtrfs_test::MakeSparseFile(img, 320 * kMiB, &err)) << err;
  }
  std::vector<std::string> args{UBTRFS_CLI_PATH, "mkfs", "-q", "-f", "-d", "raid1", "-m", "raid1"};
  args.insert(args.end(), images.begin(), images.end());
  auto r = RunCommand(args);
  ASSERT_TRUE(r.ok()) << r.Describe();
  const std::string joined = ubtrfs_test::JoinDevices(images);
  {
    auto fs = Filesystem::Open(joined, OpenOptions{.writable = true});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ASSERT_NO_FATAL_FAILURE(WriteNumberedFiles(**fs, 3, 50 * kMiB, /*commit_each=*/true));
  }
  const Layout full = ReadLayout(images);
  ASSERT_GE(full.Count(kBlockGroupData), 3) << full.Describe();
  ExpectConsistent(full, "filled");
  {
    auto fs = Filesystem::Open(joined, OpenOptions{.writable = true});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    for (int i = 0; i < 2; ++i) ASSERT_TRUE((*fs)->Unlink((*fs)->Root(), "f" + std::to_string(i)).ok());
    ASSERT_TRUE((*fs)->Commit().ok());
    EXPECT_TRUE(ReadsBack(**fs, "f2", 50 * kMiB, 2));
  }
  const Layout after = ReadLayout(images);
  EXPECT_LT(after.Count(kBlockGroupData), full.Count(kBlockGroupData)) << after.Describe();
  ExpectConsistent(after, "emptied");
  EXPECT_EQ(after.stripes, 2 * after.chunks.size()) << after.Describe();  // RAID1 everywhere
  EXPECT_EQ(UbtrfsCheck(joined), "");

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    GTEST_LOG_(INFO) << "kernel part skipped: loop mounts unavailable: " << why;
    return;
  }
  auto check = ubtrfs_test::ArrayMount::CheckOnce(images);
  EXPECT_TRUE(check.ok()) << check.Describe();
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  {
    ubtrfs_test::ArrayMount m;
    ASSERT_EQ(m.Mount(images, mnt), "");
    EXPECT_TRUE(HostFile(mnt + "/f2") == Pattern(50 * kMiB, 2));
    ASSERT_TRUE(WriteHostFile(mnt + "/kernel", Pattern(120 * kMiB, 9))) << "the kernel's write failed";
    m.Unmount();
  }
  check = ubtrfs_test::ArrayMount::CheckOnce(images);
  EXPECT_TRUE(check.ok()) << check.Describe();
  auto fs = Filesystem::Open(joined);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_TRUE(ReadsBack(**fs, "kernel", 120 * kMiB, 9));
}

// A damaged image: the dev extent of a group that empties is gone. That
// group stays (the commit does not fail on it), the others go, and
// `ubtrfs check` still names the damage.
TEST(UnusedGroups, AGroupWithItemsMissingStays) {
  TempDir dir("ubtrfs-unused");
  const std::string img = MakeUbtrfsImage(dir, "256M");
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    ASSERT_NO_FATAL_FAILURE(WriteNumberedFiles(*fs, 3, 30 * kMiB, /*commit_each=*/false));
  }
  const Layout full = ReadLayout(img);
  ASSERT_GE(full.Count(kBlockGroupData), 3) << full.Describe();
  uint64_t damaged = 0;
  {
    auto o = ubtrfs_test::OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    for (const auto& [logical, c] : o->vol->chunks().chunks()) {
      if (!(c.type & kBlockGroupData)) continue;
      damaged = logical;
      auto w = o->txn->Writer(kDevTreeObjectid);
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE((*w)->Delete(Key{c.stripes[0].devid, kDevExtentKey, c.stripes[0].physical}).ok());
      break;
    }
    ASSERT_TRUE(o->txn->Commit().ok());
  }
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(fs->Unlink(fs->Root(), "f" + std::to_string(i)).ok());
    Status st = fs->Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  const Layout after = ReadLayout(img);
  EXPECT_EQ(after.Count(kBlockGroupData), 1) << after.Describe();
  EXPECT_EQ(after.chunks.count(damaged), 1u) << after.Describe();
  auto r = RunCommand({UBTRFS_CLI_PATH, "check", img});
  EXPECT_FALSE(r.ok()) << r.Describe();
  EXPECT_NE((r.out + r.err).find(std::to_string(damaged)), std::string::npos) << r.Describe();
}

}  // namespace UBTRFS_UNITY_ID
