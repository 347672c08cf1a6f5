// Arrays ubtrfs makes (mkfs -d/-m over 2-4 image files) and changes
// (device add, device remove): the chunk, dev and device items exact, every
// device with its own superblock, btrfs check clean over the set, the
// kernel mounts it with the same content; wrong arguments change nothing.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "alloc/chunk_map.h"
#include "check/checker.h"
#include "fs/open_device.h"
#include "io/recording_device.h"
#include "tree/cursor.h"
#include "txn/relocate.h"
#include "txn/transaction.h"
#include "format/ondisk.h"
#include "io/block_device.h"
#include "support/array_mount.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "txn/devices.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::ArrayMount;
using ubtrfs_test::JoinDevices;
using ubtrfs_test::RunCommand;
using ubtrfs_test::RunUbtrfs;
using ubtrfs_test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

struct Layout {
  std::string data, meta;
  int devices;
};

std::string PrintLayout(const testing::TestParamInfo<Layout>& p) {
  return p.param.data + "_" + p.param.meta + "_" + std::to_string(p.param.devices);
}

uint64_t ProfileBits(const std::string& name) {
  static const std::map<std::string, uint64_t> kBits = {
      {"single", 0},
      {"dup", format::kBlockGroupDup},
      {"raid0", format::kBlockGroupRaid0},
      {"raid1", format::kBlockGroupRaid1},
      {"raid1c3", format::kBlockGroupRaid1c3},
      {"raid1c4", format::kBlockGroupRaid1c4},
      {"raid10", format::kBlockGroupRaid10},
      {"raid5", format::kBlockGroupRaid5},
      {"raid6", format::kBlockGroupRaid6},
  };
  return kBits.at(name);
}

void MakeSource(const std::string& src) { ubtrfs_test::MakeArraySource(src, 9 * kMiB); }

std::vector<std::string> MakeImages(const TempDir& dir, const std::string& prefix, int n, uint64_t size) {
  std::vector<std::string> images;
  for (int i = 0; i < n; ++i) {
    images.push_back(dir.Sub(prefix + std::to_string(i + 1) + ".img"));
    std::string err;
    EXPECT_TRUE(ubtrfs_test::MakeSparseFile(images.back(), size, &err)) << err;
  }
  return images;
}

ubtrfs_test::CommandResult Mkfs(const std::vector<std::string>& images, const std::string& data,
                                const std::string& meta, const std::string& rootdir = "") {
  std::vector<std::string> args{"mkfs", "-q", "-f", "-d", data, "-m", meta};
  if (!rootdir.empty()) {
    args.push_back("--rootdir");
    args.push_back(rootdir);
  }
  args.insert(args.end(), images.begin(), images.end());
  return RunUbtrfs(args);
}

// Images of `size` for layout `p` (named after its data profile), made an
// array by ubtrfs mkfs; none when mkfs failed (the test has failed then).
std::vector<std::string> MkfsArray(const TempDir& dir, const Layout& p, uint64_t size) {
  auto images = MakeImages(dir, p.data + "-", p.devices, size);
  auto r = Mkfs(images, p.data, p.meta);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  return r.ok() ? images : std::vector<std::string>{};
}

// The volume over the images of an array, read-only.
Result<std::unique_ptr<txn::Volume>> OpenArray(const std::vector<std::string>& images) {
  std::vector<std::unique_ptr<io::BlockDevice>> devs;
  for (const auto& img : images) {
    UB_ASSIGN_OR_RETURN(auto dev, io::OpenFileDevice(img));
    devs.push_back(std::move(dev));
  }
  return txn::Volume::Open(std::move(devs), txn::VolumeOptions{});
}

// Every file of `src` reads back byte for byte through ubtrfs over `devices`
// (`mtimes`: and with its mtime; mkfs.btrfs 6.2 --rootdir keeps seconds only).
void ExpectSameAsSource(const std::string& src, const std::vector<std::string>& devices, bool mtimes = true) {
  auto fs = Filesystem::Open(JoinDevices(devices));
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  ubtrfs_test::CompareOptions co;
  co.compare_dir_mtime = false;
  co.compare_top_attrs = false;
  co.compare_mtime = mtimes;
  auto diffs = ubtrfs_test::CompareTreeToImage(src, **fs, co);
  EXPECT_TRUE(diffs.empty()) << JoinDevices(diffs, "\n");
}

// The device items, dev extents and superblocks as they must be: one
// DEV_ITEM per device with bytes_used the sum of its stripes, each device's
// superblock naming itself, every chunk with the profile asked for its kind
// and a stripe per device as the profile wants.
void ExpectExactDevices(const std::vector<std::string>& images, uint64_t data, uint64_t meta) {
  auto vol = OpenArray(images);
  ASSERT_TRUE(vol.ok()) << vol.status().ToString();
  const txn::Volume& v = **vol;
  EXPECT_EQ(v.super().num_devices.get(), images.size());
  ASSERT_EQ(v.dev_items().size(), images.size());
  EXPECT_TRUE(v.missing_devices().empty());
  std::map<uint64_t, uint64_t> used;
  uint64_t total = 0;
  for (const auto& [logical, c] : v.chunks().chunks()) {
    SCOPED_TRACE("chunk " + std::to_string(logical) + " " + alloc::ProfileName(c.type));
    const uint64_t want = (c.type & format::kBlockGroupData) ? data : meta;
    EXPECT_EQ(c.profile(), want);
    std::set<uint64_t> devids;
    for (const auto& s : c.stripes) {
      devids.insert(s.devid);
      used[s.devid] += c.stripe_size;
    }
    if (want == format::kBlockGroupDup) {
      EXPECT_EQ(c.stripes.size(), 2u);
      EXPECT_EQ(devids.size(), 1u);
    } else {
      EXPECT_EQ(devids.size(), c.stripes.size()) << "two stripes on one device";
      const alloc::ProfileRule rule = alloc::RuleFor(want);
      if (rule.devs_max != 0) {
        EXPECT_EQ(c.stripes.size(), rule.devs_max);
      }
    }
  }
  for (const auto& [devid, item] : v.dev_items()) {
    EXPECT_EQ(item.bytes_used.get(), used[devid]) << "device " << devid;
    total += item.total_bytes.get();
  }
  EXPECT_EQ(v.super().total_bytes.get(), total);
  std::set<uint64_t> seen;
  for (const auto& img : images) {
    auto dev = io::OpenFileDevice(img);
    ASSERT_TRUE(dev.ok());
    auto sc = txn::ReadSuperblock(**dev);
    ASSERT_TRUE(sc.ok()) << img << ": " << sc.status().ToString();
    EXPECT_EQ(sc->mirror, 0) << img;
    const uint64_t devid = sc->sb.dev_item.devid.get();
    EXPECT_TRUE(seen.insert(devid).second) << img << " names device " << devid << " twice";
    ASSERT_TRUE(v.dev_items().count(devid)) << img;
    const format::DevItem& item = v.dev_items().at(devid);
    EXPECT_EQ(0, std::memcmp(sc->sb.dev_item.uuid, item.uuid, format::kUuidSize)) << img;
    EXPECT_EQ(sc->sb.dev_item.total_bytes.get(), item.total_bytes.get()) << img;
    EXPECT_EQ(sc->sb.dev_item.bytes_used.get(), item.bytes_used.get()) << img;
    EXPECT_EQ(sc->sb.num_devices.get(), images.size()) << img;
  }
}

