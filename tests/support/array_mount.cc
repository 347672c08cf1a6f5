#include "support/array_mount.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "support/host_files.h"
#include "support/tree_compare.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {

namespace {

std::string Attach(const std::string& img, std::string* err) {
  auto r = RunCommand({"losetup", "-f", "--show", img});
  // The free device it found may be taken by a test beside this one first.
  for (int i = 0; i < 5 && !r.ok(); ++i) {
    usleep(200000);
    r = RunCommand({"losetup", "-f", "--show", img});
  }
  if (!r.ok()) {
    *err = "losetup " + img + ": " + r.Describe();
    return "";
  }
  std::string dev = r.out;
  while (!dev.empty() && (dev.back() == '\n' || dev.back() == ' ')) dev.pop_back();
  return dev;
}

}  // namespace

std::string ArrayMount::Mount(const std::vector<std::string>& images, const std::string& dir, const std::string& opts) {
  for (const auto& img : images) {
    std::string err;
    const std::string dev = Attach(img, &err);
    if (dev.empty()) return err;
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

CommandResult ArrayMount::Check(const std::vector<std::string>& images) {
  for (const auto& img : images) {
    std::string err;
    const std::string dev = Attach(img, &err);
    if (dev.empty()) {
      CommandResult r;
      r.err = err;
      return r;
    }
    loops_.push_back(dev);
  }
  // Only these devices: a scan of every block device would register other
  // tests' loop devices with the kernel too.
  std::vector<std::string> scan{"btrfs", "device", "scan"};
  scan.insert(scan.end(), loops_.begin(), loops_.end());
  RunCommand(scan);
  return RunCommand({"btrfs", "check", "--readonly", loops_.front()});
}

void ArrayMount::Unmount() {
  if (!dir_.empty()) RunCommand({"umount", dir_});
  dir_.clear();
  for (const auto& l : loops_) RunCommand({"losetup", "-d", l});
  loops_.clear();
}

void MakeArraySource(const std::string& src, size_t largest) {
  constexpr size_t kMiB = 1u << 20;
  ::mkdir(src.c_str(), 0755);
  ::mkdir((src + "/d").c_str(), 0755);
  ::mkdir((src + "/d/e").c_str(), 0700);
  const size_t sizes[] = {0, 1, 4095, 4096, 65537, 300000, 3 * kMiB + 123, largest};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    WriteHostFile(src + (i % 2 ? "/d/f" : "/f") + std::to_string(i), SeededBytes(sizes[i], 100 + i));
  }
  for (int i = 0; i < 50; ++i) WriteHostFile(src + "/d/e/small" + std::to_string(i), SeededBytes(i * 97, i));
  ASSERT_EQ(::symlink("d/f1", (src + "/link").c_str()), 0);
}

std::string JoinDevices(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

void ExpectKernelReadsAllWithout(const std::vector<std::string>& images, const std::vector<size_t>& gone,
                                 const std::string& mnt) {
  std::vector<std::string> left;
  std::string what = "the kernel without device";
  for (size_t i = 0; i < images.size(); ++i) {
    if (std::find(gone.begin(), gone.end(), i) == gone.end()) {
      left.push_back(images[i]);
    } else {
      what += " " + std::to_string(i + 1);
    }
  }
  SCOPED_TRACE(what);
  auto fs = ubtrfs::Filesystem::Open(JoinDevices(images));
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  ArrayMount m;
  ASSERT_EQ(m.Mount(left, mnt, "degraded,ro"), "");
  auto diffs = CompareTreeToImage(mnt, **fs, KernelMountCompareOptions());
  EXPECT_TRUE(diffs.empty()) << JoinDevices(diffs, "\n");
}

std::vector<uint64_t> SampledDataSectors(ubtrfs::txn::Volume& vol, uint64_t first_bytes, size_t step) {
  std::vector<uint64_t> out;
  const uint32_t ss = vol.sectorsize();
  for (const auto& [logical, c] : vol.chunks().chunks()) {
    if (!(c.type & ubtrfs::format::kBlockGroupData)) continue;
    const size_t n = std::min<uint64_t>(c.length, first_bytes) / ss;
    std::vector<uint8_t> csums;
    std::vector<bool> present;
    ubtrfs::Status st = vol.LookupCsums(logical, n, &csums, &present);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) break;
    for (size_t i = 0; i < n; i += step) {
      if (present[i]) out.push_back(logical + i * ss);
    }
  }
  return out;
}

}  // namespace ubtrfs_test
