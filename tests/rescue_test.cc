// Reading damaged images with the rescue options (OpenOptions::rescue, the
// kernel's -o rescue=): each case damages a mkfs.btrfs image in one way,
// asserts that a normal open refuses it and names the option that reads it,
// that the option reads it (the undamaged files as they were), and -- with
// loop mounts -- that the kernel mounting with the same rescue option sees
// the same tree as ubtrfs does.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "fs/volume.h"
#include "io/block_device.h"
#include "support/damage_util.h"
#include "support/fsync_expect.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "txn/devices.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

using ubtrfs::Filesystem;
using ubtrfs::InodeId;
using ubtrfs::OpenOptions;
using ubtrfs::RescueOptions;
using ubtrfs::Status;

OpenOptions Rescue(const std::string& list) {
  OpenOptions o;
  Status st = ubtrfs::ParseRescueOptions(list, &o.rescue);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return o;
}

// Every entry below `dir`, with the bytes of regular files and link targets.
std::string Describe(Filesystem& fs, InodeId dir, const std::string& path) {
  auto entries = fs.ReadDir(dir);
  if (!entries.ok()) return "ERROR " + path + ": " + entries.status().ToString();
  std::string out;
  for (const auto& e : *entries) {
    const std::string p = path + "/" + e.name;
    auto st = fs.GetStat(e.id);
    if (!st.ok()) return out + "ERROR " + p + ": " + st.status().ToString();
    out += p + " mode=" + std::to_string(st->mode) + " size=" + std::to_string(st->size) + "\n";
    if (S_ISREG(st->mode)) {
      std::string data(st->size, '\0');
      auto n = fs.Read(e.id, 0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(data.data()), data.size()));
      if (!n.ok()) return out + "ERROR " + p + ": " + n.status().ToString();
      out += std::to_string(std::hash<std::string>{}(data)) + "\n";
    } else if (S_ISLNK(st->mode)) {
      auto t = fs.ReadLink(e.id);
      out += "-> " + (t.ok() ? *t : t.status().ToString()) + "\n";
    } else if (S_ISDIR(st->mode)) {
      out += Describe(fs, e.id, p);
    }
  }
  return out;
}

std::string DescribeImage(const std::string& image, const OpenOptions& o = {}) {
  auto fs = Filesystem::Open(image, o);
  if (!fs.ok()) return "ERROR open: " + fs.status().ToString();
  return Describe(**fs, (*fs)->Root(), "");
}

bool AnyWarning(Filesystem& fs, const std::string& part) {
  for (const auto& w : fs.Warnings()) {
    if (w.find(part) != std::string::npos) return true;
  }
  return false;
}

// A plain open of `image` fails, its message naming every one of `parts`;
// the open with rescue option `list` succeeds and warns of `warning`; what
// it shows is `want`. Returns the options (for the kernel's comparison).
OpenOptions RefusedThenRead(const std::string& image, const std::vector<std::string>& parts, const std::string& list,
                            const std::string& warning, const std::string& want) {
  auto plain = Filesystem::Open(image);
  EXPECT_FALSE(plain.ok()) << "a plain open took the damaged image";
  if (!plain.ok()) {
    for (const auto& part : parts) {
      EXPECT_NE(plain.status().message().find(part), std::string::npos) << plain.status().ToString();
    }
  }
  const OpenOptions o = Rescue(list);
  auto fs = Filesystem::Open(image, o);
  EXPECT_TRUE(fs.ok()) << fs.status().ToString();
  if (fs.ok()) {
    EXPECT_TRUE(AnyWarning(**fs, warning)) << "no warning: " << ::testing::PrintToString((*fs)->Warnings());
    fs->reset();
    EXPECT_EQ(DescribeImage(image, o), want);
  }
  return o;
}

class RescueTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!MkfsMissingReason().empty()) return;
    tmp_ = new TempDir("ubtrfs-rescue");
    setup_error_ = BuildDamageHostTree(tmp_->Sub("src"), &contents_);
    if (!setup_error_.empty()) return;
    layout_ = std::make_unique<Layout>();
    layout_->path = MakeDamageImage(tmp_->path(), "single.img", {"-m", "single"});
    if (layout_->path.empty() || !AnalyzeDamageLayout(layout_.get())) {
      setup_error_ = "could not build or analyze the image";
      return;
    }
    clean_ = DescribeImage(layout_->path);
  }
  static void TearDownTestSuite() {
    layout_.reset();
    delete tmp_;
    tmp_ = nullptr;
  }
  void SetUp() override {
    if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    ASSERT_EQ(clean_.find("ERROR"), std::string::npos) << clean_;
  }

  // The image as the kernel sees it mounted with `options` (loop mount,
  // read-only), against ubtrfs's view opened with `o`: no difference. Or the
  // kernel refuses it like ubtrfs (want_mount false).
  static void KernelAgrees(const std::string& image, const std::string& options, const OpenOptions& o,
                           bool want_mount = true) {
    std::string why;
    if (!LoopMountsAvailable(&why)) {
      std::fprintf(stderr, "[ skipped  ] the kernel's view: loop mounts unavailable: %s\n", why.c_str());
      return;
    }
    const std::string mnt = tmp_->Sub("mnt");
    ::mkdir(mnt.c_str(), 0755);
    LoopMount m;
    const std::string e = m.Mount(image, mnt, options);
    if (!want_mount) {
      EXPECT_FALSE(e.empty()) << "the kernel mounted it with " << options;
      return;
    }
    ASSERT_TRUE(e.empty()) << "mount -o " << options << ": " << e;
    auto fs = Filesystem::Open(image, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto mismatches = CompareTreeToImage(mnt, **fs, KernelMountCompareOptions());
    EXPECT_TRUE(mismatches.empty()) << "kernel (-o " << options << ") vs ubtrfs: " << FormatMismatches(mismatches);
  }

  // `cut`: a copy of the clean image taken after a file was created and
  // fsynced (in the tree log only, not committed), as a power cut leaves it.
  static void PowerCutAfterAnFsync(const std::string& img, const std::string& cut) {
    std::string err;
    ASSERT_TRUE(CopyPrefix(layout_->path, img, kDamageImageSize, &err)) << err;
    auto fs = OpenWritable(img);
    ASSERT_NE(fs, nullptr);
    auto top = fs->Lookup("/");
    ASSERT_TRUE(top.ok());
    auto id = fs->Create(*top, "fsynced", ubtrfs::NewInode{.mode = 0100644});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ASSERT_TRUE(fs->Write(*id, 0, SpanOf(std::string("only in the log"))).ok());
    ASSERT_TRUE(fs->Fsync(*id, false).ok());
    std::filesystem::copy_file(img, cut);
  }

  static inline TempDir* tmp_ = nullptr;
  static inline std::string setup_error_, clean_;
  static inline std::map<std::string, std::string> contents_;
  static inline std::unique_ptr<Layout> layout_;
};

TEST(RescueOptionsTest, TakesTheKernelsNames) {
  RescueOptions r;
  ASSERT_TRUE(ubtrfs::ParseRescueOptions("usebackuproot:nologreplay", &r).ok());
  EXPECT_TRUE(r.use_backup_root && r.no_log_replay);
  EXPECT_FALSE(r.ignore_bad_roots || r.ignore_data_csums || r.ignore_meta_csums || r.ignore_super_flags);
  ASSERT_TRUE(ubtrfs::ParseRescueOptions("ibadroots,idatacsums", &r).ok());
  EXPECT_TRUE(r.use_backup_root && r.ignore_bad_roots && r.ignore_data_csums);  // added to what was there
  RescueOptions all;
  ASSERT_TRUE(ubtrfs::ParseRescueOptions("all", &all).ok());
  EXPECT_TRUE(all.use_backup_root && all.no_log_replay && all.ignore_bad_roots && all.ignore_data_csums &&
              all.ignore_meta_csums && all.ignore_super_flags);
  for (const char* bad : {"", "usebackuproot:", "recovery", "ignorebadroot", "all,bogus"}) {
    RescueOptions untouched;
    Status st = ubtrfs::ParseRescueOptions(bad, &untouched);
    EXPECT_EQ(st.code(), EINVAL) << bad;
    EXPECT_FALSE(untouched.any()) << bad;
  }
}

