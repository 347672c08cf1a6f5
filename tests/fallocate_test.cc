// Filesystem::Fallocate: preallocated extents (mode 0 and KEEP_SIZE), punched
// holes, zeroed ranges. Content and sizes through ubtrfs's read path, btrfs
// check clean, and -- where loop mounts work -- the kernel's view of our
// image (size, content, st_blocks, extent layout with the unwritten flag)
// equal to what the kernel itself makes of the same calls on its own mount.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
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

// One step of a scenario: a fallocate or a write of `fill` bytes.
struct Step {
  bool write;
  int mode;
  uint64_t off, len;
  uint8_t fill = 0;
};

std::string MakeImage(const TempDir& dir, const std::string& name) {
  const std::string img = dir.Sub(name);
  EXPECT_TRUE(RunCommand({"truncate", "-s", "512M", img}).ok());
  auto r = RunCommand({"mkfs.btrfs", "-q", "-f", img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  return img;
}

Status ApplyToImage(Filesystem& fs, InodeId f, const Step& s) {
  if (s.write) {
    std::vector<uint8_t> data(s.len, s.fill);
    auto n = fs.Write(f, s.off, data);
    return n.status();
  }
  return fs.Fallocate(f, s.mode, s.off, s.len);
}

int ApplyToHost(int fd, const Step& s) {
  if (s.write) {
    std::vector<uint8_t> data(s.len, s.fill);
    return pwrite(fd, data.data(), s.len, static_cast<off_t>(s.off)) == static_cast<ssize_t>(s.len) ? 0 : errno;
  }
  return fallocate(fd, s.mode, static_cast<off_t>(s.off), static_cast<off_t>(s.len)) == 0 ? 0 : errno;
}

// What the kernel shows of one file.
struct View {
  uint64_t size = 0, blocks = 0;
  std::string content;
  // (logical start, length, unwritten), logically adjacent extents of the
  // same kind merged (physical placement may differ).
  std::vector<std::tuple<uint64_t, uint64_t, bool>> extents;
};

View Look(const std::string& path) {
  View v;
  int fd = open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return v;
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  v.size = static_cast<uint64_t>(st.st_size);
  v.blocks = static_cast<uint64_t>(st.st_blocks);
  v.content.resize(v.size);
  EXPECT_EQ(pread(fd, v.content.data(), v.size, 0), static_cast<ssize_t>(v.size));
  std::vector<uint8_t> buf(sizeof(fiemap) + 512 * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(buf.data());
  fm->fm_start = 0;
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = 512;
  EXPECT_EQ(ioctl(fd, FS_IOC_FIEMAP, fm), 0) << strerror(errno);
  for (uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
    const fiemap_extent& e = fm->fm_extents[i];
    const bool unwritten = e.fe_flags & FIEMAP_EXTENT_UNWRITTEN;
    if (!v.extents.empty()) {
      auto& [s, l, u] = v.extents.back();
      if (u == unwritten && s + l == e.fe_logical) {
        l += e.fe_length;
        continue;
      }
    }
    v.extents.emplace_back(e.fe_logical, e.fe_length, unwritten);
  }
  close(fd);
  return v;
}

std::string Describe(const View& v) {
  std::string s = "size " + std::to_string(v.size) + ", blocks " + std::to_string(v.blocks) + ", extents";
  for (const auto& [a, l, u] : v.extents) {
    s += " [" + std::to_string(a) + "+" + std::to_string(l) + (u ? " unwritten]" : "]");
  }
  return s;
}

Stat StatOf(Filesystem& fs, InodeId id) {
  auto st = fs.GetStat(id);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  return st.ok() ? *st : Stat{};
}

std::string ReadAll(Filesystem& fs, InodeId id) {
  const Stat st = StatOf(fs, id);
  std::string out(st.size, '\0');
  auto n = fs.Read(id, 0, std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  if (n.ok()) out.resize(*n);
  return out;
}

// The library's own view: sizes, nbytes and content after each kind of call.
TEST(Fallocate, LibrarySemantics) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-falloc");
  const std::string img = MakeImage(dir, "img");
  {
    OpenOptions o;
    o.writable = true;
    auto fs = Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    Filesystem& f = **fs;
    auto id = f.Create(f.Root(), "a", NewInode{0644});
    ASSERT_TRUE(id.ok());

    // Mode 0: size grows, space is counted, the range reads as zeros.
    ASSERT_TRUE(f.Fallocate(*id, 0, 0, 1 * kMiB + 100).ok());
    Stat st = StatOf(f, *id);
    EXPECT_EQ(st.size, 1 * kMiB + 100);
    EXPECT_EQ(st.nbytes, 1 * kMiB + 4 * kKiB);
    EXPECT_TRUE(st.flags & 0x10) << "PREALLOC inode flag";
    EXPECT_EQ(ReadAll(f, *id), std::string(1 * kMiB + 100, '\0'));

    // A write into the preallocated range: that part reads back, the rest
    // stays zero, nothing more is counted.
    std::vector<uint8_t> data(10000, 0x5a);
    ASSERT_TRUE(f.Write(*id, 70000, data).ok());
    std::string want(1 * kMiB + 100, '\0');
    std::memset(want.data() + 70000, 0x5a, 10000);
    EXPECT_EQ(ReadAll(f, *id), want);
    EXPECT_EQ(StatOf(f, *id).nbytes, 1 * kMiB + 4 * kKiB);

    // KEEP_SIZE past the end: more space, same size.
    ASSERT_TRUE(f.Fallocate(*id, FALLOC_FL_KEEP_SIZE, 2 * kMiB, 1 * kMiB).ok());
    st = StatOf(f, *id);
    EXPECT_EQ(st.size, 1 * kMiB + 100);
    EXPECT_EQ(st.nbytes, 2 * kMiB + 4 * kKiB);
    // Allocating what is allocated changes nothing.
    ASSERT_TRUE(f.Fallocate(*id, FALLOC_FL_KEEP_SIZE, 0, 3 * kMiB).ok());
    EXPECT_EQ(StatOf(f, *id).nbytes, 3 * kMiB);

    // A punched hole, unaligned at both ends: the written bytes inside go.
    ASSERT_TRUE(f.Fallocate(*id, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 72000, 20000).ok());
    std::memset(want.data() + 72000, 0, 20000);
    EXPECT_EQ(ReadAll(f, *id), want);
    st = StatOf(f, *id);
    EXPECT_EQ(st.size, 1 * kMiB + 100);
    EXPECT_LT(st.nbytes, 3 * kMiB);

    // Zero range with growth.
    ASSERT_TRUE(f.Fallocate(*id, FALLOC_FL_ZERO_RANGE, 69000, 4 * kMiB).ok());
    std::memset(want.data() + 69000, 0, want.size() - 69000);
    want.resize(69000 + 4 * kMiB, '\0');
    EXPECT_EQ(ReadAll(f, *id), want);
    EXPECT_EQ(StatOf(f, *id).size, 69000 + 4 * kMiB);

    // Small (inline) files become regular when space is allocated.
    auto small = f.Create(f.Root(), "small", NewInode{0644});
    ASSERT_TRUE(small.ok());
    const std::string hello = "hello, inline world";
    ASSERT_TRUE(f.Write(*small, 0, std::span(reinterpret_cast<const uint8_t*>(hello.data()), hello.size())).ok());
    ASSERT_TRUE(f.Fallocate(*small, 0, 0, 64 * kKiB).ok());
    std::string swant = hello + std::string(64 * kKiB - hello.size(), '\0');
    EXPECT_EQ(ReadAll(f, *small), swant);
    ASSERT_TRUE(f.Fallocate(*small, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 2, 3).ok());
    std::memset(swant.data() + 2, 0, 3);
    EXPECT_EQ(ReadAll(f, *small), swant);

    // What is refused, and how.
    EXPECT_EQ(f.Fallocate(*id, FALLOC_FL_PUNCH_HOLE, 0, 4096).code(), EOPNOTSUPP);
    EXPECT_EQ(f.Fallocate(*id, FALLOC_FL_COLLAPSE_RANGE, 0, 4096).code(), EOPNOTSUPP);
    EXPECT_EQ(f.Fallocate(*id, FALLOC_FL_INSERT_RANGE, 0, 4096).code(), EOPNOTSUPP);
    EXPECT_EQ(f.Fallocate(*id, 0, 0, 0).code(), EINVAL);
    EXPECT_EQ(f.Fallocate(*id, 0, UINT64_MAX - 10, 100).code(), EFBIG);
    EXPECT_EQ(f.Fallocate(f.Root(), 0, 0, 4096).code(), EISDIR);
    NewInode fifo;
    fifo.mode = S_IFIFO | 0644;
    auto p = f.Mknod(f.Root(), "p", fifo);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(f.Fallocate(*p, 0, 0, 4096).code(), ENODEV);
    ASSERT_TRUE(f.Commit().ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  // Reopened read-only: the same.
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  auto id = (*fs)->Lookup("/a");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(StatOf(**fs, *id).size, 69000 + 4 * kMiB);
}

// ENOSPC from an allocation larger than the device: nothing changed, and
// the image stays clean.
TEST(Fallocate, NoSpaceIsClean) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-falloc-nospc");
  const std::string img = MakeImage(dir, "img");
  {
    OpenOptions o;
    o.writable = true;
    auto fs = Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok());
    auto id = (*fs)->Create((*fs)->Root(), "big", NewInode{0644});
    ASSERT_TRUE(id.ok());
    EXPECT_EQ((*fs)->Fallocate(*id, 0, 0, 2048 * kMiB).code(), ENOSPC);
    EXPECT_EQ(StatOf(**fs, *id).size, 0u);
    // The view is still writable; what the failed call took returns at the
    // commit, and then a smaller request works.
    ASSERT_TRUE((*fs)->Commit().ok());
    ASSERT_TRUE((*fs)->Fallocate(*id, 0, 0, 8 * kMiB).ok());
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "");
}

// The kernel's view of what ubtrfs made equals what the kernel makes of the
// same calls on its own mount. Sector-aligned steps: for partial sectors the
// kernel writes zeros in place where ubtrfs may leave a hole (same content,
// different layout).
TEST(Fallocate, KernelSeesTheSame) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  TempDir dir("ubtrfs-falloc-kernel");
  const std::string ours = MakeImage(dir, "ours"), theirs = MakeImage(dir, "theirs");
  const int kKeep = FALLOC_FL_KEEP_SIZE, kPunch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
  const std::vector<std::pair<std::string, std::vector<Step>>> files = {
      {"prealloc", {{false, 0, 0, 1 * kMiB}}},
      {"keep_size", {{true, 0, 0, 8 * kKiB, 0x11}, {false, kKeep, 0, 2 * kMiB}}},
      {"write_into", {{false, 0, 0, 512 * kKiB}, {true, 0, 64 * kKiB, 16 * kKiB, 0xab}, {true, 0, 508 * kKiB, 4 * kKiB, 0x22}}},
      {"punch", {{true, 0, 0, 256 * kKiB, 0x33}, {false, kPunch, 64 * kKiB, 32 * kKiB}, {false, kPunch, 200 * kKiB, 1 * kMiB}}},
      {"fill_holes", {{true, 0, 0, 16 * kKiB, 0x44}, {true, 0, 96 * kKiB, 16 * kKiB, 0x55}, {false, 0, 0, 256 * kKiB}}},
      {"past_eof", {{true, 0, 0, 12 * kKiB, 0x66}, {false, kKeep, 1 * kMiB, 64 * kKiB}, {false, 0, 2 * kMiB, 4 * kKiB}}},
  };
  {
    OpenOptions o;
    o.writable = true;
    auto fs = Filesystem::Open(ours, o);
    ASSERT_TRUE(fs.ok());
    for (const auto& [name, steps] : files) {
      auto id = (*fs)->Create((*fs)->Root(), name, NewInode{0644});
      ASSERT_TRUE(id.ok());
      for (const Step& s : steps) ASSERT_TRUE(ApplyToImage(**fs, *id, s).ok()) << name;
    }
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  ASSERT_EQ(BtrfsCheck(ours), "");
  const std::string mnt = dir.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(theirs, mnt, ""), "");
    for (const auto& [name, steps] : files) {
      int fd = open((mnt + "/" + name).c_str(), O_CREAT | O_RDWR, 0644);
      ASSERT_GE(fd, 0);
      for (const Step& s : steps) ASSERT_EQ(ApplyToHost(fd, s), 0) << name;
      close(fd);
    }
    ASSERT_EQ(m.Unmount(), "");
  }
  std::vector<View> kernel, ubtrfs;
  for (const std::string& img : {theirs, ours}) {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    for (const auto& [name, steps] : files) (img == theirs ? kernel : ubtrfs).push_back(Look(mnt + "/" + name));
    ASSERT_EQ(m.Unmount(), "");
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::cout << "  " << files[i].first << ": " << Describe(ubtrfs[i]) << "\n";
    EXPECT_EQ(ubtrfs[i].size, kernel[i].size) << files[i].first;
    EXPECT_TRUE(ubtrfs[i].content == kernel[i].content) << files[i].first << ": content differs";
    EXPECT_EQ(ubtrfs[i].blocks, kernel[i].blocks) << files[i].first;
    EXPECT_EQ(ubtrfs[i].extents, kernel[i].extents)
        << files[i].first << "\n ubtrfs: " << Describe(ubtrfs[i]) << "\n kernel: " << Describe(kernel[i]);
  }
  // The kernel writes into our preallocated extents; we read what it wrote.
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(ours, mnt, ""), "");
    int fd = open((mnt + "/prealloc").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> data(8 * kKiB, 0x77);
    ASSERT_EQ(pwrite(fd, data.data(), data.size(), 40 * kKiB), static_cast<ssize_t>(data.size()));
    close(fd);
    ASSERT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(BtrfsCheck(ours), "") << "after the kernel wrote into our prealloc extent";
  auto fs = Filesystem::Open(ours);
  ASSERT_TRUE(fs.ok());
  auto id = (*fs)->Lookup("/prealloc");
  ASSERT_TRUE(id.ok());
  std::string want(1 * kMiB, '\0');
  std::memset(want.data() + 40 * kKiB, 0x77, 8 * kKiB);
  EXPECT_TRUE(ReadAll(**fs, *id) == want);
}

}  // namespace
