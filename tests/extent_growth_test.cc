// Sequential writes grow one extent (up to 128 MiB) instead of adding one
// per write, as the kernel's delayed allocation gives: the file's extent
// items as btrfs-progs prints them, btrfs check clean, the content read
// back by ubtrfs and (where loop mounts work) by the kernel. And where
// growing would be wrong -- a clone or a split of the extent in the same
// transaction, a commit in between, another file's extent in the way --
// the write starts an extent of its own.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::LoopMount;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

struct Extent {
  uint64_t file_off, disk, disk_len, offset, len;
};

std::string MakeImage(const TempDir& dir, const std::string& name = "img") {
  const std::string img = dir.Sub(name);
  EXPECT_EQ(ubtrfs_test::RunMkfs(img, "", 0, "", 1ull << 30), "");
  return img;
}


// The regular extents of inode `ino` of the top subvolume, as btrfs-progs
// reads them from the image.
std::vector<Extent> ExtentsOf(const std::string& img, uint64_t ino) {
  auto dump = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "5", img});
  EXPECT_TRUE(dump.ok()) << dump.Describe();
  static const std::regex kItem(
      R"(\((\d+) EXTENT_DATA (\d+)\)[^\n]*\n[^\n]*type 1 \(regular\)\n\s*extent data disk byte (\d+) nr (\d+)\n\s*extent data offset (\d+) nr (\d+))");
  std::vector<Extent> out;
  for (std::sregex_iterator it(dump.out.begin(), dump.out.end(), kItem), end; it != end; ++it) {
    if (std::stoull((*it)[1].str()) != ino) continue;
    out.push_back(Extent{std::stoull((*it)[2].str()), std::stoull((*it)[3].str()), std::stoull((*it)[4].str()),
                         std::stoull((*it)[5].str()), std::stoull((*it)[6].str())});
  }
  return out;
}

std::vector<uint8_t> Pattern(uint64_t off, uint64_t len, uint64_t seed) {
  std::vector<uint8_t> v(len);
  for (uint64_t i = 0; i < len; ++i) {
    const uint64_t x = (off + i) / 8 * 0x9e3779b97f4a7c15ull + seed;
    v[i] = static_cast<uint8_t>(x >> (8 * ((off + i) % 8)));
  }
  return v;
}

void WriteSeq(Filesystem& fs, InodeId f, uint64_t from, uint64_t len, uint64_t piece, uint64_t seed) {
  for (uint64_t at = from; at < from + len; at += piece) {
    const auto data = Pattern(at, std::min(piece, from + len - at), seed);
    auto n = fs.Write(f, at, data);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
  }
}

void ExpectContent(Filesystem& fs, InodeId f, const std::vector<uint8_t>& want) {
  std::vector<uint8_t> got(want.size() + 1);
  auto n = fs.Read(f, 0, got);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  ASSERT_EQ(*n, want.size());
  got.resize(*n);
  EXPECT_TRUE(got == want);
}

bool HaveTools() { return !ubtrfs_test::FindProgram("mkfs.btrfs").empty(); }

// One large write's checksums go into items no larger than the kernel
// allows ("csum too large" to btrfs check otherwise): the limit is a leaf
// less two item headers and one checksum, which a 4 KiB node or a 32-byte
// checksum reaches before the 1024 sums an item holds at most here.
TEST(ExtentGrowth, ChecksumItemsOfALargeWriteFitTheKernelsLimit) {
  if (!HaveTools()) GTEST_SKIP() << "mkfs.btrfs not installed";
  TempDir dir("ubtrfs-growth");
  for (const auto& [nodesize, csum] : std::vector<std::pair<uint32_t, std::string>>{{4096, "crc32c"},
                                                                                      {16384, "sha256"}}) {
    SCOPED_TRACE(std::to_string(nodesize) + " " + csum);
    const std::string img = dir.Sub("img-" + csum);
    ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", nodesize, csum, 1ull << 30), "");
    {
      OpenOptions o;
      o.writable = true;
      auto fs = Filesystem::Open(img, o);
      ASSERT_TRUE(fs.ok()) << fs.status().ToString();
      auto f = (*fs)->Create((*fs)->Root(), "f", NewInode{0644});
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      WriteSeq(**fs, *f, 0, 8 * kMiB, 8 * kMiB, 3);
      ASSERT_TRUE((*fs)->Commit().ok());
    }
    EXPECT_EQ(BtrfsCheck(img), "");
  }
}