TEST_F(RescueTest, AWritableOpenIsRefused) {
  OpenOptions o = Rescue("ignoredatacsums");
  o.writable = true;
  auto fs = Filesystem::Open(layout_->path, o);
  ASSERT_FALSE(fs.ok());
  EXPECT_EQ(fs.status().code(), EINVAL);
  EXPECT_NE(fs.status().message().find("read-only"), std::string::npos) << fs.status().ToString();
  // The CLI: a bad name is an argument error; a write with it is refused.
  CommandResult bad = RunUbtrfs({"ls", "--rescue", "bogus", layout_->path});
  EXPECT_NE(bad.exit_code, 0) << bad.Describe();
  EXPECT_NE(bad.err.find("bogus"), std::string::npos) << bad.Describe();
  CommandResult mnt = RunUbtrfs({"mount", "-o", "rescue=ignorebadroots", layout_->path, tmp_->Sub("nomnt")});
  EXPECT_NE(mnt.exit_code, 0) << mnt.Describe();
  EXPECT_NE(mnt.err.find("-o ro"), std::string::npos) << mnt.Describe();
}

// ignorebadroots: the csum tree's root block is unreadable. Files read
// without their checksums; a normal open names the way around it.
TEST_F(RescueTest, ABadCsumTreeRootIsLeftOut) {
  const Layout* l = layout_.get();
  Patcher p(l->path);
  for (uint64_t phys : l->Copies(l->csum_root.bytenr, l->nodesize)) p.FlipBit(phys + l->nodesize / 2);
  const OpenOptions o = RefusedThenRead(l->path, {"csum tree", "checksum mismatch", "ignorebadroots"},
                                        "ignorebadroots", "without checksums", clean_);
  CommandResult ls = RunUbtrfs({"cat", "--rescue", "ibadroots", l->path + ":/files/f3"});
  EXPECT_TRUE(ls.ok()) << ls.Describe();
  EXPECT_EQ(ls.out, contents_.at("/files/f3"));
  KernelAgrees(l->path, "ro", o, /*want_mount=*/false);
  KernelAgrees(l->path, "ro,rescue=ignorebadroots", o);
}

// ignoremetacsums: an fs tree leaf whose checksum alone is wrong.
TEST_F(RescueTest, ALeafWithABadChecksumIsTakenWhenItsStructureHolds) {
  const Layout* l = layout_.get();
  Patcher p(l->path);
  for (uint64_t phys : l->Copies(l->leaf, l->nodesize)) p.FlipBit(phys + 1);  // a byte of the checksum itself
  EXPECT_NE(DescribeImage(l->path).find("checksum mismatch"), std::string::npos);
  const OpenOptions o = Rescue("ignoremetacsums");
  EXPECT_EQ(DescribeImage(l->path, o), clean_);
  // Structure damage is not what it ignores.
  {
    Patcher q(l->path);
    l->Damage(q, l->leaf, [](Block& b) { ItemAt(b, 1).offset.set(ItemAt(b, 1).offset.get() + 1); },
              /*fix_csum=*/false);
    EXPECT_NE(DescribeImage(l->path, o).find("does not end at"), std::string::npos);
  }
  KernelAgrees(l->path, "ro,rescue=ignoremetacsums", o);
}

// ignoredatacsums: a flipped bit in file data reads as it is.
TEST_F(RescueTest, DamagedDataReadsAsItIs) {
  const Layout* l = layout_.get();
  Patcher p(l->path);
  const uint64_t phys = l->Copies(l->big_ext1, l->nodesize).at(0);
  p.FlipBit(phys + 100, 0);
  auto fs = Filesystem::Open(l->path);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto big = (*fs)->Lookup("/big.bin");
  ASSERT_TRUE(big.ok());
  std::vector<uint8_t> buf(4096);
  auto n = (*fs)->Read(*big, l->big_ext1_off, buf);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), EIO);
  const OpenOptions o = Rescue("idatacsums");
  auto rfs = Filesystem::Open(l->path, o);
  ASSERT_TRUE(rfs.ok()) << rfs.status().ToString();
  n = (*rfs)->Read(*big, l->big_ext1_off, buf);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  const std::string& want = contents_.at("/big.bin");
  for (size_t i = 0; i < buf.size(); ++i) {
    const uint8_t w = static_cast<uint8_t>(want[l->big_ext1_off + i]);
    EXPECT_EQ(buf[i], i == 100 ? (w ^ 1) : w) << "byte " << i;
  }
  rfs->reset();
  KernelAgrees(l->path, "ro,rescue=ignoredatacsums", o);
}

