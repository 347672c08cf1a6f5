// Simple quotas (squota, kernel 6.7+) kept by ubtrfs as the kernel keeps
// them, on an image the kernel made: every extent is charged to its owner
// when created and credited when freed (src/txn/simple_quota.cc). CI's
// btrfs-progs (6.2) can neither enable simple quotas nor open such an image,
// so the test enables them with the ioctl itself, and the judges are:
//   - ubtrfs check, which recounts every qgroup from the extent tree by the
//     rule btrfs check 6.7+ uses (first tried on the kernel's own image);
//   - the kernel, which must go on accounting from what ubtrfs wrote: it
//     frees extents ubtrfs made (crediting the owner ubtrfs recorded) and
//     the recount must still agree;
//   - numbers known in advance where no tree layout enters them: a new
//     subvolume holding one file is charged the file and one leaf.
#include <fcntl.h>
#include <linux/btrfs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "check/checker.h"
#include "format/checksum.h"
#include "format/ondisk.h"
#include "io/block_device.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/open_txn.h"
#include "support/test_util.h"
#include "tree/cursor.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

// Not in the uapi headers before 6.7.
constexpr uint64_t kQuotaCtlEnableSimpleQuota = 4;

// `btrfs quota enable --simple` (progs 6.7+) by hand: "" or why not.
std::string EnableSimpleQuotas(const std::string& mnt) {
  const int fd = open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return mnt + ": " + std::strerror(errno);
  btrfs_ioctl_quota_ctl_args args{};
  args.cmd = kQuotaCtlEnableSimpleQuota;
  const int rc = ioctl(fd, BTRFS_IOC_QUOTA_CTL, &args);
  const int err = errno;
  close(fd);
  return rc == 0 ? "" : std::string("BTRFS_IOC_QUOTA_CTL(ENABLE_SIMPLE_QUOTA): ") + std::strerror(err);
}

// qgroup id ("0/256") -> referenced bytes, as the kernel shows them.
std::map<std::string, uint64_t> KernelQgroups(const std::string& mnt) {
  std::map<std::string, uint64_t> out;
  CommandResult r = RunCommand({"btrfs", "qgroup", "show", "--raw", mnt});
  EXPECT_TRUE(r.ok()) << r.Describe();
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id;
    uint64_t rfer = 0, excl = 0;
    if (!(f >> id >> rfer >> excl) || id.find('/') == std::string::npos) continue;
    EXPECT_EQ(rfer, excl) << "simple quotas count a qgroup's bytes as both: " << line;
    out[id] = rfer;
  }
  return out;
}

// ubtrfs check of the image, its simple quota recount included: "" or the
// first problem. With UBTRFS_SQUOTA_BTRFS naming a btrfs-progs 6.7+ binary
// (CI's 6.2 cannot open these images), its qgroup check must pass too.
std::string RecountProblems(const std::string& img) {
  if (const char* progs = std::getenv("UBTRFS_SQUOTA_BTRFS"); progs != nullptr && *progs != '\0') {
    // Its qgroup check alone: the kernel's image from CI's mkfs 6.2 has free
    // space items that check 6.19 calls stale.
    CommandResult r = RunCommand({progs, "check", "--qgroup-report", img});
    if (!r.ok() || r.out.find("are different") != std::string::npos) return "btrfs check -Q: " + r.Describe();
  }
  auto check = ubtrfs::check::CheckImage(img);
  if (!check.ok()) return check.status().ToString();
  for (const auto& w : check->warnings) {
    if (w.find("quota groups are not verified") != std::string::npos) return "the qgroups were not recounted";
  }
  if (check->clean()) return "";
  return std::to_string(check->error_count) + " errors, first: " + check->errors.front();
}

