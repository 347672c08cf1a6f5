// `ubtrfs check` and `btrfs check --readonly` (btrfs-progs) must agree --
// both clean, or both reporting errors -- on every kind of image the test
// suites use:
//   - clean images from mkfs.btrfs and ubtrfs mkfs (--rootdir of a generated
//     tree; several node sizes, checksum types, single/DUP metadata; empty),
//   - images changed through ubtrfs's write API,
//   - kernel-written images (loop mounts, where they work: compression,
//     subvolumes, snapshots, reflinks, deletes),
//   - the clean and damaged images of tests/damaged_image_test.cc, built with
//     the same helpers (tests/support/damage_util.h) and the same damage.
// Each image is checked without and with --check-data-csum; a table of what
// both said is printed by each test.
//
// Where ubtrfs check finds errors and btrfs check does not, the kernel is the
// referee: the image is loop-mounted read-only and read in full, and the
// disagreement is accepted only if the kernel fails too (btrfs-progs 6.2
// misses some damage the kernel's tree checker rejects; see
// docs/RELIABILITY.md). Damage the library refuses only when a file is read
// but that neither checker treats as inconsistent is marked ReadTimeOnly.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "support/damage_util.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_gen.h"
#include "tree/cursor.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

namespace fmtd = ubtrfs::format;
namespace tree = ubtrfs::tree;
using fmtd::Key;
using ubtrfs::Filesystem;
using ubtrfs::InodeId;
using ubtrfs_test::Block;
using ubtrfs_test::CommandResult;
using ubtrfs_test::Hdr;
using ubtrfs_test::ItemAs;
using ubtrfs_test::ItemAt;
using ubtrfs_test::ItemData;
using ubtrfs_test::KeyAt;
using ubtrfs_test::Layout;
using ubtrfs_test::Patcher;
using ubtrfs_test::PtrAt;
using ubtrfs_test::ResizeItem;
using ubtrfs_test::RunCommand;
using ubtrfs_test::SetKey;
using ubtrfs_test::TempDir;

const std::string kCli = UBTRFS_CLI_PATH;
constexpr uint64_t kMiB = 1ull << 20;

// What one checker said about one image.
struct Verdict {
  int exit_code = -1;
  std::string output;
  // ubtrfs check: 0 clean, 1 errors, 8 could not check. btrfs check: 0 clean,
  // anything else errors (it exits 1 both for damage and for an image it
  // cannot open).
  bool clean() const { return exit_code == 0; }
};

Verdict Ours(const std::string& img, bool data_csums) {
  std::vector<std::string> argv{kCli, "check", img};
  if (data_csums) argv.push_back("--check-data-csum");
  CommandResult r = RunCommand(argv);
  return Verdict{r.exit_code, r.out + r.err};
}

Verdict Theirs(const std::string& img, bool data_csums) {
  std::vector<std::string> argv{"btrfs", "check", "--readonly"};
  if (data_csums) argv.push_back("--check-data-csum");
  argv.push_back(img);
  CommandResult r = RunCommand(argv);
  return Verdict{r.exit_code, r.out + r.err};
}

std::string Head(const std::string& s, size_t lines = 12) {
  size_t pos = 0;
  for (size_t i = 0; i < lines && pos != std::string::npos; ++i) {
    pos = s.find('\n', pos);
    if (pos != std::string::npos) ++pos;
  }
  return pos == std::string::npos ? s : s.substr(0, pos) + "...\n";
}

// The summary table of a test: one line per image and mode.
class Table {
 public:
  ~Table() {
    std::fprintf(stderr,
                 "[ agreement ] %zu checks, %zu both clean, %zu both errors, %zu disagree (%zu of them refereed by "
                 "the kernel, %zu not compared)\n",
                 rows_, clean_, errors_, disagree_, refereed_, not_compared_);
    if (not_compared_ > 0) {
      // A machine without loop mounts must not hide a disagreement: each one
      // it could not referee is named above ("NOT COMPARED") and counted here.
      std::fprintf(stderr,
                   "[ agreement ] WARNING: %zu disagreement(s) NOT COMPARED with the kernel (no loop mounts); "
                   "rerun as root on a machine with loop devices to referee them\n",
                   not_compared_);
    }
  }
  void Add(const std::string& name, bool data, const Verdict& o, const Verdict& t) {
    ++rows_;
    if (o.clean() != t.clean()) {
      ++disagree_;
    } else if (o.clean()) {
      ++clean_;
    } else {
      ++errors_;
    }
    std::fprintf(stderr, "[ agreement ] %-58s %s ubtrfs=%d btrfs=%d%s\n", name.c_str(), data ? "data " : "     ",
                 o.exit_code, t.exit_code, o.clean() == t.clean() ? "" : "  DISAGREE");
  }
  void Referee(const std::string& verdict) {
    ++refereed_;
    std::fprintf(stderr, "[ agreement ]     %s\n", Head(verdict, 2).c_str());
  }
  // A disagreement left without a referee: printed, counted, and recorded
  // as a test property, never silently passed.
  void NotCompared(const std::string& name, const std::string& why, const std::string& ours) {
    ++not_compared_;
    std::fprintf(stderr, "[ agreement ]     NOT COMPARED (no kernel referee: %s): ubtrfs check says\n%s", why.c_str(),
                 Head(ours, 3).c_str());
    ::testing::Test::RecordProperty("not_compared_" + std::to_string(not_compared_), name);
  }
  size_t not_compared() const { return not_compared_; }