// ignoresuperflags: a superblock flag nobody knows.
TEST_F(RescueTest, UnknownSuperblockFlagsAreWarnedOf) {
  const Layout* l = layout_.get();
  Patcher p(l->path);
  for (int mirror = 0; mirror < ubtrfs::format::kSuperMirrorMax; ++mirror) {
    const uint64_t off = ubtrfs::format::SuperblockOffset(mirror);
    if (off + ubtrfs::format::kSuperInfoSize > kDamageImageSize) break;
    DamageSuper(p, off, [](ubtrfs::format::SuperBlock& sb) { sb.flags.set(sb.flags.get() | (1ull << 50)); }, true);
  }
  EXPECT_EQ(Filesystem::Open(l->path).status().code(), EOPNOTSUPP);
  const OpenOptions o =
      RefusedThenRead(l->path, {"unsupported", "ignoresuperflags"}, "ignoresuperflags", "0x4000000000000", clean_);
  KernelAgrees(l->path, "ro", o, /*want_mount=*/false);
  KernelAgrees(l->path, "ro,rescue=ignoresuperflags", o);
}

// ignorebadroots: the root tree's "default" entry is damaged. Paths start at
// the top level. (The kernel's tree checker refuses the whole leaf.)
TEST_F(RescueTest, ADamagedDefaultEntryStartsAtTheTopLevel) {
  const Layout* l = layout_.get();
  Patcher p(l->path);
  const ubtrfs::format::Key k{ubtrfs::format::kRootTreeDirObjectid, ubtrfs::format::kDirItemKey,
                              ubtrfs::format::NameHash("default")};
  l->DamageItem(p, l->vol->root_tree(), k, [](Block& b, int s) {
    ItemAs<ubtrfs::format::DirItem>(b, s).name_len.set(0);
  });
  RefusedThenRead(l->path, {"default", "ignorebadroots"}, "ignorebadroots", "top level", clean_);
}

// usebackuproot: the newest root tree's root block is unreadable; the
// backup root of the commit before shows the tree as it was then.
TEST_F(RescueTest, ABadRootTreeFallsBackToTheBackupRoot) {
  const std::string img = tmp_->Sub("backup.img");
  std::string err;
  ASSERT_TRUE(CopyPrefix(layout_->path, img, kDamageImageSize, &err)) << err;
  // Two commits: the first also drops the empty chunks mkfs.btrfs leaves,
  // which would leave the backup's device tree naming a chunk the (always
  // current) chunk tree no longer has -- the kernel refuses that.
  std::string before;
  for (const char* name : {"first", "later"}) {
    {
      auto fs = OpenWritable(img);
      ASSERT_NE(fs, nullptr);
      auto top = fs->Lookup("/");
      ASSERT_TRUE(top.ok());
      auto id = fs->Create(*top, name, ubtrfs::NewInode{.mode = 0100644});
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ASSERT_TRUE(fs->Write(*id, 0, SpanOf(std::string("written by a commit"))).ok());
      ASSERT_TRUE(fs->Commit().ok());
    }
    if (before.empty()) before = DescribeImage(img);
  }
  ASSERT_NE(DescribeImage(img), before);  // has /later
  {
    // Our commits took the slots after mkfs.btrfs's newest, in turn: the
    // order the kernel walks backwards from the newest.
    ubtrfs::format::SuperBlock sb;
    const int fd = ::open(img.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, &sb, sizeof sb, ubtrfs::format::kSuperInfoOffset), static_cast<ssize_t>(sizeof sb));
    ::close(fd);
    std::vector<std::pair<uint64_t, int>> by_gen;
    for (int i = 0; i < ubtrfs::format::kNumBackupRoots; ++i) by_gen.emplace_back(sb.super_roots[i].tree_root_gen.get(), i);
    std::sort(by_gen.rbegin(), by_gen.rend());
    ASSERT_EQ(by_gen[0].first, sb.generation.get());
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(by_gen[i].second, (by_gen[i + 1].second + 1) % ubtrfs::format::kNumBackupRoots)
          << "generation " << by_gen[i].first << " in slot " << by_gen[i].second << ", generation "
          << by_gen[i + 1].first << " in slot " << by_gen[i + 1].second;
    }
  }
  uint64_t root = 0;
  std::vector<uint64_t> copies;
  {
    auto dev = ubtrfs::io::OpenFileDevice(img);
    ASSERT_TRUE(dev.ok());
    auto vol = ubtrfs::fs::Volume::Open(std::move(*dev), ubtrfs::fs::VolumeOptions{});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    root = (*vol)->super().root.get();
    auto m = (*vol)->chunks().MapPhysical(root, (*vol)->nodesize());
    ASSERT_TRUE(m.ok());
    copies = *m;
  }
  Patcher p(img);
  for (uint64_t phys : copies) p.FlipBit(phys + 200);
  // What it shows: the commit before /later.
  const OpenOptions o = RefusedThenRead(img, {"root tree", "tree block " + std::to_string(root), "usebackuproot"},
                                        "usebackuproot", "backup root of generation", before);
  KernelAgrees(img, "ro", o, /*want_mount=*/false);
  KernelAgrees(img, "ro,rescue=usebackuproot", o);
}

