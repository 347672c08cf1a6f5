// Multi-device filesystems: arrays mkfs.btrfs makes over 2-4 image files
// with every profile, filled through the kernel (loop devices, mount -o
// device=...). ubtrfs must read them as the kernel shows them, write into the
// mirrored and striped ones so that btrfs check and the kernel agree, and
// read every file back when a device is gone or one copy of a block is bad.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "fs/open_device.h"
#include "io/block_device.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

namespace {

using namespace ubtrfs;
using ubtrfs_test::CompareTreeToImage;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

struct Profile {
  std::string name;  // mkfs.btrfs -d/-m value
  int devices;
  bool writable;     // ubtrfs writes it (RAID5/6 are read-only)
  int tolerates;     // devices that may go missing with every file still readable
};

std::string PrintProfile(const testing::TestParamInfo<Profile>& p) { return p.param.name; }

const std::vector<Profile> kProfiles = {
    {"single", 2, true, 0},  {"raid0", 2, true, 0}, {"raid1", 2, true, 1},  {"raid1c3", 3, true, 2},
    {"raid1c4", 4, true, 3}, {"raid10", 4, true, 1}, {"raid5", 3, false, 1}, {"raid6", 4, false, 2},
};

std::string Join(const std::vector<std::string>& v, const std::string& sep = ",") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Loop devices for every image and a kernel mount of the set.
class ArrayMount {
 public:
  ~ArrayMount() { Unmount(); }
  std::string Mount(const std::vector<std::string>& images, const std::string& dir, const std::string& opts = "") {
    for (const auto& img : images) {
      auto r = RunCommand({"losetup", "-f", "--show", img});
      if (!r.ok()) return "losetup " + img + ": " + r.Describe();
      std::string dev = r.out;
      while (!dev.empty() && (dev.back() == '\n' || dev.back() == ' ')) dev.pop_back();
      loops_.push_back(dev);
    }
    std::string o;
    for (const auto& l : loops_) o += (o.empty() ? "" : ",") + std::string("device=") + l;
    if (!opts.empty()) o += "," + opts;
    auto r = RunCommand({"mount", "-t", "btrfs", "-o", o, loops_.front(), dir});
    if (!r.ok()) return "mount: " + r.Describe();
    dir_ = dir;
    return "";
  }
  // btrfs check --readonly over the loop devices (progs finds the members
  // among the scanned block devices).
  ubtrfs_test::CommandResult Check(const std::vector<std::string>& images) {
    for (const auto& img : images) {
      auto r = RunCommand({"losetup", "-f", "--show", img});
      std::string dev = r.out;
      while (!dev.empty() && (dev.back() == '\n' || dev.back() == ' ')) dev.pop_back();
      loops_.push_back(dev);
    }
    RunCommand({"btrfs", "device", "scan"});
    return RunCommand({"btrfs", "check", "--readonly", loops_.front()});
  }
  void Unmount() {
    if (!dir_.empty()) RunCommand({"umount", dir_});
    dir_.clear();
    for (const auto& l : loops_) RunCommand({"losetup", "-d", l});
    loops_.clear();
  }