 private:
  size_t rows_ = 0, clean_ = 0, errors_ = 0, disagree_ = 0, refereed_ = 0, not_compared_ = 0;
};

// The kernel as referee where the checkers disagree: mount the image
// read-only and read everything (stat every entry, read every file). "" when
// all of that works, otherwise what failed. The kernel validates every tree
// block it reads (fs/btrfs/tree-checker.c) and the chunk/device extent
// mapping at mount, so an error here means the image is really damaged.
std::string KernelReadsAll(const std::string& img, const std::string& mnt) {
  ubtrfs_test::LoopMount m;
  const std::string err = m.Mount(img, mnt, "ro");
  if (!err.empty()) return "mount fails: " + err;
  CommandResult r = RunCommand(
      {"sh", "-c", "ls -laR '" + mnt + "' >/dev/null && find '" + mnt + "' -type f -exec cat {} + >/dev/null"});
  const std::string un = m.Unmount();
  if (!r.ok()) return "reading fails: " + r.Describe();
  if (!un.empty()) return "unmount fails: " + un;
  return "";
}

// Both checkers, both modes. `expect_clean`: nullopt = only agreement is
// asserted; true/false = both must also say exactly that (in the mode without
// data checksums; with them, damage to data only shows up there).
void ExpectAgree(Table* table, const std::string& name, const std::string& img, std::optional<bool> expect_clean) {
  for (bool data : {false, true}) {
    SCOPED_TRACE(name + (data ? " (--check-data-csum)" : ""));
    const Verdict o = Ours(img, data);
    const Verdict t = Theirs(img, data);
    table->Add(name, data, o, t);
    EXPECT_TRUE(o.exit_code == 0 || o.exit_code == 1 || o.exit_code == 8) << "ubtrfs check exit " << o.exit_code;
    if (o.clean() != t.clean() && !o.clean()) {
      // We see damage btrfs check does not. Accepted only when the kernel
      // agrees with us: it refuses to mount the image or to read some of it.
      std::string why;
      if (ubtrfs_test::LoopMountsAvailable(&why)) {
        TempDir mnt("ubtrfs-agree-mnt");
        const std::string kernel = KernelReadsAll(img, mnt.path());
        table->Referee(kernel.empty() ? "kernel reads everything: btrfs check is right" : "kernel: " + kernel);
        EXPECT_NE(kernel, "") << "ubtrfs check reports errors that neither btrfs check nor the kernel sees:\n"
                              << Head(o.output);
        continue;
      }
      // No referee here (not root, or no loop device): say so and count it.
      table->NotCompared(name + (data ? " (--check-data-csum)" : ""), why, o.output);
      continue;
    }
    EXPECT_EQ(o.clean(), t.clean()) << "ubtrfs check (exit " << o.exit_code << "):\n"
                                    << Head(o.output) << "btrfs check (exit " << t.exit_code << "):\n"
                                    << Head(t.output);
    if (expect_clean && !data) {
      EXPECT_EQ(o.clean(), *expect_clean) << Head(o.output);
      EXPECT_EQ(t.clean(), *expect_clean) << Head(t.output);
    }
  }
}

std::string Prereqs() {
  if (!ubtrfs_test::MkfsMissingReason().empty()) return ubtrfs_test::MkfsMissingReason();
  if (ubtrfs_test::FindProgram("btrfs").empty()) return "btrfs (btrfs-progs) not found";
  return "";
}

#define REQUIRE_TOOLS()                                     \
  do {                                                      \
    const std::string why = Prereqs();                      \
    if (!why.empty()) GTEST_SKIP() << why;                  \
  } while (0)

// ---------------------------------------------------------------- clean images

// A small generated tree with the usual variety (hard links, xattrs, odd
// names, sparse files, fifos, ...).
std::string GenTree(const TempDir& dir) {
  const std::string src = dir.Sub("src");
  if (::mkdir(src.c_str(), 0755) != 0) return "";
  ubtrfs_test::TreeGenOptions o = ubtrfs_test::ScaledTreeOptions(250);
  o.large_file_max = 1 * kMiB;
  o.sparse_file_max = 4 * kMiB;
  ubtrfs_test::GenerateTree(src, 42, o);
  return src;
}

TEST(CheckerAgreementTest, CleanMkfsImages) {
  REQUIRE_TOOLS();
  TempDir dir("ubtrfs-agree");
  const std::string src = GenTree(dir);
  ASSERT_FALSE(src.empty());
  Table table;
  struct Variant {
    std::string name;
    uint32_t nodesize;
    std::string csum;
    std::vector<std::string> extra;
    bool rootdir;
  };
  const std::vector<Variant> variants = {
      {"4k-crc32c", 4096, "crc32c", {}, true},
      {"16k-xxhash", 16384, "xxhash", {}, true},
      {"16k-sha256-single", 16384, "sha256", {"-m", "single"}, true},
      {"64k-blake2", 65536, "blake2", {}, true},
      {"16k-crc32c-empty", 16384, "crc32c", {}, false},
  };
  for (const auto& v : variants) {
    const std::string progs = dir.Sub("progs-" + v.name + ".img");
    ASSERT_EQ(ubtrfs_test::RunMkfs(progs, v.rootdir ? src : "", v.nodesize, v.csum, 256 * kMiB, v.extra), "");
    ExpectAgree(&table, "mkfs.btrfs " + v.name, progs, true);
    ::unlink(progs.c_str());

    const std::string ours = dir.Sub("ubtrfs-" + v.name + ".img");
    std::vector<std::string> argv{kCli, "mkfs", "-q", "-f", "--size", "256M", "-n", std::to_string(v.nodesize),
                                  "--csum", v.csum};
    if (v.rootdir) argv.insert(argv.end(), {"--rootdir", src});
    argv.push_back(ours);
    CommandResult r = RunCommand(argv);
    ASSERT_TRUE(r.ok()) << ubtrfs_test::ShellJoin(argv) << ": " << r.Describe();
    ExpectAgree(&table, "ubtrfs mkfs " + v.name, ours, true);
    ::unlink(ours.c_str());
  }
}