// btrfs check over the set, and a kernel mount showing what ubtrfs shows.
void ExpectKernelAgrees(const TempDir& dir, const std::vector<std::string>& images) {
  auto progs = ArrayMount::CheckOnce(images);
  EXPECT_TRUE(progs.ok()) << progs.Describe();
  const std::string mnt = dir.Sub("mnt");
  ::mkdir(mnt.c_str(), 0755);
  ArrayMount m;
  ASSERT_EQ(m.Mount(images, mnt, "ro"), "");
  auto fs = Filesystem::Open(JoinDevices(images));
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto diffs = ubtrfs_test::CompareTreeToImage(mnt, **fs, ubtrfs_test::KernelMountCompareOptions());
  EXPECT_TRUE(diffs.empty()) << JoinDevices(diffs, "\n");
}

// ubtrfs check --check-data-csum, then btrfs check and the kernel's view
// where loop devices work: "" when all of it ran, else why the kernel's
// part was skipped.
std::string ExpectCleanEverywhere(const TempDir& dir, const std::vector<std::string>& images) {
  auto ours = RunUbtrfs({"check", "--check-data-csum", JoinDevices(images)});
  EXPECT_EQ(ours.exit_code, 0) << ours.Describe();
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) return "btrfs check and the kernel mount need loop devices: " + why;
  ExpectKernelAgrees(dir, images);
  return "";
}

class MultiDeviceMkfsTest : public testing::TestWithParam<Layout> {};

TEST_P(MultiDeviceMkfsTest, ArrayIsExactCheckCleanAndMountsWithTheSameContent) {
  const Layout& p = GetParam();
  TempDir dir("ubtrfs-mkfs-multi");
  const std::string src = dir.Sub("src");
  MakeSource(src);
  if (HasFatalFailure()) return;
  const auto images = MakeImages(dir, "dev", p.devices, 256 * kMiB);
  auto mk = Mkfs(images, p.data, p.meta, src);
  ASSERT_EQ(mk.exit_code, 0) << mk.Describe();
  ExpectExactDevices(images, ProfileBits(p.data), ProfileBits(p.meta));
  ExpectSameAsSource(src, images);
  if (auto why = ExpectCleanEverywhere(dir, images); !why.empty()) GTEST_SKIP() << why;
  // Parity written by mkfs, tree blocks and data alike: the kernel reads
  // everything with any one device gone.
  if (p.data == "raid5" || p.data == "raid6") {
    const std::string mnt = dir.Sub("mnt");
    for (size_t i = 0; i < images.size(); ++i) ubtrfs_test::ExpectKernelReadsAllWithout(images, {i}, mnt);
  }
}

INSTANTIATE_TEST_SUITE_P(Profiles, MultiDeviceMkfsTest,
                         testing::Values(Layout{"single", "raid1", 2}, Layout{"dup", "dup", 2},
                                         Layout{"raid0", "raid0", 2}, Layout{"raid1", "raid1", 2},
                                         Layout{"raid1c3", "raid1c3", 3}, Layout{"raid1c4", "raid1c4", 4},
                                         Layout{"raid10", "raid10", 4}, Layout{"raid0", "raid1", 3},
                                         Layout{"single", "single", 3}, Layout{"raid5", "raid5", 3},
                                         Layout{"raid6", "raid6", 4}, Layout{"raid5", "raid1", 4}),
                         PrintLayout);

// The defaults, as mkfs.btrfs: data single, metadata (and system) RAID1 on
// several devices, DUP on one.
TEST(MultiDeviceMkfs, DefaultsAreDataSingleMetadataRaid1) {
  TempDir dir("ubtrfs-mkfs-defaults");
  const auto images = MakeImages(dir, "dev", 2, 128 * kMiB);
  auto mk = RunUbtrfs({"mkfs", "-q", images[0], images[1]});
  ASSERT_EQ(mk.exit_code, 0) << mk.Describe();
  ExpectExactDevices(images, 0, format::kBlockGroupRaid1);
  const auto one = MakeImages(dir, "one", 1, 128 * kMiB);
  mk = RunUbtrfs({"mkfs", "-q", one[0]});
  ASSERT_EQ(mk.exit_code, 0) << mk.Describe();
  ExpectExactDevices(one, 0, format::kBlockGroupDup);
}

// device add, new data (copy profiles: new chunks may use the new device),
// device remove of an original one: every byte stays, the items stay exact.
class MultiDeviceAddRemoveTest : public testing::TestWithParam<Layout> {};

TEST_P(MultiDeviceAddRemoveTest, AddThenRemoveKeepsEveryFile) {
  const Layout& p = GetParam();
  TempDir dir("ubtrfs-add-remove");
  const std::string src = dir.Sub("src");
  MakeSource(src);
  if (HasFatalFailure()) return;
  auto images = MakeImages(dir, "dev", p.devices, 384 * kMiB);
  auto mk = Mkfs(images, p.data, p.meta, src);
  ASSERT_EQ(mk.exit_code, 0) << mk.Describe();
  // More data after the add, in a new data chunk: copy profiles may put a
  // copy on the new device; RAID0/RAID10 stripe it over every device, so
  // the remove has to restripe it over fewer.
  const bool striped = p.data == "raid0" || p.data == "raid10" || p.data == "raid5" || p.data == "raid6";
  const std::string more = src + "/more";
  // (mkfs's data chunk holds 64 MiB per data stripe: more than that)
  const int data_stripes = p.data == "raid0"    ? p.devices
                           : p.data == "raid10" ? p.devices / 2
                           : p.data == "raid5"  ? p.devices - 1
                           : p.data == "raid6"  ? p.devices - 2
                                                : 1;
  ubtrfs_test::WriteHostFile(more, ubtrfs_test::SeededBytes((64 * data_stripes + 8) * kMiB, 77));

  const std::string added = dir.Sub("new.img");
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(added, 384 * kMiB, &err)) << err;
  std::vector<std::string> add_args{"device", "add", "-q"};
  add_args.insert(add_args.end(), images.begin(), images.end());
  add_args.push_back(added);
  auto add = RunUbtrfs(add_args);
  ASSERT_EQ(add.exit_code, 0) << add.Describe();
  images.push_back(added);
  ExpectExactDevices(images, ProfileBits(p.data), ProfileBits(p.meta));
  {
    auto cp = RunUbtrfs({"cp", more, JoinDevices(images) + ":/more"});
    ASSERT_EQ(cp.exit_code, 0) << cp.Describe();
  }
  bool everywhere = false;  // a chunk on every device: the remove restripes it
  if (striped) {
    // The new data chunk lies on the added device too.
    auto vol = OpenArray(images);
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    size_t widest = 0;
    for (const auto& [logical, c] : (*vol)->chunks().chunks()) widest = std::max(widest, c.stripes.size());
    EXPECT_EQ(widest, images.size() - images.size() % (p.data == "raid10" ? 2 : 1));
    everywhere = widest == images.size();
  }
  ExpectSameAsSource(src, images);

  // Remove the first device (by path for RAID1, by devid otherwise).
  std::vector<std::string> rm_args{"device", "remove"};
  rm_args.insert(rm_args.end(), images.begin(), images.end());
  rm_args.push_back(p.data == "raid1" ? images[0] : "1");
  auto rm = RunUbtrfs(rm_args);
  ASSERT_EQ(rm.exit_code, 0) << rm.Describe();
  EXPECT_NE(rm.out.find("moved"), std::string::npos) << rm.out;
  if (everywhere) {
    EXPECT_NE(rm.out.find("restriped"), std::string::npos) << rm.out;
  }
  const std::string removed = images[0];
  images.erase(images.begin());
  {
    auto dev = io::OpenFileDevice(removed);
    ASSERT_TRUE(dev.ok());
    EXPECT_FALSE(txn::ReadSuperblock(**dev).ok()) << "the removed device still carries a superblock";
  }
  ExpectExactDevices(images, ProfileBits(p.data), ProfileBits(p.meta));
  ExpectSameAsSource(src, images);
  if (auto why = ExpectCleanEverywhere(dir, images); !why.empty()) GTEST_SKIP() << why;
  // Moved and restriped RAID5/6 stripes carry their parity along.
  if (p.data == "raid5" || p.data == "raid6") {
    for (size_t i = 0; i < images.size(); ++i) ubtrfs_test::ExpectKernelReadsAllWithout(images, {i}, dir.Sub("mnt"));
  }
}