 private:
  std::vector<std::string> loops_;
  std::string dir_;
};

class MultiDeviceTest : public testing::TestWithParam<Profile> {
 protected:
  void SetUp() override {
    if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
    std::string why;
    if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "needs kernel loop mounts: " << why;
    dir_ = std::make_unique<TempDir>("ubtrfs-multidev");
    const Profile& p = GetParam();
    std::vector<std::string> argv{"mkfs.btrfs", "-q", "-f", "-d", p.name, "-m", p.name == "single" ? "raid1" : p.name};
    for (int i = 0; i < p.devices; ++i) {
      images_.push_back(dir_->Sub("dev" + std::to_string(i + 1) + ".img"));
      std::string err;
      ASSERT_TRUE(ubtrfs_test::MakeSparseFile(images_.back(), 256 * kMiB, &err)) << err;
      argv.push_back(images_.back());
    }
    auto r = RunCommand(argv);
    ASSERT_TRUE(r.ok()) << ubtrfs_test::ShellJoin(argv) << ": " << r.Describe();
    // The content: small and large files (several stripe elements and
    // chunks' worth), a hole, a directory tree, a symlink.
    src_ = dir_->Sub("src");
    ::mkdir(src_.c_str(), 0755);
    ::mkdir((src_ + "/d").c_str(), 0755);
    ::mkdir((src_ + "/d/e").c_str(), 0700);
    const size_t sizes[] = {0, 1, 4095, 4096, 65537, 300000, 3 * kMiB + 123, 24 * kMiB};
    for (size_t i = 0; i < std::size(sizes); ++i) {
      ubtrfs_test::WriteHostFile(src_ + (i % 2 ? "/d/f" : "/f") + std::to_string(i),
                                 ubtrfs_test::SeededBytes(sizes[i], 100 + i));
    }
    for (int i = 0; i < 50; ++i) {
      ubtrfs_test::WriteHostFile(src_ + "/d/e/small" + std::to_string(i), ubtrfs_test::SeededBytes(i * 97, i));
    }
    ASSERT_EQ(::symlink("d/f1", (src_ + "/link").c_str()), 0);
    mnt_ = dir_->Sub("mnt");
    ::mkdir(mnt_.c_str(), 0755);
    ArrayMount m;
    ASSERT_EQ(m.Mount(images_, mnt_), "");
    auto cp = RunCommand({"cp", "-a", src_ + "/.", mnt_ + "/"});
    ASSERT_TRUE(cp.ok()) << cp.Describe();
  }

  std::string AllImages() const { return Join(images_); }
  std::vector<std::string> Without(size_t i) const {
    std::vector<std::string> v = images_;
    v.erase(v.begin() + i);
    return v;
  }

  // The kernel's view (read-only mount) against ubtrfs's over `devices`.
  void CompareWithKernel(const std::string& devices) {
    ArrayMount m;
    ASSERT_EQ(m.Mount(images_, mnt_, "ro"), "");
    auto fs = Filesystem::Open(devices);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto diffs = CompareTreeToImage(mnt_, **fs, ubtrfs_test::KernelMountCompareOptions());
    EXPECT_TRUE(diffs.empty()) << Join(diffs, "\n");
  }