// nologreplay: an image with a tree log shows the last commit.
TEST_F(RescueTest, NoLogReplayShowsTheLastCommit) {
  const std::string cut = tmp_->Sub("log-cut.img");
  ASSERT_NO_FATAL_FAILURE(PowerCutAfterAnFsync(tmp_->Sub("log.img"), cut));
  ASSERT_NE(SuperField(cut, "log_root"), 0u);
  EXPECT_NE(DescribeImage(cut).find("/fsynced"), std::string::npos);  // replayed in memory
  const OpenOptions o = Rescue("nologreplay");
  auto fs = Filesystem::Open(cut, o);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_TRUE(AnyWarning(**fs, "not replayed")) << "no warning";
  fs->reset();
  EXPECT_EQ(DescribeImage(cut, o), clean_);
  KernelAgrees(cut, "ro,rescue=nologreplay", o);
  EXPECT_NE(SuperField(cut, "log_root"), 0u);  // nobody replayed it
}

// find, du and tree go on past what does not read, as find(1) and du(1):
// each path's error on stderr, everything else walked, exit 1.
TEST_F(RescueTest, FindDuAndTreeGoOnPastABadLeaf) {
  const Layout* l = layout_.get();
  const CommandResult clean = RunUbtrfs({"find", l->path + ":/"});
  ASSERT_TRUE(clean.ok()) << clean.Describe();
  Patcher p(l->path);
  for (uint64_t phys : l->Copies(l->leaf, l->nodesize)) p.FlipBit(phys + 1);
  const std::string& target = l->target_name;  // "/wide/NAME"
  CommandResult r = RunUbtrfs({"find", l->path + ":/"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("'" + target + "': "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the rest was walked"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hint: "), std::string::npos) << r.err;
  // Every path but those whose inode is in the leaf: more than half.
  const auto lines = [](const std::string& s) { return std::count(s.begin(), s.end(), '\n'); };
  EXPECT_GT(lines(r.out), lines(clean.out) / 2) << r.out;
  EXPECT_LT(lines(r.out), lines(clean.out));
  EXPECT_NE(r.out.find("/files/f3\n"), std::string::npos) << r.out;
  r = RunUbtrfs({"du", "-a", "-b", l->path + ":/"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("'" + target + "': "), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("\t/\n"), std::string::npos) << "no total for the top: " << r.out;
  r = RunUbtrfs({"tree", l->path + ":/"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.out.find(target.substr(target.rfind('/') + 1) + "  [error]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" files\n"), std::string::npos) << r.out;
  // The rescue option that takes the leaf walks it all.
  r = RunUbtrfs({"find", "--rescue", "ignoremetacsums", l->path + ":/"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out, clean.out);
}

// The root tree and every backup root lost: inspect find-root lists the
// roots of older commits copy-on-write left on disk, and --tree-root reads
// such a commit as it was; check takes -r, -b and -s as btrfs check does.
TEST_F(RescueTest, AnOlderCommitIsFoundAndReadByItsRootTreeAddress) {
  const std::string img = tmp_->Sub("older.img");
  std::string err;
  ASSERT_TRUE(CopyPrefix(layout_->path, img, kDamageImageSize, &err)) << err;
  std::map<uint64_t, std::string> seen;  // generation -> the tree as that commit left it
  seen[SuperField(img, "generation")] = clean_;
  for (int i = 0; i < 6; ++i) {
    {
      auto fs = OpenWritable(img);
      ASSERT_NE(fs, nullptr);
      auto top = fs->Lookup("/");
      ASSERT_TRUE(top.ok());
      auto id = fs->Create(*top, "commit" + std::to_string(i), ubtrfs::NewInode{.mode = 0644});
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ASSERT_TRUE(fs->Write(*id, 0, SpanOf(std::string(100 + i, 'x'))).ok());
      ASSERT_TRUE(fs->Commit().ok());
    }
    seen[SuperField(img, "generation")] = DescribeImage(img);
  }
  const uint64_t gen = SuperField(img, "generation"), root = SuperField(img, "root");
  // The superblock's root first, then older ones; -b and -s on a sound image.
  const CommandResult roots = RunUbtrfs({"inspect", "find-root", img});
  ASSERT_TRUE(roots.ok()) << roots.Describe();
  EXPECT_NE(roots.out.find("generation " + std::to_string(gen) + ": root at " + std::to_string(root) +
                           " level 0 (the superblock's)\n"),
            std::string::npos)
      << roots.out;
  for (const char* arg : {"-b", "--super=1"}) {
    CommandResult c = RunUbtrfs({"check", arg, img});
    EXPECT_TRUE(c.ok()) << arg << ": " << c.Describe();
  }
  CommandResult r = RunUbtrfs({"check", "--super=2", img});
  EXPECT_EQ(r.exit_code, 8) << r.Describe();
  EXPECT_NE(r.err.find("superblock copy 2 at 274877906944: device is only"), std::string::npos) << r.err;

  // Every older root find-root lists is a commit of this test: read by its
  // address, it shows that commit's tree and checks clean, unless
  // copy-on-write has reused its blocks since (the kernel's backup roots
  // are best effort for the same reason). The previous commit's is whole.
  std::vector<std::pair<uint64_t, uint64_t>> whole;  // (generation, bytenr) read as it was
  for (size_t at = 0; (at = roots.out.find("generation ", at)) != std::string::npos; ++at) {
    unsigned long long g = 0, b = 0;
    if (std::sscanf(roots.out.c_str() + at, "generation %llu: root at %llu", &g, &b) != 2 || g >= gen) continue;
    ASSERT_TRUE(seen.count(g)) << "find-root listed generation " << g << ", which no commit of this test made";
    OpenOptions o;
    o.rescue.tree_root = b;
    const std::string view = DescribeImage(img, o);
    if (view.rfind("ERROR", 0) == 0) continue;
    EXPECT_EQ(view, seen[g]) << "generation " << g << " at " << b;
    CommandResult c = RunUbtrfs({"check", "--tree-root", std::to_string(b), img});
    EXPECT_TRUE(c.ok()) << "check of generation " << g << ": " << c.Describe();
    whole.push_back({g, b});
  }
  ASSERT_FALSE(whole.empty()) << roots.out;
  EXPECT_EQ(whole.front().first, gen - 1) << roots.out;

  // The superblock's root damaged and its backup roots gone (both copies).
  {
    Patcher p(img);
    ubtrfs::txn::DeviceSpec spec = ubtrfs::txn::DeviceSpec::Of(img, 0, 0, {});
    auto devs = ubtrfs::txn::OpenDevices(spec);
    ASSERT_TRUE(devs.ok());
    auto vol = ubtrfs::txn::Volume::Open(std::move(*devs), ubtrfs::txn::VolumeOptions{});
    ASSERT_TRUE(vol.ok());
    auto copies = (*vol)->chunks().MapPhysical(root, layout_->nodesize);
    ASSERT_TRUE(copies.ok());
    for (uint64_t phys : *copies) p.FlipBit(phys + layout_->nodesize / 2);
    for (int m = 0; m < 2; ++m) {
      DamageSuper(p, fmtd::SuperblockOffset(m), [](fmtd::SuperBlock& sb) {
        std::memset(&sb.super_roots, 0, sizeof sb.super_roots);
      }, /*fix=*/true);
    }
    EXPECT_NE(DescribeImage(img, Rescue("usebackuproot")).find("no older backup root"), std::string::npos);
    r = RunUbtrfs({"check", "-b", img});
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    CommandResult found = RunUbtrfs({"inspect", "find-root", img});
    EXPECT_TRUE(found.ok()) << found.Describe();
    EXPECT_EQ(found.out.find("(the superblock's)"), std::string::npos) << found.out;
    const auto& [g, b] = whole.front();
    EXPECT_NE(found.out.find("generation " + std::to_string(g) + ": root at " + std::to_string(b)), std::string::npos)
        << found.out;
    OpenOptions o;
    o.rescue.tree_root = b;
    EXPECT_EQ(DescribeImage(img, o), seen[g]);
    CommandResult ls = RunUbtrfs({"ls", "--tree-root", std::to_string(b), img, "/"});
    EXPECT_TRUE(ls.ok()) << ls.Describe();
    EXPECT_NE(ls.err.find("given (tree-root)"), std::string::npos) << ls.err;
  }
  // Only for reading.
  OpenOptions rw;
  rw.writable = true;
  rw.rescue.tree_root = root;
  EXPECT_EQ(Filesystem::Open(img, rw).status().code(), EINVAL);
}

// rescue zero-log: a tree log whose root block is damaged stops a writable
// open and the kernel's mount; dropping it keeps the last commit whole, and
// both take the image again.
TEST_F(RescueTest, ZeroLogDropsALogThatDoesNotReplay) {
  const std::string cut = tmp_->Sub("zl-cut.img");
  ASSERT_NO_FATAL_FAILURE(PowerCutAfterAnFsync(tmp_->Sub("zl.img"), cut));
  const uint64_t log_root = SuperField(cut, "log_root");
  ASSERT_NE(log_root, 0u);
  {
    auto devs = ubtrfs::txn::OpenDevices(ubtrfs::txn::DeviceSpec::Of(cut, 0, 0, {}));
    ASSERT_TRUE(devs.ok()) << devs.status().ToString();
    auto vol = ubtrfs::txn::Volume::Open(std::move(*devs), ubtrfs::txn::VolumeOptions{});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    auto copies = (*vol)->chunks().MapPhysical(log_root, layout_->nodesize);
    ASSERT_TRUE(copies.ok()) << copies.status().ToString();
    const int fd = ::open(cut.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    for (uint64_t phys : *copies) {  // a bit in the middle of every copy
      uint8_t b = 0;
      ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(phys + layout_->nodesize / 2)), 1);
      b ^= 8;
      ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(phys + layout_->nodesize / 2)), 1);
    }
    ::close(fd);
  }
  OpenOptions rw;
  rw.writable = true;
  auto refused = Filesystem::Open(cut, rw);
  ASSERT_FALSE(refused.ok()) << "a log whose root does not read was replayed";
  EXPECT_NE(refused.status().message().find("zero-log"), std::string::npos) << refused.status().ToString();
  KernelAgrees(cut, "ro", OpenOptions{}, /*want_mount=*/false);

  CommandResult r = RunUbtrfs({"rescue", "zero-log", cut});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("previous log_root " + std::to_string(log_root)), std::string::npos) << r.out;
  EXPECT_EQ(SuperField(cut, "log_root"), 0u);
  EXPECT_EQ(DescribeImage(cut), clean_);  // the last commit, without /fsynced
  EXPECT_TRUE(Filesystem::Open(cut, rw).ok());
  EXPECT_EQ(BtrfsCheck(cut), "");
  KernelAgrees(cut, "ro", OpenOptions{});
  r = RunUbtrfs({"rescue", "zero-log", cut});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("nothing to clear"), std::string::npos) << r.out;
}

// salvage (ubtrfs's own): a leaf of /wide's DIR_INDEX items does not read.
// The listing takes the names from the directory's DIR_ITEMs instead; with
// those gone too, what is lost is said, and cp counts it as an error.
TEST_F(RescueTest, SalvageListsADirectoryPastABadLeaf) {
  const Layout* l = layout_.get();
  // A leaf in the middle of /wide's DIR_INDEX run, and one of its DIR_ITEMs.
  uint64_t index_leaf = 0, item_leaf = 0;
  {
    tree::Cursor c(l->vol->reader(), l->fs_root);
    ASSERT_TRUE(c.Seek(ubtrfs::format::Key{l->wide_ino, ubtrfs::format::kDirIndexKey, 0}).ok());
    for (size_t i = 0; i < kWideEntries / 2 && c.Valid(); ++i) ASSERT_TRUE(c.Next().ok());
    ASSERT_TRUE(c.Valid());
    ASSERT_EQ(c.key().type, ubtrfs::format::kDirIndexKey);
    index_leaf = c.leaf().bytenr();
    ASSERT_TRUE(c.Seek(ubtrfs::format::Key{l->wide_ino, ubtrfs::format::kDirItemKey, 0}).ok());
    for (size_t i = 0; i < kWideEntries / 2 && c.Valid(); ++i) ASSERT_TRUE(c.Next().ok());
    ASSERT_TRUE(c.Valid());
    ASSERT_EQ(c.key().type, ubtrfs::format::kDirItemKey);
    item_leaf = c.leaf().bytenr();
  }
  ASSERT_NE(index_leaf, item_leaf);
  std::vector<std::string> want;
  for (size_t i = 0; i < kWideEntries; ++i) want.push_back(WideName(i));
  auto names = [](Filesystem& fs, std::vector<ubtrfs::SkippedEntry>* skipped) -> std::vector<std::string> {
    auto dir = fs.Lookup("/wide");
    EXPECT_TRUE(dir.ok());
    auto entries = fs.ReadDir(*dir, skipped);
    EXPECT_TRUE(entries.ok()) << entries.status().ToString();
    std::vector<std::string> out;
    for (const auto& e : entries.ok() ? *entries : std::vector<ubtrfs::DirEntry>{}) out.push_back(e.name);
    std::sort(out.begin(), out.end());
    return out;
  };
  Patcher p(l->path);
  for (uint64_t phys : l->Copies(index_leaf, l->nodesize)) p.FlipBit(phys + l->nodesize / 2);
  {
    auto fs = Filesystem::Open(l->path);
    ASSERT_TRUE(fs.ok());
    auto dir = (*fs)->Lookup("/wide");
    ASSERT_TRUE(dir.ok());
    auto entries = (*fs)->ReadDir(*dir);
    ASSERT_FALSE(entries.ok());
    EXPECT_NE(entries.status().message().find("checksum mismatch"), std::string::npos);
  }
  // The CLI without it says which rescue options may read more.
  CommandResult plain_ls = RunUbtrfs({"ls", l->path + ":/wide"});
  EXPECT_EQ(plain_ls.exit_code, 1) << plain_ls.Describe();
  EXPECT_NE(plain_ls.err.find("--rescue salvage"), std::string::npos) << plain_ls.Describe();
  {
    auto fs = Filesystem::Open(l->path, Rescue("salvage"));
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    std::vector<ubtrfs::SkippedEntry> skipped;
    EXPECT_EQ(names(**fs, &skipped), want);  // every name, from the DIR_ITEMs
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_TRUE(skipped[0].name.empty());
    EXPECT_FALSE(skipped[0].lost);
    EXPECT_NE(skipped[0].reason.find("every name was found again"), std::string::npos) << skipped[0].reason;
    auto f = (*fs)->Lookup("/wide/" + WideName(kWideEntries / 2));
    ASSERT_TRUE(f.ok());
    CommandResult cp = RunUbtrfs({"cp", "--rescue", "salvage", l->path + ":/wide", tmp_->Sub("wide-out")});
    EXPECT_TRUE(cp.ok()) << cp.Describe();
    for (size_t i = 0; i < kWideEntries; ++i) {
      EXPECT_EQ(ReadHostFile(tmp_->Sub("wide-out/" + WideName(i))), contents_.at("/wide/" + WideName(i)));
    }
  }
  // The name-hash leaf too: the names there and in the lost index range are
  // gone; the listing says so, and cp fails after copying the rest.
  for (uint64_t phys : l->Copies(item_leaf, l->nodesize)) p.FlipBit(phys + l->nodesize / 2);
  auto fs = Filesystem::Open(l->path, Rescue("salvage"));
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  std::vector<ubtrfs::SkippedEntry> skipped;
  const std::vector<std::string> got = names(**fs, &skipped);
  EXPECT_LT(got.size(), want.size());
  EXPECT_GT(got.size(), want.size() / 2);
  EXPECT_TRUE(std::includes(want.begin(), want.end(), got.begin(), got.end()));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(skipped[0].lost);
  EXPECT_NE(skipped[0].reason.find(ubtrfs_test::TreeBlockName(index_leaf)), std::string::npos) << skipped[0].reason;
  CommandResult cp = RunUbtrfs({"cp", "--rescue", "salvage", l->path + ":/wide", tmp_->Sub("wide-out2")});
  EXPECT_EQ(cp.exit_code, 1) << cp.Describe();
  EXPECT_NE(cp.err.find("did not read"), std::string::npos) << cp.Describe();
  CommandResult ls = RunUbtrfs({"ls", "--rescue", "salvage", l->path + ":/wide"});
  EXPECT_TRUE(ls.ok()) << ls.Describe();
  EXPECT_NE(ls.err.find("others are lost"), std::string::npos) << ls.Describe();
}

}  // namespace UBTRFS_UNITY_ID
}  // namespace ubtrfs_test