INSTANTIATE_TEST_SUITE_P(Profiles, MultiDeviceAddRemoveTest,
                         testing::Values(Layout{"single", "raid1", 2}, Layout{"dup", "dup", 2},
                                         Layout{"raid0", "raid0", 2}, Layout{"raid1", "raid1", 2},
                                         Layout{"raid1c3", "raid1c3", 3}, Layout{"raid10", "raid10", 4},
                                         Layout{"raid10", "raid10", 3}, Layout{"raid0", "raid1", 3},
                                         Layout{"raid5", "raid5", 3}, Layout{"raid6", "raid6", 4}),
                         PrintLayout);

// Removing a device of a RAID0/RAID10/RAID5/RAID6 array whose chunks use
// every device: each chunk is laid out anew over the devices left (RAID5/6
// with the new rows' parity).
TEST(MultiDeviceAddRemove, RemoveRestripesChunksOverTheOtherDevices) {
  TempDir dir("ubtrfs-restripe");
  const std::string src = dir.Sub("src");
  MakeSource(src);
  if (HasFatalFailure()) return;
  std::string skipped;
  for (const Layout& p : {Layout{"raid0", "raid0", 3}, Layout{"raid10", "raid10", 4}, Layout{"raid5", "raid5", 3},
                          Layout{"raid6", "raid6", 4}}) {
    SCOPED_TRACE(p.data + " over " + std::to_string(p.devices));
    auto images = MakeImages(dir, p.data + "-", p.devices, 256 * kMiB);
    ASSERT_EQ(Mkfs(images, p.data, p.meta, src).exit_code, 0);
    std::vector<std::string> rm_args{"device", "remove"};
    rm_args.insert(rm_args.end(), images.begin(), images.end());
    rm_args.push_back("2");
    auto rm = RunUbtrfs(rm_args);
    ASSERT_EQ(rm.exit_code, 0) << rm.Describe();
    EXPECT_NE(rm.out.find("restriped 3 chunks"), std::string::npos) << rm.out;
    images.erase(images.begin() + 1);
    ExpectExactDevices(images, ProfileBits(p.data), ProfileBits(p.meta));
    ExpectSameAsSource(src, images);
    skipped = ExpectCleanEverywhere(dir, images);
    if (skipped.empty() && (p.data == "raid5" || p.data == "raid6")) {
      for (size_t i = 0; i < images.size(); ++i) ubtrfs_test::ExpectKernelReadsAllWithout(images, {i}, dir.Sub("mnt"));
    }
  }
  if (!skipped.empty()) GTEST_SKIP() << skipped;
}

// The same with device 2 lost for good (`remove ... missing`): each chunk
// is laid out anew over the devices left from what the others give (the
// RAID10 partner copy; RAID5/6 data rebuilt from parity).
TEST(MultiDeviceAddRemove, RemoveMissingRestripesOverTheOthers) {
  TempDir dir("ubtrfs-restripe-missing");
  const std::string src = dir.Sub("src");
  MakeSource(src);
  if (HasFatalFailure()) return;
  std::string skipped;
  for (const Layout& p : {Layout{"raid10", "raid10", 4}, Layout{"raid5", "raid5", 3}, Layout{"raid6", "raid6", 4}}) {
    SCOPED_TRACE(p.data + " over " + std::to_string(p.devices));
    auto images = MakeImages(dir, p.data + "-", p.devices, 256 * kMiB);
    ASSERT_EQ(Mkfs(images, p.data, p.meta, src).exit_code, 0);
    images.erase(images.begin() + 1);
    std::vector<std::string> rm_args{"device", "remove"};
    rm_args.insert(rm_args.end(), images.begin(), images.end());
    rm_args.push_back("missing");
    auto rm = RunUbtrfs(rm_args);
    ASSERT_EQ(rm.exit_code, 0) << rm.Describe();
    EXPECT_NE(rm.out.find("restriped 3 chunks"), std::string::npos) << rm.out;
    ExpectExactDevices(images, ProfileBits(p.data), ProfileBits(p.meta));
    ExpectSameAsSource(src, images);
    skipped = ExpectCleanEverywhere(dir, images);
    if (skipped.empty()) {
      for (size_t i = 0; i < images.size(); ++i) ubtrfs_test::ExpectKernelReadsAllWithout(images, {i}, dir.Sub("mnt"));
    }
  }
  if (!skipped.empty()) GTEST_SKIP() << skipped;
}

