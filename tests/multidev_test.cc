// Multi-device filesystems: arrays mkfs.btrfs makes over 2-4 image files
// with every profile, filled through the kernel (loop devices, mount -o
// device=...). ubtrfs must read them as the kernel shows them, write into the
// mirrored and striped ones so that btrfs check and the kernel agree, and
// read every file back when a device is gone or one copy of a block is bad.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "check/checker.h"
#include "format/ondisk.h"
#include "fs/open_device.h"
#include "io/recording_device.h"
#include "alloc/chunk_map.h"
#include "io/block_device.h"
#include "support/array_mount.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "tree/cursor.h"
#include "txn/devices.h"
#include "txn/volume.h"
#include "ubtrfs/devices.h"
#include "ubtrfs/filesystem.h"

namespace {

using namespace ubtrfs;
using ubtrfs_test::ArrayMount;
using ubtrfs_test::CompareTreeToImage;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

struct Profile {
  std::string name;  // mkfs.btrfs -d/-m value
  int devices;
  bool writable;     // ubtrfs writes it
  int tolerates;     // devices that may go missing with every file still readable
};

std::string PrintProfile(const testing::TestParamInfo<Profile>& p) { return p.param.name; }

const std::vector<Profile> kProfiles = {
    {"single", 2, true, 0},  {"raid0", 2, true, 0}, {"raid1", 2, true, 1},  {"raid1c3", 3, true, 2},
    {"raid1c4", 4, true, 3}, {"raid10", 4, true, 1}, {"raid5", 3, true, 1}, {"raid6", 4, true, 2},
};

std::string Join(const std::vector<std::string>& v, const std::string& sep = ",") {
  return ubtrfs_test::JoinDevices(v, sep);
}

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
    ubtrfs_test::MakeArraySource(src_, 24 * kMiB);
    if (HasFatalFailure()) return;
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