// Namespace and data churn through the library's write API, committed in
// several transactions, on an image from each mkfs.
void Churn(Filesystem& fs) {
  const InodeId root = fs.Root();
  ubtrfs::NewInode a;
  a.mode = 0644;
  ubtrfs::NewInode d;
  d.mode = 0755;
  auto dir = fs.Mkdir(root, "churn", d);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  std::vector<uint8_t> buf(300 * 1024);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  for (int i = 0; i < 40; ++i) {
    auto f = fs.Create(*dir, "f" + std::to_string(i), a);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const size_t len = (i % 4 == 0) ? 100 : (i % 4 == 1) ? 5000 : (i % 4 == 2) ? 70000 : buf.size();
    auto n = fs.Write(*f, static_cast<uint64_t>(i % 3) * 8192, std::span<const uint8_t>(buf).first(len));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    if (i % 5 == 0) {
      ASSERT_TRUE(fs.SetXattr(*f, "user.tag", std::string(50 + i, 'x')).ok());
    }
    if (i % 7 == 0) {
      ASSERT_TRUE(fs.Link(*f, root, "link" + std::to_string(i)).ok());
    }
    if (i % 10 == 9) {
      ASSERT_TRUE(fs.Commit().ok());
    }
  }
  for (int i = 0; i < 40; i += 3) ASSERT_TRUE(fs.Unlink(*dir, "f" + std::to_string(i)).ok());
  for (int i = 1; i < 40; i += 6) {
    ASSERT_TRUE(fs.Rename(*dir, "f" + std::to_string(i), root, "moved" + std::to_string(i)).ok());
  }
  auto f2 = fs.Lookup("/churn/f2");
  ASSERT_TRUE(f2.ok());
  ubtrfs::AttrChange shrink;
  shrink.size = 1000;
  ASSERT_TRUE(fs.SetAttr(*f2, shrink).ok());
  auto sub = fs.Mkdir(*dir, "sub", d);
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(fs.Symlink(*sub, "sl", "../f4", a).ok());
  ASSERT_TRUE(fs.Commit().ok());
}

TEST(CheckerAgreementTest, ImagesWrittenByUbtrfs) {
  REQUIRE_TOOLS();
  TempDir dir("ubtrfs-agree");
  const std::string src = GenTree(dir);
  ASSERT_FALSE(src.empty());
  Table table;
  const std::string progs = dir.Sub("progs.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(progs, src, 16384, "crc32c", 256 * kMiB), "");
  const std::string ours = dir.Sub("ours.img");
  CommandResult r = RunCommand({kCli, "mkfs", "-q", "-f", "--size", "256M", "-n", "4096", ours});
  ASSERT_TRUE(r.ok()) << r.Describe();
  for (const auto& img : {progs, ours}) {
    {
      ubtrfs::OpenOptions w;
      w.writable = true;
      auto fs = Filesystem::Open(img, w);
      ASSERT_TRUE(fs.ok()) << fs.status().ToString();
      Churn(**fs);
    }
    ExpectAgree(&table, "written by ubtrfs: " + img.substr(img.rfind('/') + 1), img, true);
  }
}

TEST(CheckerAgreementTest, ImagesWrittenByTheKernel) {
  REQUIRE_TOOLS();
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-agree");
  Table table;
  const std::string img = dir.Sub("kernel.img");
  const std::string mnt = dir.Sub("mnt");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 16384, "crc32c", 256 * kMiB), "");
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "compress=zstd"), "");
    const std::string script =
        "set -e; cd '" + mnt + "'; mkdir -p a/b; "
        "for i in $(seq 1 60); do head -c $((i * 3000)) /dev/urandom > a/f$i; done; "
        "for i in $(seq 1 20); do seq 1 $((i * 500)) > a/b/text$i; done; "
        "btrfs subvolume create sv >/dev/null; cp -a a sv/; "
        "btrfs subvolume snapshot sv snap >/dev/null; echo changed > snap/a/f1; "
        "cp --reflink=always a/f60 a/reflinked; ln a/f2 a/hard; "
        "setfattr -n user.x -v y a/f3 2>/dev/null || true; "
        "rm a/f10 a/f11 sv/a/b/text3; truncate -s 1M a/f12; sync";
    CommandResult r = RunCommand({"sh", "-c", script});
    ASSERT_TRUE(r.ok()) << r.Describe();
    ASSERT_EQ(m.Unmount(), "");
  }
  ExpectAgree(&table, "kernel-written (zstd, subvolume, snapshot, reflink)", img, true);
  // ubtrfs does not write into images with shared tree blocks (snapshots):
  // a second kernel image without one, then changed by ubtrfs.
  const std::string img2 = dir.Sub("kernel2.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img2, "", 4096, "xxhash", 256 * kMiB), "");
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img2, mnt, "compress=zlib"), "");
    const std::string script = "set -e; cd '" + mnt + "'; mkdir -p d/e; "
                               "for i in $(seq 1 40); do seq 1 $((i * 400)) > d/t$i; done; "
                               "head -c 300000 /dev/urandom > d/e/random; ln d/t1 d/e/hard; "
                               "btrfs subvolume create sv >/dev/null; cp d/t5 sv/; rm d/t7; sync";
    CommandResult r = RunCommand({"sh", "-c", script});
    ASSERT_TRUE(r.ok()) << r.Describe();
    ASSERT_EQ(m.Unmount(), "");
  }
  ExpectAgree(&table, "kernel-written (zlib, subvolume)", img2, true);
  {
    ubtrfs::OpenOptions w;
    w.writable = true;
    auto fs = Filesystem::Open(img2, w);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    Churn(**fs);
  }
  ExpectAgree(&table, "kernel-written, then changed by ubtrfs", img2, true);
}