// Adds `bytes` to what the quota tree stores for `qgroup`, in every copy of
// its leaf (checksum recomputed); returns what to write back to undo it.
std::vector<std::pair<uint64_t, std::vector<uint8_t>>> SkewQgroup(const std::string& img, uint64_t qgroup,
                                                                  uint64_t bytes) {
  namespace fmt = ubtrfs::format;
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> undo;
  auto dev = ubtrfs::io::OpenFileDevice(img);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  if (!dev.ok()) return undo;
  auto vol = ubtrfs::txn::Volume::Open(std::move(*dev), ubtrfs::txn::VolumeOptions{});
  EXPECT_TRUE(vol.ok()) << vol.status().ToString();
  if (!vol.ok()) return undo;
  auto quota = (*vol)->FindRoot(fmt::kQuotaTreeObjectid);
  EXPECT_TRUE(quota.ok()) << quota.status().ToString();
  if (!quota.ok()) return undo;
  ubtrfs::tree::Cursor c((*vol)->reader(), quota->ref);
  const fmt::Key key{0, fmt::kQgroupInfoKey, qgroup};
  EXPECT_TRUE(c.Seek(key).ok());
  EXPECT_TRUE(c.Valid() && c.key() == key) << "no QGROUP_INFO for " << qgroup;
  if (!c.Valid() || c.key() != key) return undo;
  const uint64_t leaf = c.leaf().bytenr();
  const int slot = c.slot();
  const uint32_t ns = (*vol)->nodesize();
  const uint16_t csum_type = (*vol)->csum_type();
  auto copies = (*vol)->chunks().MapPhysical(leaf, ns);
  EXPECT_TRUE(copies.ok()) << copies.status().ToString();
  if (!copies.ok()) return undo;
  const int fd = open(img.c_str(), O_RDWR);
  for (uint64_t at : *copies) {
    std::vector<uint8_t> b(ns);
    EXPECT_EQ(pread(fd, b.data(), ns, static_cast<off_t>(at)), static_cast<ssize_t>(ns));
    undo.push_back({at, b});
    auto* item = reinterpret_cast<fmt::Item*>(b.data() + sizeof(fmt::Header)) + slot;
    auto* info = reinterpret_cast<fmt::QgroupInfoItem*>(b.data() + sizeof(fmt::Header) + item->offset.get());
    info->rfer = info->rfer.get() + bytes;
    info->excl = info->excl.get() + bytes;
    auto sum = fmt::ComputeCsum(csum_type, std::span<const uint8_t>(b).subspan(fmt::kCsumSize));
    std::memcpy(b.data(), sum.data(), fmt::kCsumSize);
    EXPECT_EQ(pwrite(fd, b.data(), ns, static_cast<off_t>(at)), static_cast<ssize_t>(ns));
  }
  close(fd);
  return undo;
}

void WriteBack(const std::string& img, const std::vector<std::pair<uint64_t, std::vector<uint8_t>>>& blocks) {
  const int fd = open(img.c_str(), O_RDWR);
  for (const auto& [at, b] : blocks) {
    EXPECT_EQ(pwrite(fd, b.data(), b.size(), static_cast<off_t>(at)), static_cast<ssize_t>(b.size()));
  }
  close(fd);
}