// A filesystem growing from one device to an array, as users do it with
// the kernel (btrfs device add, then btrfs balance start -dconvert=...
// -mconvert=...): mkfs.btrfs makes it on one device (data single, metadata
// dup), a second device joins and every chunk becomes RAID1; a third, data
// RAID5 and metadata RAID1C3; then RAID0 and RAID6; a fourth, RAID10 and
// RAID1C4; and back to single and dup. After each step every chunk has the profile asked for with the
// stripes it needs, every file reads back, both checkers find it clean,
// the kernel shows the same files and, where the profiles keep copies or
// parity, reads all of them without each device in turn.
TEST(MultiDeviceBalance, ConvertsEveryChunkToTheProfileAsked) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-balance");
  const std::string src = dir.Sub("src");
  MakeSource(src);
  if (HasFatalFailure()) return;
  const auto images = MakeImages(dir, "dev", 4, 256 * kMiB);
  auto mk = RunCommand({"mkfs.btrfs", "-q", "-f", "-d", "single", "-m", "dup", "--rootdir", src, images[0]});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  std::vector<std::string> fs{images[0]};
  auto balance = [&](const std::vector<std::string>& opts) {
    std::vector<std::string> args{"balance"};
    args.insert(args.end(), opts.begin(), opts.end());
    args.insert(args.end(), fs.begin(), fs.end());
    return RunUbtrfs(args);
  };
  auto add = [&](const std::string& img) {
    std::vector<std::string> args{"device", "add", "-q"};
    args.insert(args.end(), fs.begin(), fs.end());
    args.push_back(img);
    auto r = RunUbtrfs(args);
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    fs.push_back(img);
  };
  auto r = balance({"--dconvert", "raid1"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("needs 2 devices"), std::string::npos) << r.err;
  r = balance({"--dconvert", "raid7"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("unknown data profile"), std::string::npos) << r.err;
  add(images[1]);
  std::string skipped;
  struct Step {
    std::string data, meta;
    bool redundant;
  };
  for (const Step& step : {Step{"raid1", "raid1", true}, Step{"raid5", "raid1c3", true}, Step{"raid0", "raid6", false},
                           Step{"raid10", "raid1c4", true}, Step{"single", "dup", false}}) {
    SCOPED_TRACE(step.data + "/" + step.meta);
    if (step.data == "raid5") add(images[2]);
    if (step.data == "raid10") add(images[3]);
    r = balance({"--dconvert", step.data, "--mconvert", step.meta});
    ASSERT_EQ(r.exit_code, 0) << r.Describe();
    EXPECT_NE(r.out.find("Converted"), std::string::npos) << r.out;
    ExpectExactDevices(fs, ProfileBits(step.data), ProfileBits(step.meta));
    if (step.data == "raid5") {
      // The features the kernel sets with such chunks.
      auto vol = OpenArray(fs);
      ASSERT_TRUE(vol.ok()) << vol.status().ToString();
      EXPECT_TRUE((*vol)->super().incompat_flags.get() & format::kIncompatRaid56);
      EXPECT_TRUE((*vol)->super().incompat_flags.get() & format::kIncompatRaid1c34);
    }
    ExpectSameAsSource(src, fs, /*mtimes=*/false);
    skipped = ExpectCleanEverywhere(dir, fs);
    if (skipped.empty() && step.redundant) {
      for (size_t i = 0; i < fs.size(); ++i) ubtrfs_test::ExpectKernelReadsAllWithout(fs, {i}, dir.Sub("mnt"));
    }
    if (step.meta == "raid6") {
      // Metadata down to one copy only when forced.
      r = balance({"--mconvert", "single"});
      EXPECT_EQ(r.exit_code, 1) << r.Describe();
      EXPECT_NE(r.err.find("reduces its redundancy"), std::string::npos) << r.err;
    }
  }
  if (!skipped.empty()) GTEST_SKIP() << skipped;
}

// A RAID5/6 array written until it is full: the copy that does not fit
// fails with ENOSPC and a clear message, everything committed stays
// readable and check-clean, and small files still go in where metadata has
// room (inline).
TEST(MultiDeviceFull, ParityArrayFillsUpWithEnospcAndStaysClean) {
  TempDir dir("ubtrfs-parity-full");
  for (const Layout& p : {Layout{"raid5", "raid5", 3}, Layout{"raid6", "raid6", 4}}) {
    SCOPED_TRACE(p.data);
    const auto images = MkfsArray(dir, p, 160 * kMiB);
    ASSERT_FALSE(images.empty());
    const std::string big = dir.Sub(p.data + "-big");
    ubtrfs_test::WriteHostFile(big, ubtrfs_test::SeededBytes(600 * kMiB, 5));
    auto cp = RunUbtrfs({"cp", big, JoinDevices(images) + ":/big"});
    EXPECT_NE(cp.exit_code, 0);
    EXPECT_NE(cp.err.find("No space left on device"), std::string::npos) << cp.Describe();
    ::unlink(big.c_str());
    const std::string note = dir.Sub(p.data + "-note");
    ubtrfs_test::WriteHostFile(note, "still room for this\n");
    auto cp2 = RunUbtrfs({"cp", note, JoinDevices(images) + ":/note"});
    EXPECT_EQ(cp2.exit_code, 0) << cp2.Describe();
    auto check = RunUbtrfs({"check", "--check-data-csum", JoinDevices(images)});
    EXPECT_EQ(check.exit_code, 0) << check.Describe();
    auto fs = Filesystem::Open(JoinDevices(images));
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_EQ(ubtrfs_test::ReadImageFile(**fs, "/note"), "still room for this\n");
  }
}

// The largest data extent (logical, length), from the extent tree.
std::pair<uint64_t, uint64_t> LargestDataExtent(txn::Volume& vol) {
  auto ext = vol.FindRoot(format::kExtentTreeObjectid);
  EXPECT_TRUE(ext.ok());
  if (!ext.ok()) return {0, 0};
  tree::Cursor c(vol.reader(), ext->ref);
  EXPECT_TRUE(c.SeekFirst().ok());
  std::pair<uint64_t, uint64_t> best{0, 0};
  while (c.Valid()) {
    const alloc::ChunkInfo* ch = vol.chunks().Find(c.key().objectid);
    if (c.key().type == format::kExtentItemKey && ch && (ch->type & format::kBlockGroupData) &&
        c.key().offset > best.second) {
      best = {c.key().objectid, c.key().offset};
    }
    if (!c.Next().ok()) break;
  }
  return best;
}

// Copies smashed in place (they read without error; only their checksums
// tell): 4 KiB of junk at each (devid, physical).
void SmashSpots(const std::map<uint64_t, std::string>& by_devid,
                const std::vector<std::pair<uint64_t, uint64_t>>& at) {
  for (auto [devid, phys] : at) {
    auto d = io::OpenFileDevice(by_devid.at(devid), io::OpenFlags{true});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_TRUE((*d)->WriteAt(phys, std::vector<uint8_t>(4096, 0x5a)).ok());
  }
}

// Where the copies of every 8th checksummed data sector (the first 16 MiB
// of each data chunk) and, with `roots`, of the fs and csum tree roots lie,
// as (logical, its copies). (Not the extent tree's: the first commit of a
// device remove moves it, and the old block is not copied.)
using Copies = std::vector<std::pair<uint64_t, std::vector<alloc::Piece>>>;
Copies SectorsAndRoots(const std::vector<std::string>& images, bool roots) {
  Copies out;
  auto vol = OpenArray(images);
  EXPECT_TRUE(vol.ok()) << vol.status().ToString();
  if (!vol.ok()) return out;
  auto add = [&](uint64_t logical) {
    auto m = (*vol)->chunks().Map(logical, 4096);
    EXPECT_TRUE(m.ok());
    if (!m.ok()) return;
    std::vector<alloc::Piece> copies;
    for (const auto& copy : *m) copies.push_back(copy.at(0));
    out.push_back({logical, copies});
  };
  for (uint64_t logical : ubtrfs_test::SampledDataSectors(**vol, 16 * kMiB, 8)) add(logical);
  for (uint64_t id : {format::kFsTreeObjectid, format::kCsumTreeObjectid}) {
    if (!roots) break;
    auto r = (*vol)->FindRoot(id);
    EXPECT_TRUE(r.ok());
    if (r.ok()) add(r->ref.bytenr);
  }
  return out;
}

// Moves verify what they read (txn/copy_check.h), as the kernel's replace
// does. On a RAID1 array over 3 devices, the copies on the device that goes
// are smashed (data sectors and tree roots), then it is removed: each
// smashed copy is taken from the other copy, so both checkers find the
// array clean. Then copy 1 of data sectors, which a balance to single reads
// first: the single copies are good. Then one sector of the single copy,
// and a balance back to RAID1: with no good copy it is copied as read, and
// named.
TEST(MultiDeviceMoves, CopiesAreVerifiedAsTheyAreRead) {
  TempDir dir("ubtrfs-copy-check");
  const std::string src = dir.Sub("src");
  MakeSource(src);
  if (HasFatalFailure()) return;
  auto images = MakeImages(dir, "raid1-", 3, 256 * kMiB);
  ASSERT_EQ(Mkfs(images, "raid1", "raid1", src).exit_code, 0);
  std::map<uint64_t, std::string> by_devid{{1, images[0]}, {2, images[1]}, {3, images[2]}};
  auto run = [&](std::vector<std::string> args, const std::vector<std::string>& tail = {}) {
    args.insert(args.end(), images.begin(), images.end());
    args.insert(args.end(), tail.begin(), tail.end());
    return RunUbtrfs(args);
  };
  auto expect_clean = [&]() {
    ExpectSameAsSource(src, images);
    auto check = RunUbtrfs({"check", "--check-data-csum", JoinDevices(images)});
    EXPECT_EQ(check.exit_code, 0) << check.Describe();
    auto scrub = RunUbtrfs({"scrub", "--readonly", JoinDevices(images)});
    EXPECT_EQ(scrub.exit_code, 0) << scrub.Describe();
  };

  // Device remove: the copies on the device that holds the second copy of
  // the first data sector.
  Copies spots = SectorsAndRoots(images, true);
  ASSERT_FALSE(spots.empty());
  const uint64_t victim = spots.front().second.at(1).devid;
  std::vector<std::pair<uint64_t, uint64_t>> smash;
  for (const auto& [logical, copies] : spots) {
    for (const auto& p : copies) {
      if (p.devid == victim) smash.push_back({p.devid, p.physical});
    }
  }
  ASSERT_GT(smash.size(), 20u);
  SmashSpots(by_devid, smash);
  auto r = run({"device", "remove", "-q"}, {std::to_string(victim)});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find(": " + std::to_string(smash.size()) + " copied from another copy that verifies, 0 with no"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("checksum mismatch; copied from copy "), std::string::npos) << r.err;
  images.erase(images.begin() + static_cast<long>(victim - 1));
  by_devid.erase(victim);
  expect_clean();

  // Balance to single: copy 1 of data sectors smashed.
  smash.clear();
  for (const auto& [logical, copies] : SectorsAndRoots(images, false)) {
    smash.push_back({copies.at(0).devid, copies.at(0).physical});
  }
  ASSERT_GT(smash.size(), 20u);
  SmashSpots(by_devid, smash);
  r = run({"balance", "-q", "--dconvert", "single"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find(": " + std::to_string(smash.size()) + " copied from another copy that verifies, 0 with no"),
            std::string::npos)
      << r.err;
  expect_clean();

  // Back to RAID1 with one bad sector in the only copy.
  const auto one = SectorsAndRoots(images, false).at(3);
  SmashSpots(by_devid, {{one.second.at(0).devid, one.second.at(0).physical}});
  r = run({"balance", "-q", "--dconvert", "raid1"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("data sector at logical " + std::to_string(one.first) +
                       ": checksum mismatch; no copy verifies, copied as read"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(": 1 tree blocks and data sectors failed verification as read: 0 copied from another copy "
                       "that verifies, 1 with no such copy copied as read"),
            std::string::npos)
      << r.err;
  auto check = RunUbtrfs({"check", "--check-data-csum", JoinDevices(images)});
  EXPECT_EQ(check.exit_code, 1) << check.Describe();
}

// A data sector damaged in place on its device (it reads without error;
// only its checksum tells), then a small file written into the next free
// space: the same row, the same column of the next data element. The
// write's read-modify-write must rebuild the damaged sector from the old
// parity before computing new parity; had it laid the damage into the new
// parity, that sector could never be read again. Judged by ubtrfs, by
// btrfs check, and by the kernel with each device gone in turn (so the
// sector is read from the parity ubtrfs wrote).
TEST(MultiDeviceParity, AWriteBesideADamagedSectorRebuildsItFirst) {
  TempDir dir("ubtrfs-parity-rmw");
  for (const Layout& p : {Layout{"raid5", "raid1", 3}, Layout{"raid6", "raid1", 4}}) {
    SCOPED_TRACE(p.data);
    const auto images = MkfsArray(dir, p, 256 * kMiB);
    ASSERT_FALSE(images.empty());
    // 328 KiB: more than two whole rows, ending inside a row's second element.
    const std::string a = dir.Sub(p.data + "-a"), b = dir.Sub(p.data + "-b");
    const std::string a_bytes = ubtrfs_test::SeededBytes(328 * 1024, 3);
    ubtrfs_test::WriteHostFile(a, a_bytes);
    ubtrfs_test::WriteHostFile(b, ubtrfs_test::SeededBytes(4096, 4));
    ASSERT_EQ(RunUbtrfs({"cp", a, JoinDevices(images) + ":/a"}).exit_code, 0);
    uint64_t next = 0, damaged_dev = 0, damaged_phys = 0;
    {
      auto vol = OpenArray(images);
      ASSERT_TRUE(vol.ok()) << vol.status().ToString();
      const auto [start, len] = LargestDataExtent(**vol);
      ASSERT_EQ(len, 328u * 1024);
      next = start + len;
      const alloc::ChunkInfo* ch = (*vol)->chunks().Find(next);
      ASSERT_NE(ch, nullptr);
      const uint64_t sl = ch->stripe_len, k = ch->data_stripes(), n = ch->stripes.size();
      const uint64_t off = next - ch->logical, row = off / (sl * k), e = off % (sl * k) / sl, col = off % sl;
      ASSERT_GE(e, 1u) << "the next write must not start a row";
      ASSERT_GE(ch->logical + row * sl * k + (e - 1) * sl + col, start) << "the sector beside it must be a's";
      const alloc::StripeLoc& loc = ch->stripes[(e - 1 + row) % n];
      damaged_dev = loc.devid;
      damaged_phys = loc.physical + row * sl + col;
    }
    {
      auto d = io::OpenFileDevice(images.at(damaged_dev - 1), io::OpenFlags{true});
      ASSERT_TRUE(d.ok());
      ASSERT_TRUE((*d)->WriteAt(damaged_phys, std::vector<uint8_t>(4096, 0x5a)).ok());
    }
    ASSERT_EQ(RunUbtrfs({"cp", b, JoinDevices(images) + ":/b"}).exit_code, 0);
    {
      // b went where the test meant it to go.
      auto vol = OpenArray(images);
      ASSERT_TRUE(vol.ok()) << vol.status().ToString();
      auto ext = (*vol)->FindRoot(format::kExtentTreeObjectid);
      ASSERT_TRUE(ext.ok());
      tree::Cursor c((*vol)->reader(), ext->ref);
      ASSERT_TRUE(c.Seek(format::Key{next, format::kExtentItemKey, 0}).ok());
      ASSERT_TRUE(c.Valid());
      EXPECT_EQ(c.key().objectid, next) << "b was written elsewhere: the test did not write beside the damage";
    }
    auto fs = Filesystem::Open(JoinDevices(images));
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_EQ(ubtrfs_test::ReadImageFile(**fs, "/a"), a_bytes);
    fs->reset();
    auto scrub = RunUbtrfs({"scrub", "--readonly", "--json", JoinDevices(images)});
    EXPECT_EQ(scrub.exit_code, 0) << scrub.Describe();
    std::string why;
    if (!ubtrfs_test::LoopMountsAvailable(&why)) {
      std::printf("kernel checks skipped: %s\n", why.c_str());
      continue;
    }
    auto check = ArrayMount::CheckOnce(images);
    EXPECT_TRUE(check.ok()) << check.Describe();
    const std::string mnt = dir.Sub(p.data + "-mnt");
    ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
    for (size_t gone = 0; gone < images.size(); ++gone) {
      SCOPED_TRACE("without device " + std::to_string(gone + 1));
      ubtrfs_test::ExpectKernelReadsAllWithout(images, {gone}, mnt);
    }
  }
}

// FNV-1a of a whole file: "nothing changed".
uint64_t Digest(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> buf(1 << 20);
  uint64_t h = 1469598103934665603ull;
  while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0) {
    for (std::streamsize i = 0; i < f.gcount(); ++i) {
      h = (h ^ static_cast<uint8_t>(buf[static_cast<size_t>(i)])) * 1099511628211ull;
    }
  }
  return h;
}

std::vector<uint64_t> Digests(const std::vector<std::string>& images) {
  std::vector<uint64_t> out;
  for (const auto& i : images) out.push_back(Digest(i));
  return out;
}

uint64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// resize DEVID:SIZE on an array, as btrfs filesystem resize: one device
// shrinks (its stripes past the new end move down on it, or to a device
// without a stripe of their chunk), grows, goes to `min`; its image file is
// cut or extended; the others keep their size; wrong device ids and sizes
// nothing fits in are refused. Judged by btrfs check and the kernel.
TEST(MultiDeviceResize, OneDeviceOfSeveralShrinksGrowsAndGoesToMin) {
  TempDir dir("ubtrfs-resize-dev");
  const std::string src = dir.Sub("src");
  MakeSource(src);
  for (const Layout& p : {Layout{"raid1", "raid1", 3}, Layout{"raid5", "raid1", 3}}) {
    SCOPED_TRACE(p.data);
    const auto images = MakeImages(dir, p.data + "-", p.devices, 400 * kMiB);
    ASSERT_EQ(Mkfs(images, p.data, p.meta, src).exit_code, 0);
    const std::string all = JoinDevices(images);
    if (p.data == "raid1") {
      // Nothing of device 2 fits below 40 MiB on it: RAID1 stripes move to
      // the device their chunk does not use yet.
      auto r = RunUbtrfs({"resize", all, "2:40M"});
      ASSERT_EQ(r.exit_code, 0) << r.Describe();
      EXPECT_NE(r.out.find("moved"), std::string::npos) << r.out;
      EXPECT_EQ(FileBytes(images[1]), 40 * kMiB);
      auto vol = OpenArray(images);
      ASSERT_TRUE(vol.ok()) << vol.status().ToString();
      for (const auto& [logical, c] : (*vol)->chunks().chunks()) {
        for (const auto& st : c.stripes) {
          if (st.devid == 2) {
            EXPECT_LE(st.physical + c.stripe_size, 40 * kMiB) << "chunk " << logical;
          }
        }
      }
    } else {
      auto r = RunUbtrfs({"resize", all, "2:min"});
      ASSERT_EQ(r.exit_code, 0) << r.Describe();
      EXPECT_LT(FileBytes(images[1]), 400 * kMiB);
    }
    auto grow = RunUbtrfs({"resize", "-q", all, "3:+100M"});
    ASSERT_EQ(grow.exit_code, 0) << grow.Describe();
    EXPECT_EQ(FileBytes(images[2]), 500 * kMiB);
    auto shrink = RunUbtrfs({"resize", "-q", all, "1:-100M"});
    ASSERT_EQ(shrink.exit_code, 0) << shrink.Describe();
    EXPECT_EQ(FileBytes(images[0]), 300 * kMiB);
    {
      auto vol = OpenArray(images);
      ASSERT_TRUE(vol.ok()) << vol.status().ToString();
      uint64_t total = 0;
      for (const auto& [id, item] : (*vol)->dev_items()) total += item.total_bytes.get();
      EXPECT_EQ((*vol)->super().total_bytes.get(), total);
      EXPECT_EQ((*vol)->dev_items().at(3).total_bytes.get(), 500 * kMiB);
    }
    // Refused, nothing changed.
    const auto before = Digests(images);
    auto bad = RunUbtrfs({"resize", all, "9:100M"});
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("no device 9"), std::string::npos) << bad.err;
    bad = RunUbtrfs({"resize", all, "x:100M"});
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("not a device id"), std::string::npos) << bad.err;
    EXPECT_EQ(Digests(images), before);
    ExpectSameAsSource(src, images);
    if (auto why = ExpectCleanEverywhere(dir, images); !why.empty()) std::printf("%s\n", why.c_str());
  }
}

void ExpectFails(const std::vector<std::string>& args, const std::string& message) {
  auto r = RunUbtrfs(args);
  EXPECT_NE(r.exit_code, 0) << ubtrfs_test::ShellJoin(args);
  EXPECT_NE(r.err.find(message), std::string::npos) << ubtrfs_test::ShellJoin(args) << ": " << r.err;
}

TEST(MultiDeviceArgs, WrongArgumentsGiveClearErrorsAndChangeNothing) {
  TempDir dir("ubtrfs-device-args");
  // mkfs: an unknown profile, too few devices: no file is made.
  const std::string a = dir.Sub("a.img"), b = dir.Sub("b.img"), c = dir.Sub("c.img");
  ExpectFails({"mkfs", "--size", "128M", "-d", "raid7", a, b}, "unknown profile");
  ExpectFails({"mkfs", "--size", "128M", "-m", "raid1c3", a, b}, "needs at least 3 devices; 2 were given");
  ExpectFails({"mkfs", "--size", "128M", "-d", "raid1", a}, "needs at least 2 devices; 1 was given");
  ExpectFails({"mkfs", "--size", "128M", "-d", "raid6", a, b}, "needs at least 3 devices; 2 were given");
  for (const auto& f : {a, b, c}) EXPECT_NE(::access(f.c_str(), F_OK), 0) << f << " was made";
  // Existing files stay as they are.
  const auto loose = MakeImages(dir, "loose", 2, 128 * kMiB);
  const auto loose_before = Digests(loose);
  ExpectFails({"mkfs", "-m", "raid1c4", loose[0], loose[1]}, "needs at least 4 devices");
  EXPECT_EQ(Digests(loose), loose_before);

  // device remove: the only device; below RAID1's two; an unknown devid.
  const auto one = MakeImages(dir, "one", 1, 128 * kMiB);
  ASSERT_EQ(RunUbtrfs({"mkfs", "-q", one[0]}).exit_code, 0);
  const auto one_before = Digests(one);
  ExpectFails({"device", "remove", one[0], "1"}, "unable to remove the only device");
  ExpectFails({"device", "remove", one[0], one[0]}, "unable to remove the only device");
  EXPECT_EQ(Digests(one), one_before);

  const auto pair = MakeImages(dir, "pair", 2, 128 * kMiB);
  ASSERT_EQ(Mkfs(pair, "raid1", "raid1").exit_code, 0);
  const auto pair_before = Digests(pair);
  ExpectFails({"device", "remove", pair[0], pair[1], "2"}, "unable to go below 2 devices on raid1");
  ExpectFails({"device", "remove", pair[0], pair[1], "7"}, "has no device 7");
  ExpectFails({"device", "remove", pair[0], pair[1], dir.Sub("elsewhere.img")}, "is not a device of this filesystem");
  // device add: one of its own devices, a file that is not there.
  ExpectFails({"device", "add", pair[0], pair[1], pair[1]}, "is named as a device of the filesystem already");
  ExpectFails({"device", "add", pair[0], pair[1], dir.Sub("missing.img")}, "does not exist");
  ExpectFails({"device", "add", pair[0], pair[1]}, "it is a device of the filesystem already");  // pair[1]: NEWDEV
  // One member alone is a degraded filesystem: resize, remove, replace and
  // balance refuse it without --degraded.
  ExpectFails({"resize", pair[0], "100M"}, "degraded");
  ExpectFails({"device", "remove", pair[0], "1"}, "--degraded");
  const auto fresh = MakeImages(dir, "fresh", 1, 128 * kMiB);
  ExpectFails({"device", "replace", pair[0], "1", fresh[0]}, "--degraded");
  ExpectFails({"device", "replace", pair[0], pair[1], "7", fresh[0]}, "has no device 7");
  ExpectFails({"device", "replace", pair[0], pair[1], "2", dir.Sub("missing.img")}, "does not exist");
  ExpectFails({"balance", "--dconvert", "single", pair[0]}, "--degraded");
  ExpectFails({"balance", "--dconvert", "raid1", "--mconvert", "raid7", pair[0], pair[1]}, "unknown metadata profile");
  // Nothing to do: nothing written.
  auto same = RunUbtrfs({"balance", "--dconvert", "raid1", pair[0], pair[1]});
  EXPECT_EQ(same.exit_code, 0) << same.Describe();
  EXPECT_NE(same.out.find("Converted 0 chunks"), std::string::npos) << same.out;
  EXPECT_EQ(Digests(pair), pair_before);
  // Another filesystem on the new device needs --force.
  ExpectFails({"device", "add", pair[0], pair[1], one[0]}, "use --force to overwrite it");
  EXPECT_EQ(Digests(one), one_before);
  EXPECT_EQ(Digests(pair), pair_before);

  // A RAID0 chunk over both devices must be restriped onto the one left,
  // which has no room for it.
  const auto two = MakeImages(dir, "two", 2, 128 * kMiB);
  ASSERT_EQ(Mkfs(two, "raid0", "dup").exit_code, 0);
  const auto two_before = Digests(two);
  ExpectFails({"device", "remove", two[0], two[1], "1"}, "must be restriped over the other 1 devices, and they have no room");
  EXPECT_EQ(Digests(two), two_before);
}

}  // namespace