// ---------------------------------------------------------------- damaged images

class DamagedAgreementTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!Prereqs().empty()) return;
    dir_ = std::make_unique<TempDir>("ubtrfs-agree-damaged");
    const std::string err = ubtrfs_test::BuildDamageHostTree(dir_->Sub("src"), &contents_);
    if (!err.empty()) {
      setup_error_ = err;
      return;
    }
    for (const auto& [name, extra] :
         std::vector<std::pair<std::string, std::vector<std::string>>>{{"single.img", {"-m", "single"}},
                                                                      {"dup.img", {}}}) {
      auto l = std::make_unique<Layout>();
      l->path = ubtrfs_test::MakeDamageImage(dir_->path(), name, extra);
      if (l->path.empty() || !ubtrfs_test::AnalyzeDamageLayout(l.get())) {
        setup_error_ = "could not build or analyze " + name;
        return;
      }
      layouts_[name] = std::move(l);
    }
  }
  static void TearDownTestSuite() {
    layouts_.clear();
    dir_.reset();
  }
  void SetUp() override {
    REQUIRE_TOOLS();
    ASSERT_EQ(setup_error_, "");
  }
  static const Layout* Single() { return layouts_.at("single.img").get(); }
  static const Layout* Dup() { return layouts_.at("dup.img").get(); }

  static std::unique_ptr<TempDir> dir_;
  static std::string setup_error_;
  static std::map<std::string, std::string> contents_;
  static std::map<std::string, std::unique_ptr<Layout>> layouts_;
};

std::unique_ptr<TempDir> DamagedAgreementTest::dir_;
std::string DamagedAgreementTest::setup_error_;
std::map<std::string, std::string> DamagedAgreementTest::contents_;
std::map<std::string, std::unique_ptr<Layout>> DamagedAgreementTest::layouts_;

// One damage: applied through the patcher (undone when the case ends).
struct Case {
  std::string what;
  std::function<void(Patcher&, const Layout*)> damage;
  // Both checkers must find errors, unless this is nullopt: damage the
  // library refuses when it reads the file but that is not inconsistent
  // metadata to either checker (only agreement is asserted then).
  std::optional<bool> expect_clean = false;
};

Case ReadTimeOnly(Case c) {
  c.expect_clean = std::nullopt;
  return c;
}

void RunCases(const Layout* l, const std::vector<Case>& cases) {
  Table table;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Patcher p(l->path);
    c.damage(p, l);
    ExpectAgree(&table, c.what, l->path, c.expect_clean);
  }
}

// A block mutation with a recomputed checksum, in every copy.
Case BlockCase(const std::string& what, uint64_t Layout::*block, std::function<void(Block&, const Layout*)> m) {
  return Case{what, [block, m](Patcher& p, const Layout* l) {
                l->Damage(p, l->*block, [&](Block& b) { m(b, l); }, /*fix_csum=*/true);
              }};
}

TEST_F(DamagedAgreementTest, CleanImages) {
  Table table;
  ExpectAgree(&table, "damaged-image suite: single.img (clean)", Single()->path, true);
  ExpectAgree(&table, "damaged-image suite: dup.img (clean)", Dup()->path, true);
}

TEST_F(DamagedAgreementTest, FlippedBitsInTreeBlocks) {
  const Layout* l = Single();
  std::vector<Case> cases;
  const std::pair<const char*, uint64_t> blocks[] = {
      {"fs tree leaf", l->leaf},         {"fs tree node", l->node},       {"fs tree sibling leaf", l->sibling},
      {"chunk tree root", l->chunk_root}, {"root tree root", l->root_tree}, {"csum tree root", l->csum_root.bytenr},
      {"csum tree leaf", l->csum_leaf}};
  for (const auto& [what, bytenr] : blocks) {
    for (uint64_t pos : {uint64_t{40}, uint64_t{l->nodesize / 2}}) {
      cases.push_back({std::string("flipped bit in ") + what + " at byte " + std::to_string(pos),
                       [bytenr = bytenr, pos](Patcher& p, const Layout* l) {
                         p.FlipBit(l->Copies(bytenr, l->nodesize).at(0) + pos);
                       }});
    }
  }
  RunCases(l, cases);
}