TEST(SimpleQuotas, KeptAsTheKernelKeepsThem) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel makes the simple quota image: " << why;
  TempDir tmp("ubtrfs-squota");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 1ull << 30), "");  // small nodes: trees of several levels
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    WriteHostFile(mnt + "/pre", SeededBytes(1u << 20, 1));  // older than the quotas: nobody's
    ASSERT_EQ(MustRun({"sync"}), "");
    if (std::string e = EnableSimpleQuotas(mnt); !e.empty()) {
      ASSERT_EQ(m.Unmount(), "");
      GTEST_SKIP() << "this kernel has no simple quotas (6.7+): " << e;
    }
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "create", mnt + "/sv"}), "");
    for (int i = 0; i < 300; ++i) WriteHostFile(mnt + "/sv/f" + std::to_string(i), SeededBytes(5000 + i * 41, i));
    WriteHostFile(mnt + "/sv/big", SeededBytes(3u << 20, 1000));
    WriteHostFile(mnt + "/top", SeededBytes(300u << 10, 1001));
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "snapshot", mnt + "/sv", mnt + "/ksnap"}), "");
    ASSERT_EQ(MustRun({"btrfs", "qgroup", "create", "1/100", mnt}), "");
    ASSERT_EQ(MustRun({"btrfs", "qgroup", "assign", "0/256", "1/100", mnt}), "");
    ASSERT_EQ(MustRun({"btrfs", "qgroup", "limit", "40M", mnt + "/sv"}), "");
    ASSERT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(RecountProblems(img), "") << "the recount disagrees with the kernel's own numbers";
  {
    const auto undo = SkewQgroup(img, 256, 4096);
    ASSERT_FALSE(undo.empty());
    EXPECT_NE(RecountProblems(img).find("0/256"), std::string::npos) << "the recount misses a skewed qgroup";
    WriteBack(img, undo);
  }

  auto step = [&](const std::string& what, const std::function<void(ubtrfs::Filesystem&)>& change) {
    SCOPED_TRACE(what);
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    change(**fs);
    ASSERT_TRUE((*fs)->Commit().ok());
    fs->reset();
    EXPECT_EQ(RecountProblems(img), "") << "after " << what;
  };
  step("writes, an overwrite and removals in a subvolume and its snapshot", [&](ubtrfs::Filesystem& f) {
    PutFile(f, "/sv", "new", SeededBytes(1u << 20, 7));
    ASSERT_TRUE(f.Unlink(MustLookup(f, "/ksnap"), "f3").ok());  // still sv's: no credit
    ASSERT_TRUE(f.Unlink(MustLookup(f, "/sv"), "f4").ok());     // still in ksnap: no credit
    ASSERT_TRUE(f.Write(MustLookup(f, "/ksnap/big"), 1u << 20, SpanOf(SeededBytes(64u << 10, 8))).ok());
    ASSERT_TRUE(f.Unlink(f.Root(), "pre").ok());  // older than the quotas: credits nobody
  });
  step("snapshots: in the top level, and inside a subvolume of qgroup 1/100", [&](ubtrfs::Filesystem& f) {
    ASSERT_TRUE(f.CreateSnapshot(MustLookup(f, "/sv"), f.Root(), "snap2", false).ok());
    ASSERT_TRUE(f.CreateSnapshot(MustLookup(f, "/sv"), MustLookup(f, "/sv"), "inner", false).ok());
  });
  step("writes in the new snapshots", [&](ubtrfs::Filesystem& f) {
    PutFile(f, "/snap2", "more", SeededBytes(700u << 10, 9));
    PutFile(f, "/sv/inner", "deep", SeededBytes(500u << 10, 10));
  });
  step("a new subvolume, and a reflink of its file into another", [&](ubtrfs::Filesystem& f) {
    auto sv3 = f.CreateSubvolume(f.Root(), "sv3", ubtrfs::NewInode{0755});
    ASSERT_TRUE(sv3.ok()) << sv3.status().ToString();
    PutFile(f, "/sv3", "x", SeededBytes(2u << 20, 11));
    auto dst = f.Create(MustLookup(f, "/sv"), "rx", ubtrfs::NewInode{0644});
    ASSERT_TRUE(dst.ok());
    ASSERT_TRUE(f.Clone(MustLookup(f, "/sv3/x"), 0, *dst, 0, 0).ok());
  });
  step("a limit gives EDQUOT", [&](ubtrfs::Filesystem& f) {
    auto big = f.Create(MustLookup(f, "/sv"), "too-big", ubtrfs::NewInode{0644});
    ASSERT_TRUE(big.ok());
    auto w = f.Write(*big, 0, SpanOf(SeededBytes(48u << 20, 12)));
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), EDQUOT) << w.status().ToString();
    PutFile(f, "/sv", "fits", SeededBytes(1u << 20, 13));  // the failed write took nothing
    // Snapshots of simple quotas do not inherit limits (the kernel copies
    // them only for full qgroups).
    PutFile(f, "/snap2", "big-in-snapshot", SeededBytes(48u << 20, 14));
  });
  step("a subvolume deletion", [&](ubtrfs::Filesystem& f) {
    ASSERT_TRUE(f.DeleteSubvolume(f.Root(), "ksnap").ok());
  });

  // Balance moves every extent, as the kernel's relocation counts it: a
  // data extent's copy is charged to the original's owner, which the
  // original's freeing credits (one from before quotas stays nobody's); a
  // tree block's copy is charged to its tree, and only blocks from before
  // quotas were never charged (the kernel's "double count").
  std::map<std::string, uint64_t> unbalanced;
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    unbalanced = KernelQgroups(mnt);
    ASSERT_EQ(m.Unmount(), "");
  }
  CommandResult bal = RunUbtrfs({"balance", "-dusage=100", "-musage=100", img});
  ASSERT_EQ(bal.exit_code, 0) << bal.Describe();
  EXPECT_NE(bal.out.find("Relocated"), std::string::npos) << bal.out;
  EXPECT_EQ(RecountProblems(img), "") << "after the balance";

  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt), "");
  auto before = KernelQgroups(mnt);
  for (const auto& [id, bytes] : unbalanced) {
    if (id == "0/5") {
      EXPECT_GE(before[id], bytes);
      EXPECT_LE(before[id], bytes + (64u << 10)) << "the top level's blocks from before the quotas";
    } else {
      EXPECT_EQ(before[id], bytes) << id << " changed in the balance";
    }
  }
  // A subvolume with one file in one leaf: the file's extent and that leaf.
  // Subvolume ids: sv 256, ksnap 257, snap2 258, sv/inner 259, sv3 260.
  EXPECT_EQ(before["0/260"], (2u << 20) + 4096) << "sv3";
  // 1/100 holds sv and, joined at its creation, sv/inner.
  EXPECT_EQ(before["1/100"], before["0/256"] + before["0/259"]);
  EXPECT_EQ(before.count("0/257"), 0u) << "the qgroup of the dropped ksnap, owning nothing, is gone";
  // The kernel goes on from there: the reflinked extent ubtrfs made in sv3
  // is freed from sv, and sv3 (its owner) gets it back.
  ASSERT_EQ(unlink((mnt + "/sv3/x").c_str()), 0);
  ASSERT_EQ(MustRun({"sync"}), "");
  ASSERT_EQ(unlink((mnt + "/sv/rx").c_str()), 0);
  WriteHostFile(mnt + "/sv/inner/kernel", SeededBytes(200u << 10, 12));
  ASSERT_EQ(MustRun({"sync"}), "");
  auto after = KernelQgroups(mnt);
  EXPECT_EQ(after["0/260"], before["0/260"] - (2u << 20)) << "the kernel credited the owner ubtrfs recorded";
  EXPECT_EQ(ReadHostFile(mnt + "/snap2/more"), SeededBytes(700u << 10, 9));
  ASSERT_EQ(m.Unmount(), "");
  EXPECT_EQ(RecountProblems(img), "") << "after the kernel wrote on";
}