  // The array's volume, read-only: where the copies of a range lie.
  Result<std::unique_ptr<txn::Volume>> OpenVolume() const {
    std::vector<std::unique_ptr<io::BlockDevice>> devs;
    for (const auto& img : images_) {
      UB_ASSIGN_OR_RETURN(auto d, io::OpenFileDevice(img));
      devs.push_back(std::move(d));
    }
    return txn::Volume::Open(std::move(devs), txn::VolumeOptions{});
  }
  // The kernel's scrub of the array finds nothing.
  void ExpectKernelScrubClean() {
    ArrayMount m;
    ASSERT_EQ(m.Mount(images_, mnt_), "");
    auto kscrub = RunCommand({"btrfs", "scrub", "start", "-B", mnt_});
    if (!kscrub.ok() && kscrub.err.find("errno=28") != std::string::npos) {
      // The kernel's scrub makes each block group read-only first, and on
      // these small arrays finds no room for that (seen with RAID6).
      std::printf("kernel scrub not run: %s\n", kscrub.err.c_str());
      return;
    }
    EXPECT_TRUE(kscrub.ok()) << kscrub.Describe();
    EXPECT_NE(kscrub.out.find("no errors found"), std::string::npos) << kscrub.out;
  }
  // ubtrfs check --check-data-csum, ubtrfs scrub (every copy good, and on
  // RAID5/6 every row's P and Q as its data gives) and btrfs check: clean.
  void ExpectCheckersClean() {
    auto ours = ubtrfs_test::RunUbtrfs({"check", "--check-data-csum", AllImages()});
    EXPECT_EQ(ours.exit_code, 0) << ours.Describe();
    auto scrub = ubtrfs_test::RunUbtrfs({"scrub", "--readonly", "--json", AllImages()});
    EXPECT_EQ(scrub.exit_code, 0) << scrub.Describe();
    EXPECT_NE(scrub.out.find("\"parity_errors\": 0,"), std::string::npos) << scrub.out;
    auto progs = ArrayMount::CheckOnce(images_);
    EXPECT_TRUE(progs.ok()) << progs.Describe();
  }
  // After a device change behind the kernel's back (remove, replace): no
  // device missing (a plain writable open), every file as the source has
  // it, ubtrfs check, scrub (RAID5/6 parity too) and btrfs check clean, the
  // kernel's view the same, and with `redundant`, every device lost in turn
  // with every file still read by the kernel.
  void ExpectWholeAgain(bool redundant) {
    // The kernel still lists the changed device as it was, at the loop
    // device SetUp's mount used, which another test may hold by now: a
    // mount would try that one too (EEXIST). Stale entries go first, as a
    // user does after such a change (README).
    (void)RunCommand({"btrfs", "device", "scan", "--forget"});
    {
      OpenOptions rw;
      rw.writable = true;
      auto fs = Filesystem::Open(AllImages(), rw);
      ASSERT_TRUE(fs.ok()) << fs.status().ToString();
      EXPECT_EQ((*fs)->Info().num_devices, images_.size());
      EXPECT_TRUE((*fs)->Info().devices_missing.empty());
    }
    CompareWithSource(AllImages());
    ExpectCheckersClean();
    CompareWithKernel(AllImages());
    for (size_t i = 0; i < images_.size() && redundant; ++i) {
      ubtrfs_test::ExpectKernelReadsAllWithout(images_, {i}, mnt_);
    }
  }
  // 4 KiB of `junk` bytes at each (devid, physical offset).
  void Smash(const std::vector<std::pair<uint64_t, uint64_t>>& at, uint8_t junk) const {
    for (auto [devid, phys] : at) {
      auto d = io::OpenFileDevice(images_.at(devid - 1), io::OpenFlags{true});
      ASSERT_TRUE(d.ok());
      ASSERT_TRUE((*d)->WriteAt(phys, std::vector<uint8_t>(4096, junk)).ok());
    }
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
  ExpectCheckersClean();
  // The kernel sees the same files, and finds every copy good.
  {
    ArrayMount m;
    ASSERT_EQ(m.Mount(images_, mnt_), "");
    ubtrfs_test::CompareOptions co;
    co.compare_dir_mtime = false;
    co.compare_top_attrs = false;
    co.compare_mtime = false;  // cp of the host copy and ubtrfs cp stamp new files differently
    auto fs = Filesystem::Open(AllImages());
    m.Unmount();
    ExpectKernelScrubClean();  // on RAID5/6 it checks P and Q as well
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ASSERT_EQ(m.Mount(images_, mnt_, "ro"), "");
    auto diffs = CompareTreeToImage(mnt_, **fs, ubtrfs_test::KernelMountCompareOptions());
    EXPECT_TRUE(diffs.empty()) << Join(diffs, "\n");
    auto src_diffs = CompareTreeToImage(src_, **fs, co);
    EXPECT_TRUE(src_diffs.empty()) << Join(src_diffs, "\n");
  }
  // What ubtrfs wrote survives the loss of as many devices as the profile
  // tolerates: its copies, or on RAID5/6 its P and Q, are right.
  for (size_t i = 0; i < images_.size() && p.tolerates > 0; ++i) {
    ubtrfs_test::ExpectKernelReadsAllWithout(images_, {i}, mnt_);
  }
  if (p.tolerates >= 2) ubtrfs_test::ExpectKernelReadsAllWithout(images_, {0, images_.size() - 1}, mnt_);
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
    auto vol = OpenVolume();
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    // Every 64 KiB of every data chunk's first 32 MiB, on the device of
    // the first copy (tree blocks: below). With
    // parity one element per row only: two bad data stripes at the same
    // offset of a RAID5 row cannot be rebuilt.
    for (const auto& [logical, c] : (*vol)->chunks().chunks()) {
      const bool data = c.type & format::kBlockGroupData;
      if (!data) continue;
      const bool parity = c.parity_stripes() > 0;
      const uint64_t step = parity ? c.stripe_len * c.data_stripes() : data ? 64 * 1024 : (*vol)->nodesize();
      const uint64_t n = std::min<uint64_t>(data ? 512 : 8, c.length / step);
      const auto supers = alloc::SuperblockRanges(c);
      for (uint64_t k = 0; k < n; ++k) {
        // Not the stripes holding superblock copies (scrub checks those
        // apart; here only blocks and sectors are damaged).
        const uint64_t at = logical + k * step;
        bool super = false;
        for (auto [s0, l0] : supers) super = super || (at + step > s0 && at < s0 + l0);
        if (super) continue;
        auto m = (*vol)->chunks().Map(at, 4096);
        ASSERT_TRUE(m.ok());
        const auto& piece = m->at(0).at(0);
        smash.push_back({piece.devid, piece.physical});
      }
    }
  }
  {
    // Copy 1 of the roots of the trees (used blocks for certain); with
    // parity the fs tree's only (two in one row could share an offset).
    auto vol = OpenVolume();
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    std::vector<uint64_t> roots;
    for (uint64_t id : {format::kFsTreeObjectid, format::kCsumTreeObjectid, format::kExtentTreeObjectid}) {
      auto r = (*vol)->FindRoot(id);
      ASSERT_TRUE(r.ok());
      roots.push_back(r->ref.bytenr);
      if (p.name == "raid5" || p.name == "raid6") break;
    }
    for (uint64_t b : roots) {
      auto m = (*vol)->chunks().Map(b, 4096);
      ASSERT_TRUE(m.ok());
      smash.push_back({m->at(0).at(0).devid, m->at(0).at(0).physical});
    }
  }
  Smash(smash, 0xa5);
  CompareWithSource(AllImages());
  // ubtrfs check sees the bad copies: tree blocks as warnings (another copy
  // is good), data copies as errors with --check-data-csum.
  auto check = ubtrfs_test::RunUbtrfs({"check", AllImages()});
  EXPECT_EQ(check.exit_code, 0) << check.Describe();
  EXPECT_NE(check.out.find(" copy 1): tree block "), std::string::npos) << check.out;
  EXPECT_NE(check.out.find("another copy is good; ubtrfs scrub rewrites it"), std::string::npos) << check.out;
  auto data_check = ubtrfs_test::RunUbtrfs({"check", "--check-data-csum", AllImages()});
  EXPECT_EQ(data_check.exit_code, 1) << data_check.Describe();
  // scrub --readonly reports and leaves them; scrub repairs; a second scrub
  // and the kernel's find nothing.
  auto ro = ubtrfs_test::RunUbtrfs({"scrub", "--readonly", "--json", AllImages()});
  EXPECT_EQ(ro.exit_code, 3) << ro.Describe();
  EXPECT_EQ(ro.out.find("\"csum_errors\": 0,"), std::string::npos) << ro.out;
  EXPECT_EQ(ro.out.find("\"verify_errors\": 0,"), std::string::npos) << ro.out;
  EXPECT_NE(ro.out.find("\"corrected_errors\": 0,"), std::string::npos) << ro.out;
  auto fix = ubtrfs_test::RunUbtrfs({"scrub", AllImages()});
  EXPECT_EQ(fix.exit_code, 0) << fix.Describe();
  EXPECT_NE(fix.out.find("Uncorrectable:  0"), std::string::npos) << fix.out;
  auto again = ubtrfs_test::RunUbtrfs({"scrub", AllImages()});
  EXPECT_EQ(again.exit_code, 0) << again.Describe();
  EXPECT_NE(again.out.find("no errors found"), std::string::npos) << again.out;
  auto clean = ubtrfs_test::RunUbtrfs({"check", "--check-data-csum", AllImages()});
  EXPECT_EQ(clean.exit_code, 0) << clean.Describe();
  EXPECT_EQ(clean.out.find("copy 1)"), std::string::npos) << clean.out;
  ExpectKernelScrubClean();
}