namespace UBTRFS_UNITY_ID {

// --scan works for device add and remove as for every subcommand (after
// the images: --scan takes every word up to the next option).
TEST(MultiDeviceArgs, DeviceAddAndRemoveFindMembersWithScan) {
  TempDir dir("ubtrfs-device-scan");
  const std::string members = dir.Sub("members");
  ASSERT_EQ(::mkdir(members.c_str(), 0755), 0);
  const std::string a = members + "/a.img", b = members + "/b.img", c = members + "/c.img";
  ASSERT_EQ(RunUbtrfs({"mkfs", "-q", "--size", "128M", a, b}).exit_code, 0);
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(c, 128 * kMiB, &err)) << err;
  auto add = RunUbtrfs({"device", "add", a, c, "--scan", members});
  ASSERT_EQ(add.exit_code, 0) << add.Describe();
  EXPECT_NE(add.out.find("as device 3: 3 devices"), std::string::npos) << add.out;
  auto rm = RunUbtrfs({"device", "remove", a, "2", "--scan", members});
  ASSERT_EQ(rm.exit_code, 0) << rm.Describe();
  ExpectExactDevices({a, c}, 0, format::kBlockGroupRaid1);
  auto check = RunUbtrfs({"check", a + "," + c});
  EXPECT_EQ(check.exit_code, 0) << check.Describe();
}

}  // namespace