// A kernel tree log on an image with simple quotas (fsyncs, then the power
// cut): ubtrfs's replay inserts the logged extents as the kernel's
// btrfs_alloc_logged_file_extent does, owner ref and charge included, and
// the kernel later credits them to that owner.
TEST(SimpleQuotas, ReplayOfAKernelLogChargesTheLoggedExtents) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel writes the log: " << why;
  TempDir tmp("ubtrfs-squota-log");
  const std::string img = tmp.Sub("img"), copy = tmp.Sub("copy"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 16384, "crc32c", 1ull << 30), "");
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "commit=3600"), "");
    if (std::string e = EnableSimpleQuotas(mnt); !e.empty()) {
      ASSERT_EQ(m.Unmount(), "");
      GTEST_SKIP() << "this kernel has no simple quotas (6.7+): " << e;
    }
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "create", mnt + "/sv"}), "");
    WriteHostFile(mnt + "/sv/committed", SeededBytes(3u << 20, 1));
    ASSERT_EQ(MustRun({"sync"}), "");
    for (const char* name : {"b", "c"}) {
      ASSERT_EQ(ubtrfs_test::WriteAndFsync(mnt + "/sv/" + name, SeededBytes(2u << 20, name[0])), "");
    }
    std::filesystem::copy_file(img, copy);  // the power cut, before any commit
    ASSERT_EQ(m.Unmount(), "");
  }
  if (ubtrfs_test::LogRootOf(copy) == 0) GTEST_SKIP() << "the kernel committed before the copy";
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(copy, o);  // replays and commits
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    PutFile(**fs, "/sv", "after", SeededBytes(1u << 20, 2));
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  EXPECT_EQ(RecountProblems(copy), "");
  LoopMount m;
  ASSERT_EQ(m.Mount(copy, mnt), "");
  EXPECT_EQ(ReadHostFile(mnt + "/sv/c"), SeededBytes(2u << 20, 'c'));
  const uint64_t before = KernelQgroups(mnt)["0/256"];
  EXPECT_GE(before, (3u << 20) + (4u << 20) + (1u << 20)) << "the logged extents were charged to sv";
  ASSERT_EQ(unlink((mnt + "/sv/b").c_str()), 0);
  ASSERT_EQ(unlink((mnt + "/sv/c").c_str()), 0);
  ASSERT_EQ(MustRun({"sync"}), "");
  // One leaf holds sv: copied on write, it is charged as much as it frees.
  EXPECT_EQ(KernelQgroups(mnt)["0/256"], before - (4u << 20)) << "the kernel credited sv with the logged extents";
  ASSERT_EQ(m.Unmount(), "");
  EXPECT_EQ(RecountProblems(copy), "") << "after the kernel wrote on";
}