  // Every file of the source tree reads back byte for byte through ubtrfs.
  void CompareWithSource(const std::string& devices, const OpenOptions& o = {}) {
    auto fs = Filesystem::Open(devices, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs_test::CompareOptions co;
    co.compare_dir_mtime = false;
    co.compare_top_attrs = false;
    auto diffs = CompareTreeToImage(src_, **fs, co);
    EXPECT_TRUE(diffs.empty()) << devices << ":\n" << Join(diffs, "\n");
  }

  std::unique_ptr<TempDir> dir_;
  std::vector<std::string> images_;
  std::string src_, mnt_;
};

TEST_P(MultiDeviceTest, ReadsWhatTheKernelWrote) {
  CompareWithKernel(AllImages());
  auto check = ubtrfs_test::RunUbtrfs({"check", "--check-data-csum", AllImages()});
  EXPECT_EQ(check.exit_code, 0) << check.Describe();
}

TEST_P(MultiDeviceTest, WritesKeepBtrfsCheckAndTheKernelHappy) {
  const Profile& p = GetParam();
  if (!p.writable) {
    OpenOptions rw;
    rw.writable = true;
    auto fs = Filesystem::Open(AllImages(), rw);
    ASSERT_FALSE(fs.ok());
    EXPECT_EQ(fs.status().code(), EOPNOTSUPP);
    EXPECT_NE(fs.status().message().find("RAID5/RAID6"), std::string::npos) << fs.status().ToString();
    return;
  }
  // cp in (a new directory, 40 MiB more: new chunks), rm, overwrite.
  const std::string more = dir_->Sub("more");
  ::mkdir(more.c_str(), 0755);
  ubtrfs_test::WriteHostFile(more + "/big", ubtrfs_test::SeededBytes(40 * kMiB, 7));
  for (int i = 0; i < 30; ++i) ubtrfs_test::WriteHostFile(more + "/s" + std::to_string(i), std::string(i * 311, 'x'));
  auto cp = ubtrfs_test::RunUbtrfs({"cp", more, AllImages() + ":/more"});
  ASSERT_EQ(cp.exit_code, 0) << cp.Describe();
  auto rm = ubtrfs_test::RunUbtrfs({"rm", "-r", AllImages() + ":/d/e"});
  ASSERT_EQ(rm.exit_code, 0) << rm.Describe();
  {
    OpenOptions rw;
    rw.writable = true;
    auto fs = Filesystem::Open(AllImages(), rw);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto ino = (*fs)->Lookup("/f6");
    ASSERT_TRUE(ino.ok());
    const std::string patch = ubtrfs_test::SeededBytes(200000, 99);
    auto w = (*fs)->Write(*ino, 1000000, ubtrfs_test::SpanOf(patch));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  // The same changes on the host copy.
  ubtrfs_test::RemoveTree(src_ + "/d/e");
  RunCommand({"cp", "-a", more, src_ + "/more"});
  {
    std::fstream f(src_ + "/f6", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000000);
    const std::string patch = ubtrfs_test::SeededBytes(200000, 99);
    f.write(patch.data(), static_cast<std::streamsize>(patch.size()));
  }
  auto ours = ubtrfs_test::RunUbtrfs({"check", "--check-data-csum", AllImages()});
  EXPECT_EQ(ours.exit_code, 0) << ours.Describe();
  {
    ArrayMount loops;
    auto progs = loops.Check(images_);
    EXPECT_TRUE(progs.ok()) << progs.Describe();
  }
  // The kernel sees the same files, and finds every copy good.
  {
    ArrayMount m;
    ASSERT_EQ(m.Mount(images_, mnt_), "");
    ubtrfs_test::CompareOptions co;
    co.compare_dir_mtime = false;
    co.compare_top_attrs = false;
    co.compare_mtime = false;  // cp of the host copy and ubtrfs cp stamp new files differently
    auto fs = Filesystem::Open(AllImages());
    auto scrub = RunCommand({"btrfs", "scrub", "start", "-B", mnt_});
    EXPECT_TRUE(scrub.ok()) << scrub.Describe();
    EXPECT_NE(scrub.out.find("no errors found"), std::string::npos) << scrub.out;
    m.Unmount();
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ASSERT_EQ(m.Mount(images_, mnt_, "ro"), "");
    auto diffs = CompareTreeToImage(mnt_, **fs, ubtrfs_test::KernelMountCompareOptions());
    EXPECT_TRUE(diffs.empty()) << Join(diffs, "\n");
    auto src_diffs = CompareTreeToImage(src_, **fs, co);
    EXPECT_TRUE(src_diffs.empty()) << Join(src_diffs, "\n");
  }
}

TEST_P(MultiDeviceTest, EveryFileReadsWithADeviceMissing) {
  const Profile& p = GetParam();
  if (p.tolerates == 0) GTEST_SKIP() << p.name << " keeps one copy: a missing device loses data";
  for (size_t i = 0; i < images_.size(); ++i) {
    SCOPED_TRACE("without device " + std::to_string(i + 1));
    CompareWithSource(Join(Without(i)));
    OpenOptions rw;
    rw.writable = true;
    auto fs = Filesystem::Open(Join(Without(i)), rw);
    ASSERT_FALSE(fs.ok());
    EXPECT_EQ(fs.status().code(), ENODEV) << fs.status().ToString();
  }
  if (p.tolerates >= 2) {
    SCOPED_TRACE("without devices 1 and 2");
    std::vector<std::string> v(images_.begin() + 2, images_.end());
    CompareWithSource(Join(v));
  }
}

// One device's copy of chosen data sectors and tree blocks overwritten with
// junk: reads take the other copy (or rebuild from parity).
TEST_P(MultiDeviceTest, ReadsSkipABadCopy) {
  const Profile& p = GetParam();
  if (p.tolerates == 0) GTEST_SKIP() << p.name << " keeps one copy";
  std::vector<std::pair<uint64_t, uint64_t>> smash;  // (devid, physical)
  {
    std::vector<std::unique_ptr<io::BlockDevice>> devs;
    for (const auto& img : images_) {
      auto d = io::OpenFileDevice(img);
      ASSERT_TRUE(d.ok());
      devs.push_back(std::move(*d));
    }
    auto vol = txn::Volume::Open(std::move(devs), txn::VolumeOptions{});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    // Every 64 KiB of every data chunk's first 32 MiB, and the first 8 tree
    // blocks of each metadata chunk, on the device of the first copy. With
    // parity one element per row only: two bad data stripes at the same
    // offset of a RAID5 row cannot be rebuilt.
    for (const auto& [logical, c] : (*vol)->chunks().chunks()) {
      const bool data = c.type & format::kBlockGroupData;
      const bool parity = c.parity_stripes() > 0;
      const uint64_t step = parity ? c.stripe_len * c.data_stripes() : data ? 64 * 1024 : (*vol)->nodesize();
      const uint64_t n = std::min<uint64_t>(data ? 512 : 8, c.length / step);
      for (uint64_t k = 0; k < n; ++k) {
        auto m = (*vol)->chunks().Map(logical + k * step, 4096);
        ASSERT_TRUE(m.ok());
        const auto& piece = m->at(0).at(0);
        smash.push_back({piece.devid, piece.physical});
      }
    }
  }
  for (auto [devid, phys] : smash) {
    auto d = io::OpenFileDevice(images_.at(devid - 1), io::OpenFlags{true});
    ASSERT_TRUE(d.ok());
    std::vector<uint8_t> junk(4096, 0xa5);
    ASSERT_TRUE((*d)->WriteAt(phys, junk).ok());
  }
  CompareWithSource(AllImages());
  // ubtrfs check sees the bad copies.
  auto check = ubtrfs_test::RunUbtrfs({"check", "--check-data-csum", AllImages()});
  EXPECT_NE(check.exit_code, 0) << check.Describe();
}

INSTANTIATE_TEST_SUITE_P(Profiles, MultiDeviceTest, testing::ValuesIn(kProfiles), PrintProfile);

// Options every subcommand takes: --scan finds the members by fsid.
TEST(MultiDeviceCli, ScanFindsTheOtherMembers) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-scan");
  const std::string a = dir.Sub("a.img"), b = dir.Sub("b.img"), c = dir.Sub("other.img");
  std::string err;
  for (const auto& f : {a, b, c}) ASSERT_TRUE(ubtrfs_test::MakeSparseFile(f, 200 * kMiB, &err)) << err;
  ASSERT_TRUE(RunCommand({"mkfs.btrfs", "-q", "-f", "-d", "raid1", "-m", "raid1", a, b}).ok());
  ASSERT_TRUE(RunCommand({"mkfs.btrfs", "-q", "-f", c}).ok());
  auto ls = ubtrfs_test::RunUbtrfs({"ls", a, "--scan", dir.path()});
  EXPECT_EQ(ls.exit_code, 0) << ls.Describe();
  EXPECT_EQ(ls.err.find("missing"), std::string::npos) << ls.err;
  auto alone = ubtrfs_test::RunUbtrfs({"ls", a});
  EXPECT_EQ(alone.exit_code, 0) << alone.Describe();
  EXPECT_NE(alone.err.find("device 2 of 2 is missing"), std::string::npos) << alone.err;
  auto info = ubtrfs_test::RunUbtrfs({"info", b});
  EXPECT_EQ(info.exit_code, 0) << info.Describe();
  EXPECT_NE(info.out.find("missing"), std::string::npos) << info.out;
  // A device of another filesystem named with them.
  auto wrong = ubtrfs_test::RunUbtrfs({"ls", a + "," + c});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("another filesystem"), std::string::npos) << wrong.err;
}

}  // namespace