TEST_F(DamagedAgreementTest, LeafStructureDamage) {
  const Layout* l = Single();
  const int t = l->leaf_slot, n = l->leaf_items;
  const std::vector<Case> cases = {
      BlockCase("leaf: item offset off by one", &Layout::leaf,
                [t](Block& b, const Layout*) { ItemAt(b, t - 1).offset.set(ItemAt(b, t - 1).offset.get() + 1); }),
      BlockCase("leaf: item size garbage", &Layout::leaf, [t](Block& b, const Layout*) { ItemAt(b, t).size.set(0xFFFFFF00u); }),
      BlockCase("leaf: item offset garbage", &Layout::leaf, [](Block& b, const Layout*) { ItemAt(b, 0).offset.set(0xFFFFFFFFu); }),
      BlockCase("leaf: last item's data overlaps the headers", &Layout::leaf,
                [n](Block& b, const Layout*) {
                  const uint32_t end = ItemAt(b, n - 2).offset.get();
                  ItemAt(b, n - 1).offset.set(5);
                  ItemAt(b, n - 1).size.set(end - 5);
                }),
      BlockCase("leaf: nritems one too many", &Layout::leaf,
                [n](Block& b, const Layout*) {
                  std::memset(&ItemAt(b, n), 0, sizeof(fmtd::Item));
                  Hdr(b).nritems.set(n + 1);
                }),
      BlockCase("leaf: nritems 1000", &Layout::leaf, [](Block& b, const Layout*) { Hdr(b).nritems.set(1000); }),
      BlockCase("leaf: nritems 0", &Layout::leaf, [](Block& b, const Layout*) { Hdr(b).nritems.set(0); }),
      BlockCase("leaf: level 0 -> 1", &Layout::leaf, [](Block& b, const Layout*) { Hdr(b).level = 1; }),
      BlockCase("leaf: level 0 -> 200", &Layout::leaf, [](Block& b, const Layout*) { Hdr(b).level = 200; }),
      BlockCase("leaf: bytenr changed", &Layout::leaf, [](Block& b, const Layout* l) { Hdr(b).bytenr.set(l->leaf + 4096); }),
      BlockCase("leaf: generation changed", &Layout::leaf,
                [](Block& b, const Layout* l) { Hdr(b).generation.set(l->leaf_gen + 1); }),
      BlockCase("leaf: fsid changed", &Layout::leaf, [](Block& b, const Layout*) { Hdr(b).fsid[5] ^= 0x40; }),
      BlockCase("leaf: keys out of order", &Layout::leaf,
                [t](Block& b, const Layout*) {
                  Key a = KeyAt(b, t - 2), c = KeyAt(b, t - 1);
                  SetKey(b, t - 2, c);
                  SetKey(b, t - 1, a);
                }),
      BlockCase("leaf: duplicate key", &Layout::leaf, [t](Block& b, const Layout*) { SetKey(b, t, KeyAt(b, t - 1)); }),
      BlockCase("leaf: first key differs from the parent's", &Layout::leaf,
                [](Block& b, const Layout*) {
                  Key k = KeyAt(b, 0);
                  k.offset += 1;
                  SetKey(b, 0, k);
                }),
  };
  RunCases(l, cases);
}

TEST_F(DamagedAgreementTest, NodeStructureDamage) {
  const Layout* l = Single();
  const int p = l->node_slot;
  const std::vector<Case> cases = {
      BlockCase("node: keys out of order", &Layout::node,
                [p](Block& b, const Layout*) {
                  Key a = KeyAt(b, p - 1), c = KeyAt(b, p);
                  SetKey(b, p - 1, c);
                  SetKey(b, p, a);
                }),
      BlockCase("node: nritems 0", &Layout::node, [](Block& b, const Layout*) { Hdr(b).nritems.set(0); }),
      BlockCase("node: nritems huge", &Layout::node, [](Block& b, const Layout*) { Hdr(b).nritems.set(0x10000); }),
      BlockCase("node: level +1", &Layout::node, [](Block& b, const Layout*) { Hdr(b).level += 1; }),
      BlockCase("node: bytenr changed", &Layout::node, [](Block& b, const Layout* l) { Hdr(b).bytenr.set(l->node ^ 0x10000); }),
      BlockCase("node: fsid changed", &Layout::node, [](Block& b, const Layout*) { Hdr(b).fsid[0] ^= 1; }),
      BlockCase("node: child pointer unaligned", &Layout::node,
                [p](Block& b, const Layout* l) { PtrAt(b, p).blockptr.set(l->leaf + 1); }),
      BlockCase("node: child pointer zero", &Layout::node, [p](Block& b, const Layout*) { PtrAt(b, p).blockptr.set(0); }),
      BlockCase("node: child pointer to no chunk", &Layout::node,
                [p](Block& b, const Layout*) { PtrAt(b, p).blockptr.set(1ull << 40); }),
      BlockCase("node: child pointer into a DATA chunk", &Layout::node,
                [p](Block& b, const Layout* l) { PtrAt(b, p).blockptr.set(l->big_ext0); }),
      BlockCase("node: child pointer to the sibling leaf", &Layout::node,
                [p](Block& b, const Layout* l) { PtrAt(b, p).blockptr.set(l->sibling); }),
      BlockCase("node: child pointer to the node itself", &Layout::node,
                [p](Block& b, const Layout* l) { PtrAt(b, p).blockptr.set(l->node); }),
      BlockCase("node: child generation differs", &Layout::node,
                [p](Block& b, const Layout* l) { PtrAt(b, p).generation.set(l->leaf_gen + 5); }),
      BlockCase("node: key differs from the child's first key", &Layout::node,
                [p](Block& b, const Layout*) {
                  Key k = KeyAt(b, p);
                  k.offset += 1;
                  SetKey(b, p, k);
                }),
  };
  RunCases(l, cases);
}