// A subvolume the kernel deleted but had not dropped yet when unmounted
// (many blocks, no time for its cleaner): ubtrfs finishes the drop, credits
// every block to the dead subvolume, and removes its qgroup once it owns
// nothing, as the kernel's cleaner would.
TEST(SimpleQuotas, DropOfTheKernelsDeadSubvolumeCreditsItsOwner) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel deletes the subvolume: " << why;
  TempDir tmp("ubtrfs-squota-drop");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 1ull << 30), "");
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    if (std::string e = EnableSimpleQuotas(mnt); !e.empty()) {
      ASSERT_EQ(m.Unmount(), "");
      GTEST_SKIP() << "this kernel has no simple quotas (6.7+): " << e;
    }
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "create", mnt + "/z"}), "");
    for (int i = 0; i < 40000; ++i) WriteHostFile(mnt + "/z/f" + std::to_string(i), SeededBytes(100, i));
    WriteHostFile(mnt + "/z/data", SeededBytes(1u << 20, 1));
    ASSERT_EQ(MustRun({"sync"}), "");
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "delete", mnt + "/z"}), "");
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(RecountProblems(img), "") << "the dead subvolume's blocks, as the kernel left them";
  {
    auto dev = ubtrfs::io::OpenFileDevice(img);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    auto vol = ubtrfs::txn::Volume::Open(std::move(*dev), ubtrfs::txn::VolumeOptions{});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    // The kernel's cleaner may win the race on a fast machine: then only the
    // recounts below are tested.
    if (!(*vol)->MutableRoot(256, /*even_deleted=*/true).ok()) {
      std::printf("note: the kernel dropped the subvolume before the unmount\n");
    }
  }
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    PutFile(**fs, "/", "t", SeededBytes(4096, 2));
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  EXPECT_EQ(RecountProblems(img), "");
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt), "");
  ASSERT_EQ(MustRun({"btrfs", "subvolume", "sync", mnt}), "");
  EXPECT_EQ(KernelQgroups(mnt).count("0/256"), 0u) << "the qgroup of the dropped subvolume is gone";
  ASSERT_EQ(m.Unmount(), "");
  EXPECT_EQ(RecountProblems(img), "");
}

// A subvolume with no qgroup under simple quotas, as mkfs.btrfs 6.19
// --subvol with -O squota leaves one: the kernel aborts the first
// transaction that changes it (charging a qgroup that is not there), so
// ubtrfs check calls it an error where btrfs check finds nothing.
TEST(SimpleQuotas, ASubvolumeWithoutItsQgroupIsAnError) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel makes the simple quota image: " << why;
  TempDir tmp("ubtrfs-squota-noqg");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    if (std::string e = EnableSimpleQuotas(mnt); !e.empty()) {
      ASSERT_EQ(m.Unmount(), "");
      GTEST_SKIP() << "this kernel has no simple quotas (6.7+): " << e;
    }
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "create", mnt + "/sv"}), "");
    WriteHostFile(mnt + "/sv/f", SeededBytes(100000, 3));
    ASSERT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(RecountProblems(img), "");
  {
    namespace fmt = ubtrfs::format;
    auto o = OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    auto w = o->txn->Writer(fmt::kQuotaTreeObjectid);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (auto type : {fmt::kQgroupInfoKey, fmt::kQgroupLimitKey}) {
      ASSERT_TRUE((*w)->Delete(fmt::Key{0, type, 256}).ok());
    }
    ASSERT_TRUE(o->txn->Commit().ok());
  }
  EXPECT_EQ(RecountProblems(img),
            "1 errors, first: quota tree: subvolume 256 has no qgroup 0/256 (simple quotas): the kernel aborts the "
            "first transaction that changes it");
}

}  // namespace
}  // namespace ubtrfs_test