namespace UBTRFS_UNITY_ID {

// A power cut at every write of a device remove that restripes a RAID0
// chunk and moves RAID1 stripes (three recorded devices, writes
// interleaved): whatever the devices hold then opens -- all three before the
// final commit, the two left after it -- and every file reads back.
// Runs `change` over the array in `images` (recorded), then cuts the power
// after every write of any device, in both crash modes: each cut opens over
// all the devices or, once the change's last commit may be on them,
// without device `leaving` (-1: none leaves), every file of `model` reads
// back, and every 20th cut is ubtrfs-check clean. Returns the cuts that
// opened with all devices and without `leaving`.
std::pair<size_t, size_t> PowerCutAtEveryWrite(const std::vector<std::string>& images,
                                               const std::map<std::string, std::string>& model, int leaving,
                                               const std::function<void(txn::TxnManager*)>& change) {
  std::vector<std::unique_ptr<io::RecordingDevice>> recs;
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string bytes = ubtrfs_test::ReadHostFile(images[i]);
    recs.push_back(std::make_unique<io::RecordingDevice>(
        "dev" + std::to_string(i + 1),
        io::SparseImage::FromBytes(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()))));
  }
  std::vector<int> order;
  std::mutex mu;
  {
    std::vector<std::unique_ptr<io::BlockDevice>> devs;
    for (size_t i = 0; i < recs.size(); ++i) {
      devs.push_back(std::make_unique<ubtrfs_test::TaggedDevice>(recs[i].get(), static_cast<int>(i), &order, &mu));
    }
    txn::VolumeOptions vo;
    vo.writable = true;
    auto vol = txn::Volume::Open(std::move(devs), vo);
    EXPECT_TRUE(vol.ok()) << vol.status().ToString();
    if (!vol.ok()) return {0, 0};
    auto txm = txn::TxnManager::Open(vol->get());
    EXPECT_TRUE(txm.ok()) << txm.status().ToString();
    if (!txm.ok()) return {0, 0};
    change(txm->get());
  }
  std::vector<std::unique_ptr<io::CrashReplayer>> reps;
  for (auto& r : recs) {
    reps.push_back(std::make_unique<io::CrashReplayer>(r.get()));
    for (int m = 0; m < format::kSuperMirrorMax; ++m) reps.back()->AddAtomicRange(format::SuperblockOffset(m), 4096);
  }
  size_t points = 0, failures = 0, all_devices = 0, fewer = 0;
  std::vector<size_t> done(recs.size(), 0);
  for (size_t k = 0; k <= order.size(); ++k) {
    if (k > 0) ++done[static_cast<size_t>(order[k - 1])];
    for (io::CrashMode mode : {io::CrashMode::kPrefix, io::CrashMode::kDropUnflushed}) {
      ++points;
      auto materialize = [&](bool with_leaving) {
        std::vector<std::unique_ptr<io::BlockDevice>> devs;
        for (size_t i = 0; i < reps.size(); ++i) {
          if (static_cast<int>(i) == leaving && !with_leaving) continue;
          auto img = reps[i]->Materialize(io::CrashPoint{done[i], mode, 0});
          EXPECT_TRUE(img.ok());
          if (img.ok()) devs.push_back(std::move(*img));
        }
        return devs;
      };
      auto fs = OpenOnDevices(materialize(true), OpenOptions{});
      bool all = fs.ok();
      if (!fs.ok() && leaving >= 0) fs = OpenOnDevices(materialize(false), OpenOptions{});
      std::string why;
      if (!fs.ok()) {
        why = fs.status().ToString();
      } else {
        (all ? all_devices : fewer)++;
        for (const auto& [name, data] : model) {
          if (ubtrfs_test::ReadImageFile(**fs, "/" + name) != data) why += " /" + name + " differs;";
        }
      }
      if (why.empty() && k % 20 == 0) {
        auto vol = txn::Volume::Open(materialize(all), txn::VolumeOptions{});
        if (!vol.ok()) {
          why = vol.status().ToString();
        } else if (auto res = check::CheckVolume(**vol, check::CheckOptions{}); !res.clean()) {
          why = "ubtrfs check: " + JoinDevices(res.errors, "; ");
        }
      }
      if (!why.empty()) {
        ++failures;
        ADD_FAILURE() << "cut after " << k << " of " << order.size() << " (" << io::CrashModeName(mode) << "): " << why;
      }
    }
    if (failures > 5) break;
  }
  std::printf("%zu log entries over %zu devices, %zu crash points (%zu open with every device, %zu without the "
              "leaving one), %zu failures\n",
              order.size(), images.size(), points, all_devices, fewer, failures);
  EXPECT_EQ(failures, 0u);
  return {all_devices, fewer};
}