// Item damage in tree `root` at key `k` (every copy, checksum recomputed).
Case ItemCase(const std::string& what, std::function<tree::RootPtr(const Layout*)> root,
              std::function<Key(const Layout*)> key, std::function<void(Block&, int)> m) {
  return Case{what, [=](Patcher& p, const Layout* l) { l->DamageItem(p, root(l), key(l), m); }};
}

TEST_F(DamagedAgreementTest, ChunkRootAndCsumItemDamage) {
  const Layout* l = Single();
  const auto* data_chunk = l->vol->chunks().Find(l->big_ext0);
  ASSERT_NE(data_chunk, nullptr);
  const Key chunk_key{fmtd::kFirstChunkTreeObjectid, fmtd::kChunkItemKey, data_chunk->logical};
  auto chunk_tree = [](const Layout* l) { return l->vol->chunk_tree(); };
  auto root_tree = [](const Layout* l) { return l->vol->root_tree(); };
  auto chunk = [chunk_key](const Layout*) { return chunk_key; };
  auto dev = [](const Layout*) { return Key{fmtd::kDevItemsObjectid, fmtd::kDevItemKey, 1}; };
  auto fs_root_item = [](const Layout*) { return Key{fmtd::kFsTreeObjectid, fmtd::kRootItemKey, 0}; };
  auto csum_root_item = [](const Layout*) { return Key{fmtd::kCsumTreeObjectid, fmtd::kRootItemKey, 0}; };
  tree::Cursor c(l->vol->reader(), l->csum_root);
  ASSERT_TRUE(c.SeekAtOrBefore(Key{fmtd::kExtentCsumObjectid, fmtd::kExtentCsumKey, l->big_ext1}).ok());
  ASSERT_TRUE(c.Valid());
  const Key csum_key = c.key();
  const size_t csum_size = c.data().size();
  const std::vector<Case> cases = {
      ItemCase("CHUNK_ITEM num_stripes 2", chunk_tree, chunk,
               [](Block& b, int s) { ItemAs<fmtd::Chunk>(b, s).num_stripes.set(2); }),
      ItemCase("CHUNK_ITEM stripe beyond the device", chunk_tree, chunk,
               [](Block& b, int s) {
                 reinterpret_cast<fmtd::Stripe*>(ItemData(b, s) + sizeof(fmtd::Chunk))
                     ->offset.set(ubtrfs_test::kDamageImageSize - kMiB);
               }),
      ItemCase("CHUNK_ITEM length 0", chunk_tree, chunk, [](Block& b, int s) { ItemAs<fmtd::Chunk>(b, s).length.set(0); }),
      ItemCase("CHUNK_ITEM type 0", chunk_tree, chunk, [](Block& b, int s) { ItemAs<fmtd::Chunk>(b, s).type.set(0); }),
      ItemCase("CHUNK_ITEM shortened", chunk_tree, chunk, [](Block& b, int s) { ResizeItem(b, s, 40); }),
      ItemCase("DEV_ITEM of another device", chunk_tree, dev,
               [](Block& b, int s) { ItemAs<fmtd::DevItem>(b, s).devid.set(2); }),
      ItemCase("DEV_ITEM shortened", chunk_tree, dev, [](Block& b, int s) { ResizeItem(b, s, 20); }),
      ItemCase("fs tree ROOT_ITEM level 9", root_tree, fs_root_item,
               [](Block& b, int s) { ItemAs<fmtd::RootItem>(b, s).level = 9; }),
      ItemCase("fs tree ROOT_ITEM bytenr unaligned", root_tree, fs_root_item,
               [](Block& b, int s) {
                 auto& r = ItemAs<fmtd::RootItem>(b, s);
                 r.bytenr.set(r.bytenr.get() + 512);
               }),
      ItemCase("fs tree ROOT_ITEM generation wrong", root_tree, fs_root_item,
               [](Block& b, int s) {
                 auto& r = ItemAs<fmtd::RootItem>(b, s);
                 r.generation.set(r.generation.get() + 1);
               }),
      ItemCase("fs tree ROOT_ITEM too short", root_tree, fs_root_item, [](Block& b, int s) { ResizeItem(b, s, 100); }),
      ItemCase("csum tree ROOT_ITEM generation wrong", root_tree, csum_root_item,
               [](Block& b, int s) {
                 auto& r = ItemAs<fmtd::RootItem>(b, s);
                 r.generation.set(r.generation.get() + 3);
               }),
      ItemCase("EXTENT_CSUM size not a multiple of 4", [](const Layout* l) { return l->csum_root; },
               [csum_key](const Layout*) { return csum_key; },
               [csum_size](Block& b, int s) { ResizeItem(b, s, csum_size - 1); }),
      BlockCase("chunk tree root: header bytenr", &Layout::chunk_root,
                [](Block& b, const Layout* l) { Hdr(b).bytenr.set(l->chunk_root + 4096); }),
  };
  RunCases(l, cases);
}