// RAID5/6 parity: a P (and on RAID6 a Q) element of rows that hold data,
// smashed on its device, is found by scrub (parity_errors; --readonly
// leaves it), rewritten from the data, and a second scrub finds nothing;
// every file still reads back, and the kernel's scrub agrees.
TEST_P(MultiDeviceTest, ScrubRepairsParity) {
  const Profile& p = GetParam();
  if (p.name != "raid5" && p.name != "raid6") GTEST_SKIP() << p.name << " has no parity";
  std::vector<std::pair<uint64_t, uint64_t>> smash;  // (devid, physical)
  {
    auto vol = OpenVolume();
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    // The largest data extent: rows inside it hold data for certain.
    auto ext = (*vol)->FindRoot(format::kExtentTreeObjectid);
    ASSERT_TRUE(ext.ok());
    tree::Cursor c((*vol)->reader(), ext->ref);
    ASSERT_TRUE(c.SeekFirst().ok());
    uint64_t best = 0, best_len = 0;
    while (c.Valid()) {
      if (c.key().type == format::kExtentItemKey && c.key().offset > best_len) {
        best = c.key().objectid;
        best_len = c.key().offset;
      }
      ASSERT_TRUE(c.Next().ok());
    }
    ASSERT_GE(best_len, 4 * kMiB);
    const alloc::ChunkInfo* ch = (*vol)->chunks().Find(best);
    ASSERT_NE(ch, nullptr);
    const uint64_t k = ch->data_stripes(), n = ch->stripes.size(), sl = ch->stripe_len;
    const uint64_t first_row = (best - ch->logical + sl * k - 1) / (sl * k);
    for (uint64_t i = 0; i < 2; ++i) {
      const uint64_t row = first_row + 2 * i;
      ASSERT_LE((row + 1) * sl * k, best - ch->logical + best_len);
      // P of the first row; Q of the second (RAID6), else its P again.
      const uint64_t s = p.name == "raid6" && i == 1 ? k + 1 : k;
      const alloc::StripeLoc& loc = ch->stripes[(s + row) % n];
      smash.push_back({loc.devid, loc.physical + row * sl + 4096});
    }
  }
  Smash(smash, 0x3c);
  auto ro = ubtrfs_test::RunUbtrfs({"scrub", "--readonly", "--json", AllImages()});
  EXPECT_EQ(ro.exit_code, 3) << ro.Describe();
  EXPECT_NE(ro.out.find("\"parity_errors\": 2,"), std::string::npos) << ro.out;
  EXPECT_NE(ro.out.find("\"csum_errors\": 0,"), std::string::npos) << ro.out;
  auto fix = ubtrfs_test::RunUbtrfs({"scrub", AllImages()});
  EXPECT_EQ(fix.exit_code, 0) << fix.Describe();
  EXPECT_NE(fix.out.find("parity=2"), std::string::npos) << fix.out;
  auto again = ubtrfs_test::RunUbtrfs({"scrub", "--json", AllImages()});
  EXPECT_EQ(again.exit_code, 0) << again.Describe();
  EXPECT_NE(again.out.find("\"parity_errors\": 0,"), std::string::npos) << again.out;
  EXPECT_EQ(again.out.find("\"parity_rows\": 0,"), std::string::npos) << again.out;
  CompareWithSource(AllImages());
  ExpectKernelScrubClean();
}