// Files of seeded bytes in `src`, as `model` has them.
void MakeModel(const std::string& src, std::map<std::string, std::string>* model) {
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  for (int i = 0; i < 12; ++i) {
    const std::string name = "f" + std::to_string(i);
    (*model)[name] = ubtrfs_test::SeededBytes(i == 0 ? 0 : static_cast<size_t>(i) * 97531, 900 + i);
    ubtrfs_test::WriteHostFile(src + "/" + name, (*model)[name]);
  }
}

TEST(MultiDeviceCrash, RemoveDevicePowerCutAtEveryWrite) {
  TempDir dir("ubtrfs-remove-crash");
  const std::string src = dir.Sub("src");
  std::map<std::string, std::string> model;
  MakeModel(src, &model);
  const auto images = MakeImages(dir, "dev", 3, 256 * kMiB);
  ASSERT_EQ(Mkfs(images, "raid0", "raid1", src).exit_code, 0);
  txn::RemoveStats stats;
  auto [three, two] = PowerCutAtEveryWrite(images, model, 1, [&](txn::TxnManager* txm) {
    Status st = txn::RemoveDeviceCommitted(txm, 2, &stats);
    ASSERT_TRUE(st.ok()) << st.ToString();
  });
  EXPECT_GE(stats.chunks_restriped, 1u);
  EXPECT_GE(stats.stripes_moved, 1u);
  EXPECT_GT(three, 0u);
  EXPECT_GT(two, 0u);
}