TEST_F(DamagedAgreementTest, FsTreeItemDamage) {
  const Layout* l = Single();
  auto fs_tree = [](const Layout* l) { return l->fs_root; };
  const Key dir_item{l->wide_ino, fmtd::kDirItemKey, fmtd::NameHash("e250")};
  auto dir = [dir_item](const Layout*) { return dir_item; };
  auto inode = [](const Layout* l) { return Key{l->target_ino, fmtd::kInodeItemKey, 0}; };
  auto link_inode = [](const Layout* l) { return Key{l->link_ino, fmtd::kInodeItemKey, 0}; };
  auto ext0 = [](const Layout* l) { return Key{l->big_ino, fmtd::kExtentDataKey, 0}; };
  auto ext1 = [](const Layout* l) { return Key{l->big_ino, fmtd::kExtentDataKey, l->big_ext1_off}; };
  auto fe = [](Block& b, int s) -> fmtd::FileExtentItem& { return ItemAs<fmtd::FileExtentItem>(b, s); };
  const uint64_t big_ext0 = l->big_ext0, leaf = l->leaf;
  const std::vector<Case> cases = {
      ItemCase("DIR_ITEM name_len 300", fs_tree, dir, [](Block& b, int s) { ItemAs<fmtd::DirItem>(b, s).name_len.set(300); }),
      ItemCase("DIR_ITEM name_len 0", fs_tree, dir, [](Block& b, int s) { ItemAs<fmtd::DirItem>(b, s).name_len.set(0); }),
      ItemCase("DIR_ITEM cut short", fs_tree, dir, [](Block& b, int s) { ResizeItem(b, s, 10); }),
      ItemCase("DIR_ITEM location type 200", fs_tree, dir,
               [](Block& b, int s) { ItemAs<fmtd::DirItem>(b, s).location.type = 200; }),
      ItemCase("DIR_ITEM location: extent tree as a subvolume", fs_tree, dir,
               [](Block& b, int s) {
                 Key{fmtd::kExtentTreeObjectid, fmtd::kRootItemKey, UINT64_MAX}.To(&ItemAs<fmtd::DirItem>(b, s).location);
               }),
      ItemCase("INODE_ITEM too short", fs_tree, inode, [](Block& b, int s) { ResizeItem(b, s, 100); }),
      ItemCase("INODE_ITEM empty", fs_tree, inode, [](Block& b, int s) { ResizeItem(b, s, 0); }),
      ReadTimeOnly(ItemCase("symlink INODE_ITEM size 2^40", fs_tree, link_inode,
               [](Block& b, int s) { ItemAs<fmtd::InodeItem>(b, s).size.set(1ull << 40); })),
      ItemCase("file extent num_bytes 2^62", fs_tree, ext0, [fe](Block& b, int s) { fe(b, s).num_bytes.set(1ull << 62); }),
      ItemCase("file extent offset near 2^64", fs_tree, ext0,
               [fe](Block& b, int s) { fe(b, s).offset.set(UINT64_MAX - 100); }),
      ItemCase("file extent num_bytes overflowing", fs_tree, ext1,
               [fe](Block& b, int s) { fe(b, s).num_bytes.set(UINT64_MAX - 100); }),
      ItemCase("file extent disk_num_bytes 0", fs_tree, ext0, [fe](Block& b, int s) { fe(b, s).disk_num_bytes.set(0); }),
      ItemCase("file extent disk_bytenr unaligned", fs_tree, ext0,
               [fe, big_ext0](Block& b, int s) { fe(b, s).disk_bytenr.set(big_ext0 + 7); }),
      ItemCase("file extent disk_bytenr in no chunk", fs_tree, ext0,
               [fe](Block& b, int s) { fe(b, s).disk_bytenr.set(1ull << 40); }),
      ItemCase("file extent disk_bytenr in the metadata chunk", fs_tree, ext0,
               [fe, leaf](Block& b, int s) { fe(b, s).disk_bytenr.set(leaf); }),
      ItemCase("file extent type 7", fs_tree, ext0, [fe](Block& b, int s) { fe(b, s).type = 7; }),
      ItemCase("file extent item 30 bytes", fs_tree, ext0, [](Block& b, int s) { ResizeItem(b, s, 30); }),
      ItemCase("file extent encrypted", fs_tree, ext0, [fe](Block& b, int s) { fe(b, s).encryption = 1; }),
      ItemCase("file extent compression 9", fs_tree, ext0, [fe](Block& b, int s) { fe(b, s).compression = 9; }),
      ItemCase("file extent zstd with ram_bytes 2^40", fs_tree, ext0,
               [fe](Block& b, int s) {
                 fe(b, s).compression = fmtd::kCompressZstd;
                 fe(b, s).disk_num_bytes.set(4096);
                 fe(b, s).ram_bytes.set(1ull << 40);
               }),
      ReadTimeOnly(ItemCase("file extent zlib over plain data", fs_tree, ext0,
               [fe](Block& b, int s) { fe(b, s).compression = fmtd::kCompressZlib; })),
  };
  RunCases(l, cases);
}