// A degraded write: one device gone, --degraded, a file copied in. It reads
// back through ubtrfs and through the kernel's degraded mount, and the new
// chunks follow the kernel's rule (fewer devices than the profile needs:
// single).
TEST_P(MultiDeviceTest, DegradedWritesGoToThePresentDevices) {
  const Profile& p = GetParam();
  if (p.tolerates == 0 || !p.writable) GTEST_SKIP() << p.name << ": not a degraded-writable profile";
  const std::vector<std::string> left = Without(images_.size() - 1);
  const std::string more = src_ + "/late";  // part of the source tree from now on
  ubtrfs_test::WriteHostFile(more, ubtrfs_test::SeededBytes(30 * kMiB, 5));
  auto refused = ubtrfs_test::RunUbtrfs({"cp", more, Join(left) + ":/late"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("degraded"), std::string::npos) << refused.err;
  auto cp = ubtrfs_test::RunUbtrfs({"cp", "--degraded", more, Join(left) + ":/late"});
  ASSERT_EQ(cp.exit_code, 0) << cp.Describe();
  {
    auto fs = Filesystem::Open(Join(left));
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_EQ(ubtrfs_test::ReadImageFile(**fs, "/late"), ubtrfs_test::ReadHostFile(more));
  }
  CompareWithSource(Join(left));
  ArrayMount m;
  ASSERT_EQ(m.Mount(left, mnt_, "degraded,ro"), "");
  EXPECT_EQ(ubtrfs_test::ReadHostFile(mnt_ + "/late"), ubtrfs_test::ReadHostFile(more));
}

// A device lost for good: `device remove ... missing` makes each of its
// stripes again on the other devices (from the other copies, or from the
// rest of the row and its parity) and takes it out, as the kernel's `btrfs
// device remove missing` on a degraded mount. The array then opens without
// --degraded, both checkers find it clean, the kernel mounts it with the
// same files, and every remaining device can be lost in turn with every
// file still read: the rebuilt stripes hold the right copies and parity.
// Where the profile would fall below its minimum, a new device joins first
// (device add --degraded), as with the kernel; so it does for the striped
// profiles, as a replacement: the kernel allocated these small devices
// nearly whole, and restriping over fewer devices needs room for the new
// stripes (MultiDeviceAddRemove.RemoveMissingRestripesOverTheOthers has it).
TEST_P(MultiDeviceTest, RemovingAMissingDeviceRebuildsItsStripes) {
  const Profile& p = GetParam();
  std::vector<std::string> left = Without(1);
  auto remove = [&](const std::vector<std::string>& flags, const std::string& which) {
    std::vector<std::string> args{"device", "remove"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), left.begin(), left.end());
    args.push_back(which);
    return ubtrfs_test::RunUbtrfs(args);
  };
  auto generation = [&] {
    auto d = io::OpenFileDevice(left[0]);
    if (!d.ok()) return uint64_t{0};
    auto sb = txn::ReadSuperblock(**d);
    return sb.ok() ? sb->sb.generation.get() : 0;
  };
  const uint64_t gen0 = generation();
  if (p.tolerates == 0) {
    if (p.name != "raid0") GTEST_SKIP() << p.name << ": data may or may not lie on the lost device";
    // Refused: at the open when a tree block was there (metadata is RAID0
    // too), else for the data.
    auto r = remove({}, "missing");
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_TRUE(r.err.find("keeps one copy") != std::string::npos ||
                r.err.find("device 2 is missing") != std::string::npos)
        << r.err;
    EXPECT_EQ(generation(), gen0) << "a refused removal committed";
    return;
  }
  auto r = remove({}, "7");
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("is missing"), std::string::npos) << r.err;  // device 2 missing, 7 named
  const std::map<std::string, int> kMinDevices = {{"raid1", 2}, {"raid1c3", 3}, {"raid1c4", 4},
                                                  {"raid10", 2}, {"raid5", 2},  {"raid6", 3}};
  const bool below_min = p.devices - 1 < kMinDevices.at(p.name);
  const bool striped = p.name == "raid10" || p.name == "raid5" || p.name == "raid6";
  if (below_min || striped) {
    if (below_min) {
      r = remove({}, "missing");
      EXPECT_EQ(r.exit_code, 1) << r.Describe();
      EXPECT_NE(r.err.find("unable to go below"), std::string::npos) << r.err;
    }
    const std::string added = dir_->Sub("new.img");
    std::string err;
    ASSERT_TRUE(ubtrfs_test::MakeSparseFile(added, 256 * kMiB, &err)) << err;
    std::vector<std::string> add{"device", "add", "-q"};
    add.insert(add.end(), left.begin(), left.end());
    add.push_back(added);
    auto refused = ubtrfs_test::RunUbtrfs(add);
    EXPECT_EQ(refused.exit_code, 1) << refused.Describe();
    EXPECT_NE(refused.err.find("--degraded"), std::string::npos) << refused.err;
    add.insert(add.begin() + 2, "--degraded");
    auto added_r = ubtrfs_test::RunUbtrfs(add);
    ASSERT_EQ(added_r.exit_code, 0) << added_r.Describe();
    left.push_back(added);
  }
  if (!below_min && !striped) {
    EXPECT_EQ(generation(), gen0) << "a refused removal committed";
  }
  r = remove({}, "missing");
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("Removed device 2"), std::string::npos) << r.out;
  images_ = left;
  ExpectWholeAgain(true);
}