// A profile conversion (balance) over 2 devices: data RAID0 to RAID1,
// metadata and system RAID1 to DUP, each chunk laid out anew in one commit;
// a cut anywhere leaves every chunk in its old layout or its new one.
TEST(MultiDeviceCrash, ConvertPowerCutAtEveryWrite) {
  TempDir dir("ubtrfs-convert-crash");
  const std::string src = dir.Sub("src");
  std::map<std::string, std::string> model;
  MakeModel(src, &model);
  // (room for the RAID1 copies of mkfs's RAID0 data chunk beside it)
  const auto images = MakeImages(dir, "dev", 2, 512 * kMiB);
  ASSERT_EQ(Mkfs(images, "raid0", "raid1", src).exit_code, 0);
  txn::CopyStats copied;
  uint64_t converted = 0;
  PowerCutAtEveryWrite(images, model, -1, [&](txn::TxnManager* txm) {
    txn::DeviceLayout layout(txm);
    layout.AllocateAs(format::kBlockGroupData, format::kBlockGroupRaid1);
    layout.AllocateAs(format::kBlockGroupMetadata, format::kBlockGroupDup);
    layout.AllocateAs(format::kBlockGroupSystem, format::kBlockGroupDup);
    std::vector<std::pair<uint64_t, uint64_t>> todo;  // logical, profile
    for (const auto& [logical, c] : txm->volume()->chunks().chunks()) {
      todo.push_back({logical, (c.type & format::kBlockGroupData) ? format::kBlockGroupRaid1 : format::kBlockGroupDup});
    }
    for (auto [logical, profile] : todo) {
      Status st = layout.ConvertChunk(logical, profile, &copied);
      ASSERT_TRUE(st.ok()) << st.ToString();
      st = txm->Commit();
      ASSERT_TRUE(st.ok()) << st.ToString();
      ++converted;
    }
  });
  EXPECT_GE(converted, 3u);
  EXPECT_GT(copied.bytes, 0u);
}

}  // namespace