TEST_F(DamagedAgreementTest, SuperblockDamage) {
  const Layout* l = Single();
  using SbMut = std::function<void(fmtd::SuperBlock&)>;
  const uint64_t primary = fmtd::kSuperInfoOffset, mirror = fmtd::SuperblockOffset(1);
  auto sb_case = [](std::string what, std::vector<std::tuple<uint64_t, SbMut, bool>> edits) {
    return Case{what, [edits](Patcher& p, const Layout*) {
                  for (const auto& [off, m, fix] : edits) ubtrfs_test::DamageSuper(p, off, m, fix);
                }};
  };
  // The primary alone (as BadPrimarySuperblockFallsBackToMirror damages
  // it): the library opens the copy at 64 MiB with a warning, but the image
  // is damaged -- the kernel and btrfs check use only the primary -- so the
  // checker must say so. Then both copies.
  const std::vector<Case> cases = {
      sb_case("primary superblock: bad magic", {{primary, [](fmtd::SuperBlock& sb) { sb.magic.set(0x1234); }, false}}),
      sb_case("primary superblock: flipped bit", {{primary, [](fmtd::SuperBlock& sb) { sb.label[10] ^= 1; }, false}}),
      sb_case("primary superblock: bytenr field", {{primary, [](fmtd::SuperBlock& sb) { sb.bytenr.set(4096); }, true}}),
      sb_case("primary superblock: sectorsize 1000",
              {{primary, [](fmtd::SuperBlock& sb) { sb.sectorsize.set(1000); }, true}}),
      sb_case("primary superblock: sys_chunk_array_size 4000",
              {{primary, [](fmtd::SuperBlock& sb) { sb.sys_chunk_array_size.set(4000); }, true}}),
      sb_case("primary superblock: root level 8", {{primary, [](fmtd::SuperBlock& sb) { sb.root_level = 8; }, true}}),
      sb_case("both superblocks: bad magic / checksum",
              {{primary, [](fmtd::SuperBlock& sb) { sb.magic.set(0); }, false},
               {mirror, [](fmtd::SuperBlock& sb) { sb.generation.set(sb.generation.get() + 1); }, false}}),
      sb_case("both superblocks: unknown incompat bit 40",
              {{primary, [](fmtd::SuperBlock& sb) { sb.incompat_flags.set(sb.incompat_flags.get() | 1ull << 40); }, true},
               {mirror, [](fmtd::SuperBlock& sb) { sb.incompat_flags.set(sb.incompat_flags.get() | 1ull << 40); }, true}}),
      sb_case("both superblocks: checksum type 4",
              {{primary, [](fmtd::SuperBlock& sb) { sb.csum_type.set(4); }, false},
               {mirror, [](fmtd::SuperBlock& sb) { sb.csum_type.set(4); }, false}}),
      sb_case("both superblocks: root level 8",
              {{primary, [](fmtd::SuperBlock& sb) { sb.root_level = 8; }, true},
               {mirror, [](fmtd::SuperBlock& sb) { sb.root_level = 8; }, true}}),
      sb_case("both superblocks: nodesize 12288",
              {{primary, [](fmtd::SuperBlock& sb) { sb.nodesize.set(3 << 12); }, true},
               {mirror, [](fmtd::SuperBlock& sb) { sb.nodesize.set(3 << 12); }, true}}),
  };
  RunCases(l, cases);
}

TEST_F(DamagedAgreementTest, DataAndDupDamage) {
  Table table;
  {
    // A flipped data bit: invisible to both without --check-data-csum, found
    // by both with it.
    const Layout* l = Single();
    Patcher p(l->path);
    p.FlipBit(l->Copies(l->big_ext1 + 3 * 4096, 4096).at(0) + 100, 0);
    for (bool data : {false, true}) {
      const Verdict o = Ours(l->path, data), t = Theirs(l->path, data);
      table.Add("flipped data bit in big.bin", data, o, t);
      EXPECT_EQ(o.clean(), !data) << Head(o.output);
      EXPECT_EQ(t.clean(), !data) << Head(t.output);
    }
  }
  {
    // No csum tree: its ROOT_ITEM renumbered to the unused quota tree id
    // (as MissingCsumTreeIsReported does), so checksummed data has no csums.
    const Layout* l = Single();
    Patcher p(l->path);
    l->DamageItem(p, l->vol->root_tree(), Key{fmtd::kCsumTreeObjectid, fmtd::kRootItemKey, 0}, [](Block& b, int s) {
      ASSERT_EQ(KeyAt(b, s + 1).objectid, fmtd::kUuidTreeObjectid);
      SetKey(b, s, Key{fmtd::kQuotaTreeObjectid, fmtd::kRootItemKey, 0});
    });
    ExpectAgree(&table, "no csum tree", l->path, false);
  }
  {
    // DUP metadata with one bad copy: both read the good copy. btrfs check
    // reports nothing; ubtrfs check warns (not an error).
    const Layout* l = Dup();
    Patcher p(l->path);
    l->Damage(p, l->leaf, [](Block& b) { b[100] ^= 1; }, /*fix_csum=*/false, /*copy_mask=*/1);
    ExpectAgree(&table, "DUP: first copy of a leaf corrupt", l->path, true);
  }
  {
    // A truncated image (cut in the middle of the data).
    const Layout* l = Single();
    const std::string cut = dir_->Sub("truncated.img");
    std::string err;
    const uint64_t size = l->Copies(l->big_ext1, 4096).at(0) + 512 * 1024 + 77;
    ASSERT_TRUE(ubtrfs_test::CopyPrefix(l->path, cut, size - size % 4096, &err)) << err;
    ExpectAgree(&table, "truncated in the middle of data", cut, std::nullopt);
    ::unlink(cut.c_str());
  }
}

}  // namespace