// `device replace`: a new device takes device 2's place under its devid,
// as the kernel's `btrfs replace start`: copied from device 2 where it is
// there (single, raid0), made again from the other copies or parity where
// it is lost (the profiles that tolerate a loss). The array then opens
// whole without --degraded, both checkers find it clean, the kernel shows
// the same files, the old device carries no superblock, and every device
// can be lost in turn with every file still read.
TEST_P(MultiDeviceTest, ReplaceTakesADevicesPlace) {
  const Profile& p = GetParam();
  const bool lost = p.tolerates > 0;
  const std::string fresh = dir_->Sub("new.img"), small = dir_->Sub("small.img");
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(fresh, 256 * kMiB, &err)) << err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(small, 64 * kMiB, &err)) << err;
  auto replace = [&](const std::string& with) {
    std::vector<std::string> args{"device", "replace"};
    for (const std::string& img : lost ? Without(1) : images_) args.push_back(img);
    args.push_back("2");
    args.push_back(with);
    return ubtrfs_test::RunUbtrfs(args);
  };
  auto r = replace(small);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("at least as large"), std::string::npos) << r.err;
  r = replace(fresh);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("Replaced device 2"), std::string::npos) << r.out;
  if (!lost) {
    auto old = io::OpenFileDevice(images_[1]);
    ASSERT_TRUE(old.ok());
    EXPECT_FALSE(txn::ReadSuperblock(**old).ok()) << "the replaced device still carries a superblock";
  }
  images_[1] = fresh;
  ExpectWholeAgain(lost);
}

// `device replace` of a present device verifies what it copies, as the
// kernel's replace does: the old device's copies of data sectors and tree
// roots, smashed in place (they read without error), are taken from the
// other copy, so the new device holds good ones and scrub --readonly finds
// nothing (it would find each smashed copy again on the new device had
// they been copied as read). RAID1 and RAID10 (mirrors within stripes)
// stand for the mirrored profiles; on RAID5 the smashed data elements are
// rebuilt from their rows' parity. The kernel made the array.
TEST_P(MultiDeviceTest, ReplaceVerifiesWhatItCopies) {
  const Profile& p = GetParam();
  if (p.name != "raid1" && p.name != "raid10" && p.name != "raid5") {
    GTEST_SKIP() << p.name << ": raid1, raid10 and raid5 stand for the others";
  }
  std::vector<std::pair<uint64_t, uint64_t>> smash;  // (devid, physical) on device 2
  {
    auto vol = OpenVolume();
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    auto on_device_2 = [&](uint64_t logical) {
      auto m = (*vol)->chunks().Map(logical, 4096);
      ASSERT_TRUE(m.ok());
      for (const auto& copy : *m) {
        if (copy.at(0).devid == 2) smash.push_back({2, copy.at(0).physical});
      }
    };
    for (uint64_t logical : ubtrfs_test::SampledDataSectors(**vol, 32 * kMiB, 16)) on_device_2(logical);
    for (uint64_t id : {format::kFsTreeObjectid, format::kCsumTreeObjectid, format::kExtentTreeObjectid}) {
      auto r = (*vol)->FindRoot(id);
      ASSERT_TRUE(r.ok());
      on_device_2(r->ref.bytenr);
    }
  }
  // How many land on device 2 follows the kernel's placement, which moves
  // with the machine's load (30 in one ASan run beside a TSan build, over
  // 50 alone); any dozen makes the exact repaired count below a real test.
  ASSERT_GT(smash.size(), 12u);
  Smash(smash, 0x5a);
  const std::string fresh = dir_->Sub("new.img");
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(fresh, 256 * kMiB, &err)) << err;
  std::vector<std::string> args{"device", "replace"};
  args.insert(args.end(), images_.begin(), images_.end());
  args.push_back("2");
  args.push_back(fresh);
  auto r = ubtrfs_test::RunUbtrfs(args);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find(": " + std::to_string(smash.size()) + " copied from another copy that verifies, 0 with no"),
            std::string::npos)
      << r.err;
  images_[1] = fresh;
  CompareWithSource(AllImages());
  ExpectCheckersClean();
}

INSTANTIATE_TEST_SUITE_P(Profiles, MultiDeviceTest, testing::ValuesIn(kProfiles), PrintProfile);

// Arrays straight from mkfs.btrfs (small chunks): ubtrfs's writes need new
// chunks, which must have the profile, a stripe per device as the profile
// wants, and items btrfs check and the kernel accept.
class NewChunksTest : public testing::TestWithParam<Profile> {};