TEST(ExtentGrowth, SequentialWritesInOneTransactionMakeOneExtent) {
  if (!HaveTools()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-extgrow");
  const std::string img = MakeImage(dir);
  std::vector<uint8_t> want;
  uint64_t ino = 0;
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    NewInode a;
    a.mode = 0100644;
    auto f = fs->Create(fs->Root(), "seq", a);
    ASSERT_TRUE(f.ok());
    ino = f->ino;
    // 40 MiB in 1 MiB writes, then 64 KiB writes (the mount's size), then a
    // tail that is not whole sectors.
    WriteSeq(*fs, *f, 0, 40 * kMiB, kMiB, 1);
    WriteSeq(*fs, *f, 40 * kMiB, 4 * kMiB, 64 * kKiB, 1);
    const auto tail = Pattern(44 * kMiB, 1000, 1);
    ASSERT_TRUE(fs->Write(*f, 44 * kMiB, tail).ok());
    want = Pattern(0, 44 * kMiB + 1000, 1);
    ExpectContent(*fs, *f, want);
    ASSERT_TRUE(fs->Commit().ok());
  }
  const auto ex = ExtentsOf(img, ino);
  ASSERT_FALSE(ex.empty());
  // The first 44 MiB are one extent unless a block group ends inside them;
  // the unaligned tail is rewritten through a buffer and may stand alone.
  std::string layout;
  for (const Extent& e : ex) layout += " [" + std::to_string(e.file_off) + ", +" + std::to_string(e.len) + ")";
  // 108 writes: one extent per block group the data lies in (a 1 GiB
  // mkfs.btrfs image starts with an 8 MiB data group), and the unaligned
  // tail, rewritten through a buffer, on its own.
  EXPECT_LE(ex.size(), 3u) << layout;
  EXPECT_EQ(ex[0].file_off, 0u);
  for (const Extent& e : ex) {
    EXPECT_EQ(e.offset, 0u);
    EXPECT_EQ(e.len, e.disk_len);
    EXPECT_LE(e.len, 128 * kMiB);
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  auto fs = Filesystem::Open(img, OpenOptions{});
  ASSERT_TRUE(fs.ok());
  auto f = (*fs)->Lookup("/seq");
  ASSERT_TRUE(f.ok());
  ExpectContent(**fs, *f, want);
}

TEST(ExtentGrowth, NoExtentGrowsPast128MiB) {
  if (!HaveTools()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-extgrow-max");
  const std::string img = MakeImage(dir);
  uint64_t ino = 0;
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    NewInode a;
    a.mode = 0100644;
    auto f = fs->Create(fs->Root(), "big", a);
    ASSERT_TRUE(f.ok());
    ino = f->ino;
    WriteSeq(*fs, *f, 0, 300 * kMiB, 4 * kMiB, 2);
    ASSERT_TRUE(fs->Commit().ok());
  }
  const auto ex = ExtentsOf(img, ino);
  uint64_t total = 0;
  for (const Extent& e : ex) {
    EXPECT_LE(e.len, 128 * kMiB);
    total += e.len;
  }
  EXPECT_EQ(total, 300 * kMiB);
  EXPECT_LE(ex.size(), 8u) << "300 MiB in " << ex.size() << " extents";
  EXPECT_EQ(BtrfsCheck(img), "");
}

// Where the extent must not grow: after a commit, after a clone of it, after
// an overwrite that split it, and when another file's extent follows it.
TEST(ExtentGrowth, StopsWhereGrowingWouldBeWrong) {
  if (!HaveTools()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-extgrow-stop");
  const std::string img = MakeImage(dir);
  std::vector<uint8_t> want_a, want_b, want_c, want_d;
  uint64_t ia = 0, ib = 0, ic = 0, id = 0;
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    NewInode attrs;
    attrs.mode = 0100644;
    auto a = fs->Create(fs->Root(), "a", attrs), b = fs->Create(fs->Root(), "b", attrs),
         c = fs->Create(fs->Root(), "c", attrs), d = fs->Create(fs->Root(), "d", attrs);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
    ia = a->ino, ib = b->ino, ic = c->ino, id = d->ino;
    // a: 4 MiB, commit, 4 MiB more: two extents.
    WriteSeq(*fs, *a, 0, 4 * kMiB, kMiB, 3);
    ASSERT_TRUE(fs->Commit().ok());
    WriteSeq(*fs, *a, 4 * kMiB, 4 * kMiB, kMiB, 3);
    want_a = Pattern(0, 8 * kMiB, 3);
    // b: 2 MiB cloned into c, then b grows: b's first extent is c's too.
    WriteSeq(*fs, *b, 0, 2 * kMiB, kMiB, 4);
    ASSERT_TRUE(fs->Clone(*b, 0, *c, 0, 2 * kMiB).ok());
    WriteSeq(*fs, *b, 2 * kMiB, 2 * kMiB, kMiB, 4);
    want_b = Pattern(0, 4 * kMiB, 4);
    want_c = Pattern(0, 2 * kMiB, 4);
    // d: 2 MiB, 64 KiB in the middle rewritten (the extent is split), more
    // appended.
    WriteSeq(*fs, *d, 0, 2 * kMiB, kMiB, 5);
    const auto mid = Pattern(kMiB, 64 * kKiB, 6);
    ASSERT_TRUE(fs->Write(*d, kMiB, mid).ok());
    WriteSeq(*fs, *d, 2 * kMiB, 2 * kMiB, kMiB, 5);
    want_d = Pattern(0, 4 * kMiB, 5);
    std::memcpy(want_d.data() + kMiB, mid.data(), mid.size());
    ExpectContent(*fs, *a, want_a);
    ExpectContent(*fs, *b, want_b);
    ExpectContent(*fs, *c, want_c);
    ExpectContent(*fs, *d, want_d);
    ASSERT_TRUE(fs->Commit().ok());
  }
  const auto ea = ExtentsOf(img, ia), eb = ExtentsOf(img, ib), ec = ExtentsOf(img, ic), ed = ExtentsOf(img, id);
  ASSERT_EQ(ea.size(), 2u);
  EXPECT_EQ(ea[0].len, 4 * kMiB);
  EXPECT_EQ(ea[1].len, 4 * kMiB);
  ASSERT_EQ(ec.size(), 1u);
  ASSERT_GE(eb.size(), 2u);
  EXPECT_EQ(eb[0].disk, ec[0].disk);
  EXPECT_EQ(eb[0].disk_len, 2 * kMiB);  // shared: not grown under c
  for (const Extent& e : ed) EXPECT_LE(e.disk_len, 2 * kMiB) << "d's split extent grew";
  EXPECT_EQ(BtrfsCheck(img), "");
  auto fs = Filesystem::Open(img, OpenOptions{});
  ASSERT_TRUE(fs.ok());
  for (const auto& [name, want] : {std::pair{"/a", &want_a}, {"/b", &want_b}, {"/c", &want_c}, {"/d", &want_d}}) {
    auto f = (*fs)->Lookup(name);
    ASSERT_TRUE(f.ok()) << name;
    ExpectContent(**fs, *f, *want);
  }
}

// Two files written in turns: each write finds the other file's extent
// after its own, so neither grows into it; content and check hold. The
// kernel reads both back equal.
TEST(ExtentGrowth, InterleavedFilesKeepTheirOwnExtents) {
  if (!HaveTools()) GTEST_SKIP() << "btrfs-progs not installed";
  TempDir dir("ubtrfs-extgrow-inter");
  const std::string img = MakeImage(dir);
  {
    auto fs = ubtrfs_test::OpenWritable(img);
    ASSERT_TRUE(fs);
    NewInode attrs;
    attrs.mode = 0100644;
    auto x = fs->Create(fs->Root(), "x", attrs), y = fs->Create(fs->Root(), "y", attrs);
    ASSERT_TRUE(x.ok() && y.ok());
    for (uint64_t at = 0; at < 16 * kMiB; at += kMiB) {
      ASSERT_TRUE(fs->Write(*x, at, Pattern(at, kMiB, 7)).ok());
      ASSERT_TRUE(fs->Write(*y, at, Pattern(at, kMiB, 8)).ok());
    }
    ASSERT_TRUE(fs->Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string mnt = dir.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  for (const auto& [name, seed] : {std::pair{"x", 7}, {"y", 8}}) {
    std::ifstream in(mnt + "/" + name, std::ios::binary);
    std::vector<uint8_t> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(got == Pattern(0, 16 * kMiB, seed)) << name;
  }
  ASSERT_EQ(m.Unmount(), "");
}

}  // namespace
