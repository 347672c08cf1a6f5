// Interop with btrfs-progs: images made by `mkfs.btrfs --rootdir` from a
// generated tree must read back, through ubtrfs::Filesystem, exactly as the
// source tree (minus what mkfs 6.2 itself does not preserve; see
// MkfsRootdirCompareOptions in support/mkfs_util.h) and, when a kernel loop
// mount is possible, exactly as the kernel sees the same image.
#include <sys/stat.h>

#include <cctype>
#include <string>
#include <thread>
#include <tuple>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

using Param = std::tuple<uint32_t, std::string>;  // nodesize, checksum

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return s;
}

class InteropMkfsTest : public ::testing::TestWithParam<Param> {};

TEST_P(InteropMkfsTest, RootdirImageMatchesSource) {
  std::string missing = MkfsMissingReason();
  if (!missing.empty()) FAIL() << missing;
  const auto& [nodesize, csum] = GetParam();
  // One case gets the full default tree; the others a smaller one to keep
  // the suite fast (the variety of entries is the same).
  bool full = nodesize == 16384 && csum == "crc32c";
  TreeGenOptions gen = full ? TreeGenOptions{} : ScaledTreeOptions(600);
  uint64_t seed = nodesize * 31;
  for (char c : csum) seed = seed * 131 + static_cast<unsigned char>(c);

  TempDir tmp("ubtrfs-interop");
  std::string src = tmp.Sub("src"), image = tmp.Sub("image.img");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  TreeGenStats gs;
  ASSERT_NO_THROW(gs = GenerateTreeWithStats(src, seed, gen));
  RecordProperty("tree", gs.Summary());

  std::string err = RunMkfs(image, src, nodesize, csum);
  ASSERT_TRUE(err.empty()) << err;

  auto fs = ubtrfs::Filesystem::Open(image);
  ASSERT_TRUE(fs.ok()) << "Open(" << image << "): " << fs.status().ToString();
  ubtrfs::Filesystem& f = **fs;
  EXPECT_TRUE(f.Warnings().empty()) << "unexpected warnings, first: " << f.Warnings().front();
  ubtrfs::FsInfo info = f.Info();
  EXPECT_EQ(info.nodesize, nodesize);
  EXPECT_EQ(info.sectorsize, 4096u);
  EXPECT_EQ(Lower(info.csum_type).rfind(csum, 0), 0u) << "csum_type \"" << info.csum_type << "\", mkfs --csum " << csum;

  CompareStats cs;
  auto mismatches = CompareTreeToImage(src, f, MkfsRootdirCompareOptions(), "/", &cs);
  EXPECT_TRUE(mismatches.empty()) << "source " << src << " vs image " << image << ": " << FormatMismatches(mismatches);
  EXPECT_GE(cs.entries, gen.entries * 9 / 10) << "compared fewer entries than generated";

  // Ground truth for what mkfs wrote: the kernel's view of the same image.
  std::string why;
  if (LoopMountsAvailable(&why)) {
    std::string mnt = tmp.Sub("mnt");
    ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
    LoopMount m;
    std::string e = m.Mount(image, mnt, "ro");
    ASSERT_TRUE(e.empty()) << e;
    auto km = CompareTreeToImage(mnt, f, KernelMountCompareOptions());
    EXPECT_TRUE(km.empty()) << "kernel mount " << mnt << " vs ubtrfs, image " << image << ": "
                            << FormatMismatches(km);
    e = m.Unmount();
    EXPECT_TRUE(e.empty()) << e;
  } else {
    fmt::print(stderr, "note: kernel cross-check skipped: {}\n", why);
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return fmt::format("node{}_{}", std::get<0>(info.param), std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(NodeSizesAndChecksums, InteropMkfsTest,
                         ::testing::Combine(::testing::Values(4096u, 16384u, 65536u),
                                            ::testing::Values(std::string("crc32c"), std::string("xxhash"),
                                                              std::string("sha256"), std::string("blake2"))),
                         ParamName);

// The library promises thread safety: several readers walking and reading the
// whole image at once must all see the source tree.
TEST(InteropMkfs, ConcurrentReadersSeeTheSameTree) {
  std::string missing = MkfsMissingReason();
  if (!missing.empty()) FAIL() << missing;
  TempDir tmp("ubtrfs-interop-mt");
  std::string src = tmp.Sub("src"), image = tmp.Sub("image.img");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_NO_THROW(GenerateTree(src, 4242, ScaledTreeOptions(800)));
  std::string err = RunMkfs(image, src, 16384, "crc32c");
  ASSERT_TRUE(err.empty()) << err;
  ubtrfs::OpenOptions oo;
  oo.node_cache_bytes = 1 << 20;  // small cache: evictions while others read
  auto fs = ubtrfs::Filesystem::Open(image, oo);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  constexpr int kThreads = 4;
  std::vector<std::vector<std::string>> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      CompareOptions o = MkfsRootdirCompareOptions();
      o.read_seed = 100 + i;  // different chunk sizes per thread
      results[i] = CompareTreeToImage(src, **fs, o);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i)
    EXPECT_TRUE(results[i].empty()) << "thread " << i << ": " << FormatMismatches(results[i]);
}

// ---- the comparator itself must not be vacuous ----------------------------

enum class Fault {
  kFlipByte, kShortFile, kDataPastEof, kDropEntry, kExtraEntry, kWrongEntryId, kMtime, kMode, kUid,
  kNlink, kSize, kXattrValue, kDropXattr, kSymlinkTarget, kSplitHardLink
};

// Delegates to a real Filesystem and injects one kind of wrong answer.
class FaultyFilesystem : public ubtrfs::Filesystem {
 public:
  FaultyFilesystem(ubtrfs::Filesystem& real, Fault fault) : r_(real), f_(fault) {}
  const std::vector<std::string>& Warnings() const override { return r_.Warnings(); }
  ubtrfs::FsInfo Info() const override { return r_.Info(); }
  ubtrfs::InodeId Root() const override { return r_.Root(); }
  ubtrfs::Result<ubtrfs::InodeId> Lookup(std::string_view path) override {
    auto r = r_.Lookup(path);
    if (f_ == Fault::kSplitHardLink && r.ok() && path.ends_with("/links/alias")) r.value().ino |= kSplitBit;
    return r;
  }
  ubtrfs::Result<ubtrfs::InodeId> LookupChild(ubtrfs::InodeId dir, std::string_view name) override {
    return r_.LookupChild(dir, name);
  }
  ubtrfs::Result<ubtrfs::Stat> GetStat(ubtrfs::InodeId id) override {
    bool split = (id.ino & kSplitBit) != 0;  // kSplitHardLink's made-up inode
    id.ino &= ~kSplitBit;
    auto r = r_.GetStat(id);
    if (!r.ok()) return r;
    ubtrfs::Stat& st = r.value();
    if (split) st.id.ino |= kSplitBit;
    bool reg = (st.mode & S_IFMT) == S_IFREG;
    switch (f_) {
      case Fault::kMtime: if (st.size == 2048 && reg) st.mtime.sec += 1; break;
      case Fault::kMode: if (st.size == 2048 && reg) st.mode ^= 04000; break;
      case Fault::kUid: if (st.size == 1023 && reg) st.uid += 1; break;
      case Fault::kNlink: if (st.nlink > 1 && reg) st.nlink += 1; break;
      case Fault::kSize: if (st.size == 4097 && reg) st.size = 4096; break;
      default: break;
    }
    return r;
  }
  using ubtrfs::Filesystem::ReadDir;
  ubtrfs::Result<std::vector<ubtrfs::DirEntry>> ReadDir(ubtrfs::InodeId dir,
                                                        std::vector<ubtrfs::SkippedEntry>* skipped) override {
    auto r = r_.ReadDir(dir, skipped);
    if (!r.ok() || r->empty()) return r;
    if (f_ == Fault::kDropEntry && r->size() > 20) r.value().pop_back();
    if (f_ == Fault::kExtraEntry && r->size() > 20) {
      ubtrfs::DirEntry e = r->back();
      e.name = "injected";
      e.index += 1;
      r.value().push_back(e);
    }
    if (f_ == Fault::kWrongEntryId && r->size() > 20) r.value().front().id.ino += 1;
    return r;
  }
  ubtrfs::Result<size_t> Read(ubtrfs::InodeId file, uint64_t offset, std::span<uint8_t> buf) override {
    file.ino &= ~kSplitBit;
    auto st = r_.GetStat(file);
    auto r = r_.Read(file, offset, buf);
    if (!r.ok() || !st.ok()) return r;
    uint64_t size = st->size;
    if (f_ == Fault::kFlipByte && size > 100000 && offset <= 77777 && offset + *r > 77777) buf[77777 - offset] ^= 0x40;
    if (f_ == Fault::kShortFile && size == 1048577 && offset + *r > 1048000) return size_t(offset >= 1048000 ? 0 : 1048000 - offset);
    if (f_ == Fault::kDataPastEof && size == 3073 && offset >= size && !buf.empty()) {
      buf[0] = 0;
      return size_t(1);
    }
    return r;
  }
  ubtrfs::Result<std::string> ReadLink(ubtrfs::InodeId link) override {
    link.ino &= ~kSplitBit;
    auto r = r_.ReadLink(link);
    if (f_ == Fault::kSymlinkTarget && r.ok() && r->size() > 1000) r.value().back() ^= 1;
    return r;
  }
  ubtrfs::Result<std::vector<std::string>> ListXattr(ubtrfs::InodeId id) override {
    id.ino &= ~kSplitBit;
    auto r = r_.ListXattr(id);
    if (f_ == Fault::kDropXattr && r.ok() && r->size() > 30) r.value().erase(r.value().begin());
    return r;
  }
  ubtrfs::Result<std::string> GetXattr(ubtrfs::InodeId id, std::string_view name) override {
    id.ino &= ~kSplitBit;
    auto r = r_.GetXattr(id, name);
    if (f_ == Fault::kXattrValue && r.ok() && r->size() > 2000) r.value()[r->size() / 2] ^= 1;
    return r;
  }
  ubtrfs::Result<ubtrfs::FsStat> StatFs() override { return r_.StatFs(); }
  // The write side is not under test here: refuse it.
  ubtrfs::Result<ubtrfs::InodeId> Create(ubtrfs::InodeId, std::string_view, const ubtrfs::NewInode&) override { return Ro(); }
  ubtrfs::Result<ubtrfs::InodeId> Mkdir(ubtrfs::InodeId, std::string_view, const ubtrfs::NewInode&) override { return Ro(); }
  ubtrfs::Result<ubtrfs::InodeId> Mknod(ubtrfs::InodeId, std::string_view, const ubtrfs::NewInode&) override { return Ro(); }
  ubtrfs::Result<ubtrfs::InodeId> Symlink(ubtrfs::InodeId, std::string_view, std::string_view,
                                          const ubtrfs::NewInode&) override { return Ro(); }
  ubtrfs::Status Link(ubtrfs::InodeId, ubtrfs::InodeId, std::string_view) override { return Ro(); }
  ubtrfs::Status Unlink(ubtrfs::InodeId, std::string_view) override { return Ro(); }
  ubtrfs::Status Rmdir(ubtrfs::InodeId, std::string_view) override { return Ro(); }
  ubtrfs::Status Rename(ubtrfs::InodeId, std::string_view, ubtrfs::InodeId, std::string_view, unsigned) override {
    return Ro();
  }
  ubtrfs::Result<size_t> Write(ubtrfs::InodeId, uint64_t, std::span<const uint8_t>) override { return Ro(); }
  ubtrfs::Status SetAttr(ubtrfs::InodeId, const ubtrfs::AttrChange&) override { return Ro(); }
  ubtrfs::Status SetXattr(ubtrfs::InodeId, std::string_view, std::string_view, int) override { return Ro(); }
  ubtrfs::Status RemoveXattr(ubtrfs::InodeId, std::string_view) override { return Ro(); }
  ubtrfs::Status Commit() override { return Ro(); }

 private:
  static ubtrfs::Status Ro() { return ubtrfs::Status::Error(EROFS, "fault-injecting wrapper is read-only"); }
  static constexpr uint64_t kSplitBit = 1ull << 40;
  ubtrfs::Filesystem& r_;
  Fault f_;
};

struct FaultCase {
  Fault fault;
  const char* name;
  const char* expect;  // a substring of at least one mismatch
};

void PrintTo(const FaultCase& c, std::ostream* os) { *os << c.name; }

class ComparatorFaultTest : public ::testing::TestWithParam<FaultCase> {
 protected:
  static void SetUpTestSuite() {
    if (!MkfsMissingReason().empty()) return;
    tmp_ = new TempDir("ubtrfs-faults");
    std::string src = tmp_->Sub("src");
    mkdir(src.c_str(), 0755);
    TreeGenOptions o = ScaledTreeOptions(400);
    GenerateTree(src, 99, o);
    std::string err = RunMkfs(tmp_->Sub("image.img"), src, 16384, "crc32c");
    if (!err.empty()) {
      fmt::print(stderr, "{}\n", err);
      return;
    }
    auto fs = ubtrfs::Filesystem::Open(tmp_->Sub("image.img"));
    if (fs.ok()) fs_ = std::move(fs).value().release();
  }
  static void TearDownTestSuite() {
    delete fs_;
    fs_ = nullptr;
    delete tmp_;
    tmp_ = nullptr;
  }
  static TempDir* tmp_;
  static ubtrfs::Filesystem* fs_;
};
TempDir* ComparatorFaultTest::tmp_ = nullptr;
ubtrfs::Filesystem* ComparatorFaultTest::fs_ = nullptr;

TEST_P(ComparatorFaultTest, InjectedFaultIsReported) {
  std::string missing = MkfsMissingReason();
  if (!missing.empty()) FAIL() << missing;
  ASSERT_NE(fs_, nullptr) << "could not build or open the shared image";
  std::string src = tmp_->Sub("src");
  // Sanity: the unmodified filesystem matches (else the rest means nothing).
  static bool clean_checked = false;
  if (!clean_checked) {
    auto clean = CompareTreeToImage(src, *fs_, MkfsRootdirCompareOptions());
    ASSERT_TRUE(clean.empty()) << FormatMismatches(clean);
    clean_checked = true;
  }
  FaultyFilesystem faulty(*fs_, GetParam().fault);
  auto m = CompareTreeToImage(src, faulty, MkfsRootdirCompareOptions());
  bool found = false;
  for (const auto& s : m) found = found || s.find(GetParam().expect) != std::string::npos;
  EXPECT_TRUE(found) << "injected fault \"" << GetParam().name << "\" not reported as \"" << GetParam().expect
                     << "\"; got " << FormatMismatches(m);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, ComparatorFaultTest,
    ::testing::Values(FaultCase{Fault::kFlipByte, "FlipByte", "data differs at file offset 77777"},
                      FaultCase{Fault::kShortFile, "ShortFile", "returned"},
                      FaultCase{Fault::kDataPastEof, "DataPastEof", "returned"},
                      FaultCase{Fault::kDropEntry, "DropEntry", "missing on image side"},
                      FaultCase{Fault::kExtraEntry, "ExtraEntry", "extra entry on image side"},
                      FaultCase{Fault::kWrongEntryId, "WrongEntryId", "readdir id"},
                      FaultCase{Fault::kMtime, "Mtime", "mtime differs"},
                      FaultCase{Fault::kMode, "Mode", "mode differs"},
                      FaultCase{Fault::kUid, "Uid", "uid differs"},
                      FaultCase{Fault::kNlink, "Nlink", "nlink differs"},
                      FaultCase{Fault::kSize, "Size", "size differs"},
                      FaultCase{Fault::kXattrValue, "XattrValue", "value differs"},
                      FaultCase{Fault::kDropXattr, "DropXattr", "missing on image side"},
                      FaultCase{Fault::kSymlinkTarget, "SymlinkTarget", "symlink target differs"},
                      FaultCase{Fault::kSplitHardLink, "SplitHardLink", "hard link to"}),
    [](const ::testing::TestParamInfo<FaultCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ubtrfs_test