TEST_P(NewChunksTest, NewChunksFollowTheProfileAcrossTheDevices) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "needs kernel loop mounts: " << why;
  const Profile& p = GetParam();
  TempDir dir("ubtrfs-newchunks");
  std::vector<std::string> images;
  std::vector<std::string> argv{"mkfs.btrfs", "-q", "-f", "-d", p.name, "-m", p.name == "single" ? "raid1" : p.name};
  for (int i = 0; i < p.devices; ++i) {
    images.push_back(dir.Sub("d" + std::to_string(i + 1) + ".img"));
    std::string err;
    ASSERT_TRUE(ubtrfs_test::MakeSparseFile(images.back(), 512 * kMiB, &err)) << err;
    argv.push_back(images.back());
  }
  ASSERT_TRUE(RunCommand(argv).ok());
  auto chunks = [&] {
    std::vector<std::unique_ptr<io::BlockDevice>> devs;
    for (const auto& img : images) devs.push_back(std::move(io::OpenFileDevice(img)).value());
    auto vol = txn::Volume::Open(std::move(devs), txn::VolumeOptions{});
    EXPECT_TRUE(vol.ok()) << vol.status().ToString();
    return vol.ok() ? (*vol)->chunks().chunks() : std::map<uint64_t, alloc::ChunkInfo>{};
  };
  const auto before = chunks();
  const std::string src = dir.Sub("src");
  ::mkdir(src.c_str(), 0755);
  ubtrfs_test::WriteHostFile(src + "/big", ubtrfs_test::SeededBytes(150 * kMiB, 3));
  for (int i = 0; i < 3000; ++i) ubtrfs_test::WriteHostFile(src + "/s" + std::to_string(i), std::string(i % 700, 'y'));
  auto cp = ubtrfs_test::RunUbtrfs({"cp", src, Join(images) + ":/src"});
  ASSERT_EQ(cp.exit_code, 0) << cp.Describe();
  const auto after = chunks();
  const uint64_t want_data = p.name == "raid0"     ? format::kBlockGroupRaid0
                            : p.name == "raid1"   ? format::kBlockGroupRaid1
                            : p.name == "raid1c3" ? format::kBlockGroupRaid1c3
                            : p.name == "raid10"  ? format::kBlockGroupRaid10
                            : p.name == "raid5"   ? format::kBlockGroupRaid5
                            : p.name == "raid6"   ? format::kBlockGroupRaid6
                                                  : 0;
  const uint64_t want_meta = p.name == "single" ? format::kBlockGroupRaid1 : want_data;
  size_t added = 0;
  for (const auto& [logical, c] : after) {
    if (before.count(logical)) continue;
    ++added;
    SCOPED_TRACE("new chunk " + std::to_string(logical) + " " + alloc::ProfileName(c.type));
    const uint64_t want = (c.type & format::kBlockGroupData) ? want_data : want_meta;
    EXPECT_EQ(c.profile(), want);
    std::set<uint64_t> devids;
    for (const auto& s : c.stripes) devids.insert(s.devid);
    EXPECT_EQ(devids.size(), c.stripes.size()) << "two stripes on one device";
    const alloc::ProfileRule rule = alloc::RuleFor(want);
    if (rule.devs_max != 0) {
      EXPECT_EQ(c.stripes.size(), rule.devs_max);
    } else {
      EXPECT_EQ(c.stripes.size(), images.size());  // RAID0, RAID10, RAID5 and RAID6 take every device
    }
  }
  EXPECT_GT(added, 0u) << "the writes fitted into mkfs's chunks: nothing tested";
  auto ours = ubtrfs_test::RunUbtrfs({"check", "--check-data-csum", Join(images)});
  EXPECT_EQ(ours.exit_code, 0) << ours.Describe();
  auto progs = ArrayMount::CheckOnce(images);
  EXPECT_TRUE(progs.ok()) << progs.Describe();
  const std::string mnt = dir.Sub("mnt");
  ::mkdir(mnt.c_str(), 0755);
  ArrayMount m;
  ASSERT_EQ(m.Mount(images, mnt), "");
  EXPECT_EQ(ubtrfs_test::ReadHostFile(mnt + "/src/big"), ubtrfs_test::ReadHostFile(src + "/big"));
  auto scrub = RunCommand({"btrfs", "scrub", "start", "-B", mnt});
  EXPECT_TRUE(scrub.ok()) << scrub.Describe();
  EXPECT_NE(scrub.out.find("no errors found"), std::string::npos) << scrub.out;
}

INSTANTIATE_TEST_SUITE_P(Profiles, NewChunksTest,
                         testing::Values(Profile{"single", 2, true, 0}, Profile{"raid0", 2, true, 0},
                                         Profile{"raid1", 2, true, 1}, Profile{"raid1c3", 3, true, 2},
                                         Profile{"raid10", 4, true, 1}, Profile{"raid5", 3, true, 1},
                                         Profile{"raid6", 4, true, 2}),
                         PrintProfile);

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

