// statfs against the kernel's: `ubtrfs df --json IMAGE` (a read-only view)
// must give the f_blocks, f_bfree and f_bavail of a read-only kernel mount of
// the same image over writable loop devices, and StatFs of a writable view
// those of a read-write mount, to the block (src/fs/statfs.h says how the
// kernel counts: data copies, DUP metadata, its global reserve). Over
// read-only loop devices (mount -o loop,ro) the kernel reports less
// available (nothing of the data chunks' free space) and the rest the same.
//
// Needs root, mkfs.btrfs and working loop mounts; skipped otherwise.
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/array_mount.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

constexpr uint64_t kMiB = 1ull << 20;

struct Figures {
  uint64_t total = 0, free = 0, avail = 0;  // bytes
};

std::ostream& operator<<(std::ostream& os, const Figures& f) {
  return os << "total " << f.total << " free " << f.free << " avail " << f.avail << " (blocks " << f.total / 4096
            << "/" << f.free / 4096 << "/" << f.avail / 4096 << ")";
}
bool operator==(const Figures& a, const Figures& b) {
  return a.total == b.total && a.free == b.free && a.avail == b.avail;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// statvfs of a kernel mount of `images` with `opts` ("ro" or "").
Figures KernelFigures(const std::vector<std::string>& images, const std::string& dir, const std::string& opts) {
  ArrayMount m;
  std::string e = m.Mount(images, dir, opts);
  EXPECT_EQ(e, "");
  Figures f;
  if (!e.empty()) return f;
  struct statvfs sv {};
  EXPECT_EQ(::statvfs(dir.c_str(), &sv), 0);
  f = {sv.f_blocks * sv.f_frsize, sv.f_bfree * sv.f_frsize, sv.f_bavail * sv.f_frsize};
  m.Unmount();
  return f;
}

// `ubtrfs df --json` of the images (a read-only view).
Figures DfFigures(const std::vector<std::string>& images) {
  auto r = RunCommand({UBTRFS_CLI_PATH, "df", "--json", Join(images)});
  EXPECT_TRUE(r.ok()) << r.Describe();
  Figures f;
  if (!r.ok()) return f;
  auto j = nlohmann::json::parse(r.out);
  f.total = j.at("total_bytes").get<uint64_t>();
  f.free = j.at("free_bytes").get<uint64_t>();
  f.avail = j.at("avail_bytes").get<uint64_t>();
  EXPECT_EQ(j.at("used_bytes").get<uint64_t>(), f.total - f.free);
  return f;
}

// StatFs of a writable view of the images (no change made).
Figures WritableFigures(const std::vector<std::string>& images) {
  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = ubtrfs::Filesystem::Open(Join(images), o);
  EXPECT_TRUE(fs.ok()) << fs.status().ToString();
  Figures f;
  if (!fs.ok()) return f;
  auto s = (*fs)->StatFs();
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) f = {s->total_bytes, s->free_bytes, s->avail_bytes};
  return f;
}

class StatfsKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
    std::string why;
    if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "statfs against the kernel needs loop mounts: " << why;
    dir_ = std::make_unique<TempDir>("ubtrfs-statfs");
    mnt_ = dir_->Sub("mnt");
    ASSERT_EQ(::mkdir(mnt_.c_str(), 0755), 0);
  }

  std::vector<std::string> Mkfs(const std::string& name, int devices, uint64_t size,
                                const std::vector<std::string>& options) {
    std::vector<std::string> images, argv{"mkfs.btrfs", "-q", "-f"};
    argv.insert(argv.end(), options.begin(), options.end());
    for (int i = 0; i < devices; ++i) {
      images.push_back(dir_->Sub(name + std::to_string(i) + ".img"));
      std::string err;
      EXPECT_TRUE(MakeSparseFile(images.back(), size, &err)) << err;
      argv.push_back(images.back());
    }
    auto r = RunCommand(argv);
    EXPECT_TRUE(r.ok()) << ShellJoin(argv) << ": " << r.Describe();
    return images;
  }

  // The read-only view against a read-only mount, then the writable view
  // against a read-write mount (last: the kernel may change the image).
  void Compare(const std::vector<std::string>& images, const std::string& what) {
    const Figures ro_ours = DfFigures(images), ro_kernel = KernelFigures(images, mnt_, "ro");
    EXPECT_EQ(ro_ours, ro_kernel) << what << ", read-only: ubtrfs df --json vs a read-only kernel mount";
    std::cout << "[ " << what << " read-only: " << ro_kernel << " ]\n";
    if (images.size() == 1) {
      LoopMount m;  // a read-only loop device
      ASSERT_EQ(m.Mount(images[0], mnt_, "ro"), "");
      struct statvfs sv {};
      ASSERT_EQ(::statvfs(mnt_.c_str(), &sv), 0);
      const Figures ro_dev = {sv.f_blocks * sv.f_frsize, sv.f_bfree * sv.f_frsize, sv.f_bavail * sv.f_frsize};
      EXPECT_EQ(ro_dev.total, ro_ours.total) << what;
      EXPECT_EQ(ro_dev.free, ro_ours.free) << what;
      EXPECT_LE(ro_dev.avail, ro_ours.avail) << what;
      std::cout << "[ " << what << " read-only loop device: " << ro_dev << " ]\n";
      EXPECT_EQ(m.Unmount(), "");
    }
    const Figures rw_ours = WritableFigures(images), rw_kernel = KernelFigures(images, mnt_, "");
    EXPECT_EQ(rw_ours, rw_kernel) << what << ", writable: StatFs vs a read-write kernel mount";
    std::cout << "[ " << what << " read-write: " << rw_kernel << " ]\n";
  }

  std::unique_ptr<TempDir> dir_;
  std::string mnt_;
};

TEST_F(StatfsKernelTest, FreshImagesMatchTheKernel) {
  struct Case {
    const char* name;
    uint64_t size;
    std::vector<std::string> options;
  };
  for (const Case& c : {Case{"dup1g", 1024 * kMiB, {}}, Case{"dup8g", 8192 * kMiB, {}},
                        Case{"single1g", 1024 * kMiB, {"-m", "single"}},
                        Case{"nodesize4k", 512 * kMiB, {"--nodesize", "4096"}}}) {
    SCOPED_TRACE(c.name);
    auto images = Mkfs(c.name, 1, c.size, c.options);
    if (HasFailure()) return;
    Compare(images, c.name);
  }
}

// Data written by the kernel and by ubtrfs: data chunks in use, a larger csum
// and extent tree, metadata grown.
TEST_F(StatfsKernelTest, ImageWithDataMatchesTheKernel) {
  auto images = Mkfs("data", 1, 2048 * kMiB, {});
  ASSERT_FALSE(HasFailure());
  {
    ArrayMount m;
    ASSERT_EQ(m.Mount(images, mnt_), "");
    auto r = RunCommand({"sh", "-c",
                         "for i in $(seq 1 12); do head -c 10000000 /dev/urandom > \"$0/big$i\" || exit 1; done; "
                         "mkdir \"$0/d\" && for i in $(seq 1 1500); do echo small $i > \"$0/d/s$i\"; done",
                         mnt_});
    ASSERT_TRUE(r.ok()) << r.Describe();
    m.Unmount();
  }
  const std::string host = dir_->Sub("host");
  auto r = RunCommand({"head", "-c", "40000000", "/dev/urandom"});
  ASSERT_TRUE(r.ok());
  {
    std::ofstream(host, std::ios::binary) << r.out;
  }
  r = RunCommand({UBTRFS_CLI_PATH, "cp", host, images[0] + ":/from-ubtrfs"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "rm", images[0] + ":/big3"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  Compare(images, "150 MB of data");
}

// Two devices, RAID1 data and metadata: sizes are halved, and a read-only
// mount counts unallocated space as if data were single.
TEST_F(StatfsKernelTest, Raid1OnTwoDevicesMatchesTheKernel) {
  auto images = Mkfs("raid1-", 2, 1024 * kMiB, {"-d", "raid1", "-m", "raid1"});
  ASSERT_FALSE(HasFailure());
  Compare(images, "raid1 on two devices");
}

}  // namespace
}  // namespace ubtrfs_test