// `info` of a member that cannot be read alone (its RAID0 chunk tree is
// half on the other device): what its own superblock says, as text and as
// JSON, and a warning why the filesystem was not opened.
TEST(MultiDeviceCli, InfoOfAMemberAloneReadsItsSuperblock) {
  TempDir dir("ubtrfs-member");
  const std::string a = dir.Sub("a.img"), b = dir.Sub("b.img");
  auto mk = ubtrfs_test::RunUbtrfs({"mkfs", "-q", "--size", "256M", "-d", "raid0", "-m", "raid0", a, b});
  ASSERT_EQ(mk.exit_code, 0) << mk.Describe();
  auto whole = ubtrfs_test::RunUbtrfs({"info", "--json", a + "," + b});
  ASSERT_EQ(whole.exit_code, 0) << whole.Describe();
  const std::string fsid = whole.out.substr(whole.out.find("\"fsid\": "), 48);
  EXPECT_NE(whole.out.find("\"missing_devices\": [], "), std::string::npos) << whole.out;
  EXPECT_NE(whole.out.find("\"opened\": true"), std::string::npos) << whole.out;

  auto text = ubtrfs_test::RunUbtrfs({"info", b});
  ASSERT_EQ(text.exit_code, 0) << text.Describe();
  EXPECT_NE(text.out.find("this device:      2\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("missing devices:  1 (by devid; not opened)\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("devices:          2\n"), std::string::npos) << text.out;
  EXPECT_NE(text.err.find("cannot be read from the devices given: chunk tree"), std::string::npos) << text.err;

  auto json = ubtrfs_test::RunUbtrfs({"info", "--json", b});
  ASSERT_EQ(json.exit_code, 0) << json.Describe();
  EXPECT_EQ(json.out.front(), '{') << json.out;
  EXPECT_NE(json.out.find(fsid), std::string::npos) << json.out;
  EXPECT_NE(json.out.find("\"devid\": 2, \"missing_devices\": [1], "), std::string::npos) << json.out;
  EXPECT_NE(json.out.find("\"opened\": false"), std::string::npos) << json.out;

  // Not btrfs at all: the open's error, no superblock fields.
  auto junk = ubtrfs_test::RunUbtrfs({"info", dir.Sub("missing.img")});
  EXPECT_EQ(junk.exit_code, 1) << junk.Describe();
  EXPECT_EQ(junk.out, "");
}

}  // namespace

// ---- crash replay over two recorded devices -------------------------------------------------

namespace crash {

using Tagged = ubtrfs_test::TaggedDevice;

using Model = std::map<std::string, std::string>;  // file name in / -> content

Result<Model> ReadModel(Filesystem& fs) {
  Model m;
  UB_ASSIGN_OR_RETURN(auto entries, fs.ReadDir(fs.Root()));
  for (const auto& e : entries) {
    if (e.name == "." || e.name == "..") continue;
    m[e.name] = ubtrfs_test::ReadImageFile(fs, "/" + e.name);
  }
  return m;
}

}  // namespace crash

// An array (mkfs.btrfs over `ndev` devices with `profile` for data and
// metadata) written by ubtrfs with every write and flush of every device
// logged in one interleaved order; a power cut after every entry (each
// device keeping all it got, or only what it had flushed) must open and
// show exactly the files of some commit at or after the last one every
// device had made durable.
void PowerCutAtEveryWrite(const std::string& profile, int ndev) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-" + profile + "-crash");
  std::vector<std::string> files;
  std::vector<std::string> argv{"mkfs.btrfs", "-q", "-f", "-d", profile, "-m", profile};
  std::string err;
  for (int i = 0; i < ndev; ++i) {
    files.push_back(dir.Sub("d" + std::to_string(i + 1) + ".img"));
    ASSERT_TRUE(ubtrfs_test::MakeSparseFile(files.back(), 160 * kMiB, &err)) << err;
    argv.push_back(files.back());
  }
  ASSERT_TRUE(RunCommand(argv).ok());
  auto load = [](const std::string& path) {
    const std::string bytes = ubtrfs_test::ReadHostFile(path);
    return io::SparseImage::FromBytes(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                                bytes.size()));
  };
  std::vector<std::unique_ptr<io::RecordingDevice>> recs;
  for (int i = 0; i < ndev; ++i) {
    recs.push_back(std::make_unique<io::RecordingDevice>("dev" + std::to_string(i + 1), load(files[i])));
  }
  std::vector<int> order;
  std::mutex mu;
  std::map<uint64_t, crash::Model> states;  // by generation
  {
    std::vector<std::unique_ptr<io::BlockDevice>> devs;
    for (int i = 0; i < ndev; ++i) devs.push_back(std::make_unique<crash::Tagged>(recs[i].get(), i, &order, &mu));
    OpenOptions o;
    o.writable = true;
    auto fs = OpenOnDevices(std::move(devs), o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    Filesystem& f = **fs;
    crash::Model model;
    states[f.Info().generation] = model;
    std::mt19937_64 rng(42);
    for (int round = 0; round < 12; ++round) {
      for (int k = 0; k < 3; ++k) {
        const std::string name = "f" + std::to_string(rng() % 10);
        const std::string data = ubtrfs_test::SeededBytes(rng() % 3 == 0 ? 200000 : rng() % 9000, rng());
        auto existing = f.LookupChild(f.Root(), name);
        if (existing.ok()) {
          ASSERT_TRUE(f.Unlink(f.Root(), name).ok());
        }
        NewInode ni;
        ni.mode = 0644;
        auto ino = f.Create(f.Root(), name, ni);
        ASSERT_TRUE(ino.ok()) << ino.status().ToString();
        ASSERT_TRUE(f.Write(*ino, 0, ubtrfs_test::SpanOf(data)).ok());
        model[name] = data;
      }
      if (round % 4 == 3 && !model.empty()) {
        const std::string victim = model.begin()->first;
        ASSERT_TRUE(f.Unlink(f.Root(), victim).ok());
        model.erase(victim);
      }
      ASSERT_TRUE(f.Commit().ok());
      states[f.Info().generation] = model;
    }
  }
  size_t logged = 0;
  for (const auto& r : recs) logged += r->log().size();
  ASSERT_EQ(order.size(), logged);
  std::vector<std::unique_ptr<io::CrashReplayer>> replayers;
  for (const auto& r : recs) {
    replayers.push_back(std::make_unique<io::CrashReplayer>(r.get()));
    for (int m = 0; m < format::kSuperMirrorMax; ++m) {
      replayers.back()->AddAtomicRange(format::SuperblockOffset(m), 4096);
    }
  }
  auto materialize = [&](const std::vector<size_t>& counts, io::CrashMode mode,
                         std::vector<std::unique_ptr<io::BlockDevice>>* devs) -> bool {
    for (int i = 0; i < ndev; ++i) {
      auto img = replayers[i]->Materialize(io::CrashPoint{counts[i], mode, 0});
      if (!img.ok()) return false;
      devs->push_back(std::move(*img));
    }
    return true;
  };
  size_t points = 0, failures = 0, checks = 0;
  std::set<uint64_t> seen_gens;
  std::vector<size_t> counts(ndev, 0);
  for (size_t k = 0; k <= order.size(); ++k) {
    if (k > 0) ++counts[order[k - 1]];
    for (io::CrashMode mode : {io::CrashMode::kPrefix, io::CrashMode::kDropUnflushed}) {
      std::vector<std::unique_ptr<io::BlockDevice>> devs;
      ASSERT_TRUE(materialize(counts, mode, &devs));
      ++points;
      auto fs = OpenOnDevices(std::move(devs), OpenOptions{});
      if (!fs.ok()) {
        ++failures;
        ADD_FAILURE() << "cut after " << k << " (" << io::CrashModeName(mode) << "): " << fs.status().ToString();
        continue;
      }
      const uint64_t gen = (*fs)->Info().generation;
      seen_gens.insert(gen);
      auto got = crash::ReadModel(**fs);
      auto want = states.find(gen);
      if (!got.ok() || want == states.end() || *got != want->second) {
        ++failures;
        ADD_FAILURE() << "cut after " << k << " (" << io::CrashModeName(mode) << "): generation " << gen
                      << (got.ok() ? " shows other files than its commit" : ": " + got.status().ToString());
      }
      // ubtrfs check of every 25th point, and of the last.
      if (k % 25 == 0 || k == order.size()) {
        ++checks;
        std::vector<std::unique_ptr<io::BlockDevice>> cdevs;
        ASSERT_TRUE(materialize(counts, mode, &cdevs));
        auto vol = txn::Volume::Open(std::move(cdevs), txn::VolumeOptions{});
        ASSERT_TRUE(vol.ok()) << vol.status().ToString();
        check::CheckResult res = check::CheckVolume(**vol, check::CheckOptions{});
        if (!res.clean()) {
          ++failures;
          ADD_FAILURE() << "cut after " << k << " (" << io::CrashModeName(mode) << "): ubtrfs check: "
                        << Join(res.errors, "\n");
        }
      }
    }
    if (failures > 5) break;
  }
  std::printf("%s crash: %zu log entries over %d devices, %zu crash points, %zu generations seen, %zu failures\n",
              profile.c_str(), order.size(), ndev, points, seen_gens.size(), failures);
  EXPECT_EQ(failures, 0u);
  EXPECT_GT(seen_gens.size(), 5u);
  std::printf("%s crash: ubtrfs check on %zu of them\n", profile.c_str(), checks);
}

TEST(MultiDeviceCrash, Raid1PowerCutAtEveryWriteOfEitherDevice) { PowerCutAtEveryWrite("raid1", 2); }

// RAID5's read-modify-write rewrites the parity of rows that hold committed
// data: a cut between a row's data and its parity must still leave every
// commit readable (with all devices present, parity is not read).
TEST(MultiDeviceCrash, Raid5PowerCutAtEveryWriteOfAnyDevice) { PowerCutAtEveryWrite("raid5", 3); }

// The public way to read a device list as Open reads it: commas part the
// devices, unless a file of the whole name exists (an image named "a,b.img").
TEST(DeviceList, CommasPartDevicesUnlessTheWholeNameExists) {
  ubtrfs_test::TempDir dir("ubtrfs-devlist");
  const std::string a = dir.Sub("a.img"), b = dir.Sub("b.img");
  EXPECT_EQ(ubtrfs::SplitDeviceList(a + "," + b), (std::vector<std::string>{a, b}));
  EXPECT_EQ(ubtrfs::SplitDeviceList(a + ",," + b + ","), (std::vector<std::string>{a, b}));
  EXPECT_EQ(ubtrfs::SplitDeviceList(a), (std::vector<std::string>{a}));
  const std::string whole = dir.Sub("a.img,b.img");
  std::ofstream(whole) << "x";
  EXPECT_EQ(ubtrfs::SplitDeviceList(whole), (std::vector<std::string>{whole}));
}
