// Reflinks (Filesystem::Clone, the FICLONERANGE rules): within a file,
// across files and across subvolumes; partial ranges that split extents;
// the source and the clone changed in turns; the kernel's own reflinks and
// dedupe changed by ubtrfs; copy_file_range through the FUSE mount. After
// each step btrfs check is clean and every file equals a host-side model;
// no clone takes data space, and the last owner's removal gives it back.
//
// The kernel comparisons need root and loop mounts (skipped, or that part
// left out, with a message otherwise); the FUSE test needs FUSE.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/fuse_mount.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

constexpr uint64_t K = 1024;

// The data extents of an image, from the kernel tools' dump of its extent
// tree (skinny metadata: every EXTENT_ITEM is data).
struct DataExtents {
  size_t count = 0;
  uint64_t bytes = 0;
};

DataExtents CountDataExtents(const std::string& img) {
  CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "extent", img});
  DataExtents d;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(" EXTENT_ITEM ");
    if (at == std::string::npos || line.find("key (") == std::string::npos) continue;
    ++d.count;
    d.bytes += std::stoull(line.substr(at + 13));
  }
  return d;
}

// Files by path, as they must read.
using Model = std::map<std::string, std::string>;

// "" when every file of the model reads as it says and btrfs check is clean.
std::string Verify(const std::string& img, const Model& model) {
  if (std::string c = BtrfsCheck(img); !c.empty()) return "btrfs check: " + c;
  auto fs = ubtrfs::Filesystem::Open(img);
  if (!fs.ok()) return "open: " + fs.status().ToString();
  for (const auto& [path, want] : model) {
    const std::string got = ReadImageFile(**fs, path);
    if (got != want) {
      size_t i = 0;
      while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
      return path + ": " + std::to_string(got.size()) + " bytes, model " + std::to_string(want.size()) +
             ", first difference at " + std::to_string(i) + (got.size() < 200 ? " (" + got + ")" : "");
    }
  }
  return "";
}

// A file's range replaced as Clone replaces it (the model side).
void CloneModel(Model& m, const std::string& src, uint64_t so, const std::string& dst, uint64_t doff, uint64_t len) {
  const std::string piece = m[src].substr(so, len);
  std::string& d = m[dst];
  if (d.size() < doff + len) d.resize(doff + len, '\0');
  d.replace(doff, len, piece);
}

ubtrfs::NewInode FileAttrs() {
  ubtrfs::NewInode a;
  a.mode = 0644;
  return a;
}

class Writable {
 public:
  explicit Writable(const std::string& img, ubtrfs::CompressOptions c = {}) {
    ubtrfs::OpenOptions o;
    o.writable = true;
    o.compress = c;
    auto r = ubtrfs::Filesystem::Open(img, o);
    if (r.ok()) fs_ = std::move(*r);
    else error_ = r.status().ToString();
  }
  ubtrfs::Filesystem* operator->() { return fs_.get(); }
  ubtrfs::Filesystem& operator*() { return *fs_; }
  bool ok() const { return fs_ != nullptr; }
  const std::string& error() const { return error_; }
  ubtrfs::InodeId Id(const std::string& path) {
    auto r = fs_->Lookup(path);
    EXPECT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    return r.ok() ? *r : ubtrfs::InodeId{};
  }
  ubtrfs::InodeId NewFile(const std::string& dir, const std::string& name, const std::string& data) {
    auto c = fs_->Create(Id(dir), name, FileAttrs());
    EXPECT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    if (!c.ok()) return {};
    if (!data.empty()) {
      auto w = fs_->Write(*c, 0, SpanOf(data));
      EXPECT_TRUE(w.ok()) << name << ": " << w.status().ToString();
    }
    return *c;
  }
  ubtrfs::Status Clone(const std::string& src, uint64_t so, const std::string& dst, uint64_t doff, uint64_t len) {
    return fs_->Clone(Id(src), so, Id(dst), doff, len);
  }

 private:
  std::unique_ptr<ubtrfs::Filesystem> fs_;
  std::string error_;
};

#define ASSERT_OK(expr)                                      \
  do {                                                       \
    const ubtrfs::Status st_ = (expr);                       \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_.ToString(); \
  } while (0)

// Compares the whole image as the kernel mounts it, where loop mounts work.
// `skip_times`: the kernel's placeholders for subvolumes a snapshot held
// (empty directories stamped at each lookup).
void KernelAgrees(const std::string& img, const std::string& mnt, const Model& model,
                  std::function<bool(const std::string&)> skip_times = {}) {
  std::string why;
  if (!LoopMountsAvailable(&why)) {
    std::cout << "[ INFO ] kernel comparison left out: loop mounts unavailable: " << why << "\n";
    return;
  }
  auto fs = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  CompareOptions opts = KernelMountCompareOptions();
  opts.skip_times = std::move(skip_times);
  auto mismatches = CompareTreeToImage(mnt, **fs, opts);
  EXPECT_TRUE(mismatches.empty()) << FormatMismatches(mismatches);
  for (const auto& [path, want] : model) EXPECT_TRUE(ReadHostFile(mnt + path) == want) << "kernel reads " << path;
  EXPECT_EQ(m.Unmount(), "");
}

TEST(Reflink, WithinAcrossFilesAndSubvolumesThenEachSideChanges) {
  if (std::string r = MkfsMissingReason(); !r.empty()) GTEST_SKIP() << r;
  TempDir tmp("ubtrfs-reflink");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  const DataExtents empty = CountDataExtents(img);
  Model m;
  DataExtents base;
  {
    Writable f(img);
    ASSERT_TRUE(f.ok()) << f.error();
    // Two extents of 1 MiB and 512 KiB, a small (inline) file and one of
    // 10,000 bytes (a partial last sector).
    m["/a"] = SeededBytes(1536 * K, 1);
    f.NewFile("/", "a", m["/a"].substr(0, 1024 * K));
    ASSERT_TRUE(f->Write(f.Id("/a"), 1024 * K, SpanOf(m["/a"].substr(1024 * K))).ok());
    m["/t"] = SeededBytes(10000, 2);
    f.NewFile("/", "t", m["/t"]);
    m["/small"] = "a small file that lives inline";
    f.NewFile("/", "small", m["/small"]);
    ASSERT_OK(f->Mkdir(f->Root(), "dir", ubtrfs::NewInode{.mode = 0755}).status());
    // A snapshot is a subvolume of its own: clones cross into it below.
    auto snap = f->CreateSnapshot(f->Root(), f->Root(), "snap", false);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    ASSERT_OK(f->Commit());
  }
  m["/snap/a"] = m["/a"], m["/snap/t"] = m["/t"], m["/snap/small"] = m["/small"];
  ASSERT_EQ(Verify(img, m), "");
  base = CountDataExtents(img);

  {
    Writable f(img);
    ASSERT_TRUE(f.ok()) << f.error();
    // Whole file, len 0 (to the end of the source).
    f.NewFile("/", "b", "");
    ASSERT_OK(f.Clone("/a", 0, "/b", 0, 0));
    CloneModel(m, "/a", 0, "/b", 0, m["/a"].size());
    // Within one file: a range inside the first extent onto one that
    // straddles both (the destination's extents split around it).
    ASSERT_OK(f.Clone("/a", 256 * K, "/a", 960 * K, 128 * K));
    CloneModel(m, "/a", 256 * K, "/a", 960 * K, 128 * K);
    // Past the destination's end: a hole in between.
    f.NewFile("/dir", "c", "head");
    m["/dir/c"] = "head";
    ASSERT_OK(f.Clone("/b", 4 * K, "/dir/c", 12 * K, 8 * K));
    CloneModel(m, "/b", 4 * K, "/dir/c", 12 * K, 8 * K);
    // A reference whose offset lies below 0 (the kernel's wrapped value).
    f.NewFile("/", "d", "");
    ASSERT_OK(f.Clone("/a", 512 * K, "/d", 0, 64 * K));
    CloneModel(m, "/a", 512 * K, "/d", 0, 64 * K);
    // Across subvolumes, in both directions.
    f.NewFile("/snap", "x", std::string(20000, 'x'));
    m["/snap/x"] = std::string(20000, 'x');
    ASSERT_OK(f.Clone("/a", 1024 * K, "/snap/x", 8 * K, 256 * K));
    CloneModel(m, "/a", 1024 * K, "/snap/x", 8 * K, 256 * K);
    f.NewFile("/", "y", "");
    ASSERT_OK(f.Clone("/snap/a", 0, "/y", 64 * K, 512 * K));
    CloneModel(m, "/snap/a", 0, "/y", 64 * K, 512 * K);
    // The partial last sector, to 0 and past the end of a destination.
    f.NewFile("/", "u", "");
    ASSERT_OK(f.Clone("/t", 0, "/u", 0, m["/t"].size()));
    CloneModel(m, "/t", 0, "/u", 0, m["/t"].size());
    f.NewFile("/", "u2", "short");
    m["/u2"] = "short";
    ASSERT_OK(f.Clone("/t", 8 * K, "/u2", 8 * K, 0));
    CloneModel(m, "/t", 8 * K, "/u2", 8 * K, m["/t"].size() - 8 * K);
    // An inline source: copied, at 0 (inline again) and further in.
    f.NewFile("/", "s0", "");
    ASSERT_OK(f.Clone("/small", 0, "/s0", 0, 0));
    CloneModel(m, "/small", 0, "/s0", 0, m["/small"].size());
    f.NewFile("/", "s1", "inline destination");
    m["/s1"] = "inline destination";
    ASSERT_OK(f.Clone("/small", 0, "/s1", 8 * K, 0));
    CloneModel(m, "/small", 0, "/s1", 8 * K, m["/small"].size());
    ASSERT_OK(f->Commit());
  }
  ASSERT_EQ(Verify(img, m), "");
  {
    // No data space for any of it: only /snap/x's own 20,000 bytes (five
    // sectors) and four more: the inline files that took a clone past their
    // first sector became regular (c, u2, s1), and the inline source's data
    // was written into s1.
    const DataExtents after = CountDataExtents(img);
    EXPECT_EQ(after.bytes, base.bytes + 20 * K + 16 * K) << "a clone took data space";
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    auto st = (*fs)->GetStat(*(*fs)->Lookup("/b"));
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->nbytes, 1536 * K);
  }

  // Each side changes alone: overwrite and truncate the source, then the
  // clones; unlink in turns.
  const std::vector<std::function<void(Writable&)>> steps = {
      [&](Writable& f) {
        const std::string p(4 * K, 'P');
        ASSERT_TRUE(f->Write(f.Id("/a"), 300 * K, SpanOf(p)).ok());
        m["/a"].replace(300 * K, p.size(), p);
        ubtrfs::AttrChange t;
        t.size = 700 * K + 123;
        ASSERT_OK(f->SetAttr(f.Id("/a"), t));
        m["/a"].resize(*t.size);
      },
      [&](Writable& f) {
        const std::string p(10 * K, 'Q');
        ASSERT_TRUE(f->Write(f.Id("/b"), 2 * K, SpanOf(p)).ok());
        m["/b"].replace(2 * K, p.size(), p);
        ubtrfs::AttrChange t;
        t.size = 5000;
        ASSERT_OK(f->SetAttr(f.Id("/snap/x"), t));
        m["/snap/x"].resize(5000);
        ASSERT_OK(f->Unlink(f.Id("/"), "d"));
        m.erase("/d");
      },
      [&](Writable& f) {
        // A clone of a clone, then the middle one goes.
        f.NewFile("/", "e", "");
        ASSERT_OK(f.Clone("/y", 64 * K, "/e", 0, 256 * K));
        CloneModel(m, "/y", 64 * K, "/e", 0, 256 * K);
        ASSERT_OK(f->Unlink(f.Id("/"), "y"));
        m.erase("/y");
        ASSERT_OK(f->Unlink(f.Id("/"), "a"));
        m.erase("/a");
      },
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    {
      Writable f(img);
      ASSERT_TRUE(f.ok()) << f.error();
      steps[i](f);
      ASSERT_OK(f->Commit());
    }
    ASSERT_EQ(Verify(img, m), "") << "after step " << i;
  }
  KernelAgrees(img, mnt, m);

  // The last owners go: the data space comes back.
  {
    Writable f(img);
    ASSERT_TRUE(f.ok()) << f.error();
    for (const char* name : {"b", "e", "t", "u", "u2", "small", "s0", "s1"}) ASSERT_OK(f->Unlink(f.Id("/"), name));
    ASSERT_OK(f->Unlink(f.Id("/dir"), "c"));
    ASSERT_OK(f->Commit());
    // The snapshot's: its copies of a and t, x's first sectors and the
    // sector its truncate rewrote.
    EXPECT_EQ(CountDataExtents(img).count, base.count + 2);
    for (const char* name : {"a", "t", "small", "x"}) ASSERT_OK(f->Unlink(f.Id("/snap"), name));
    ASSERT_OK(f->Commit());
  }
  m.clear();
  ASSERT_EQ(Verify(img, m), "");
  const DataExtents end = CountDataExtents(img);
  EXPECT_EQ(end.count, empty.count);
  EXPECT_EQ(end.bytes, empty.bytes);
}

TEST(Reflink, CompressedExtentsArePartlyShared) {
  if (std::string r = MkfsMissingReason(); !r.empty()) GTEST_SKIP() << r;
  TempDir tmp("ubtrfs-reflink-z");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  Model m;
  std::string text;
  for (int i = 0; text.size() < 600 * K; ++i) text += "line " + std::to_string(i * 7919 % 1000) + " of some text\n";
  text.resize(600 * K);
  m["/z"] = text;
  DataExtents before;
  {
    ubtrfs::CompressOptions c;
    ASSERT_OK(ubtrfs::ParseCompressSpec("zstd", &c));
    Writable f(img, c);
    ASSERT_TRUE(f.ok()) << f.error();
    f.NewFile("/", "z", text);
    ASSERT_OK(f->Commit());
    before = CountDataExtents(img);
    // Ranges that start and end inside 128 KiB compressed extents.
    f.NewFile("/", "z1", "");
    ASSERT_OK(f.Clone("/z", 100 * K, "/z1", 0, 200 * K));
    CloneModel(m, "/z", 100 * K, "/z1", 0, 200 * K);
    f.NewFile("/", "z2", std::string(64 * K, 'w'));
    m["/z2"] = std::string(64 * K, 'w');
    ASSERT_OK(f.Clone("/z", 4 * K, "/z2", 16 * K, 0));
    CloneModel(m, "/z", 4 * K, "/z2", 16 * K, text.size() - 4 * K);
    ASSERT_OK(f->Commit());
  }
  ASSERT_EQ(Verify(img, m), "");
  EXPECT_EQ(CountDataExtents(img).count, before.count + 1) << "only z2's own extent is new";
  {
    Writable f(img);
    ASSERT_TRUE(f.ok());
    ASSERT_OK(f->Unlink(f.Id("/"), "z"));
    m.erase("/z");
    const std::string p(8 * K, 'p');
    ASSERT_TRUE(f->Write(f.Id("/z1"), 60 * K, SpanOf(p)).ok());
    m["/z1"].replace(60 * K, p.size(), p);
    ASSERT_OK(f->Commit());
  }
  ASSERT_EQ(Verify(img, m), "");
  KernelAgrees(img, mnt, m);
}

TEST(Reflink, ErrorsAsTheKernelGivesThem) {
  if (std::string r = MkfsMissingReason(); !r.empty()) GTEST_SKIP() << r;
  TempDir tmp("ubtrfs-reflink-err");
  const std::string img = tmp.Sub("img");
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 256ull << 20), "");
  Writable f(img);
  ASSERT_TRUE(f.ok()) << f.error();
  const std::string data = SeededBytes(64 * K + 100, 3);
  f.NewFile("/", "f", data);
  f.NewFile("/", "g", std::string(128 * K, 'g'));
  ASSERT_OK(f->Mkdir(f->Root(), "dir", ubtrfs::NewInode{.mode = 0755}).status());
  ASSERT_OK(f->Symlink(f->Root(), "link", "f", FileAttrs()).status());
  auto ro = f->CreateSnapshot(f->Root(), f->Root(), "ro", true);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  const auto code = [&](const std::string& s, uint64_t so, const std::string& d, uint64_t doff, uint64_t len) {
    return f.Clone(s, so, d, doff, len).code();
  };
  EXPECT_EQ(code("/f", 100, "/g", 0, 4 * K), EINVAL) << "unaligned source offset";
  EXPECT_EQ(code("/f", 0, "/g", 100, 4 * K), EINVAL) << "unaligned destination offset";
  EXPECT_EQ(code("/f", 0, "/g", 0, 5000), EINVAL) << "unaligned length inside the source";
  EXPECT_EQ(code("/f", 0, "/g", 0, 128 * K), EINVAL) << "past the end of the source";
  EXPECT_EQ(code("/f", 68 * K, "/g", 0, 0), EINVAL) << "offset past the end";
  EXPECT_EQ(code("/f", 0, "/f", 32 * K, 48 * K), EINVAL) << "overlap in one file";
  EXPECT_EQ(code("/f", 32 * K, "/f", 0, 48 * K), EINVAL) << "overlap in one file";
  EXPECT_EQ(code("/f", 0, "/f", 4 * K, 8 * K), EINVAL) << "overlap in one file";
  EXPECT_EQ(code("/f", 60 * K, "/f", 64 * K, 0), EINVAL) << "the EOF sector overlaps";
  EXPECT_EQ(code("/f", 64 * K, "/g", 0, 0), EINVAL) << "a partial last sector into the middle";
  EXPECT_EQ(code("/dir", 0, "/g", 0, 4 * K), EISDIR);
  EXPECT_EQ(code("/f", 0, "/dir", 0, 4 * K), EISDIR);
  EXPECT_EQ(code("/link", 0, "/g", 0, 4 * K), EINVAL);
  EXPECT_EQ(code("/f", 0, "/ro/g", 0, 4 * K), EROFS) << "into a read-only snapshot";
  // Out of one is fine, and so is a range ending at the source's end.
  EXPECT_EQ(code("/ro/f", 0, "/g", 0, 4 * K), 0);
  EXPECT_EQ(code("/f", 64 * K, "/g", 128 * K, 0), 0);
  EXPECT_EQ(code("/f", data.size(), "/g", 0, 0), 0) << "len 0 at the end: nothing to do";
  ASSERT_OK(f->Commit());
  Model m{{"/f", data}};
  m["/g"] = std::string(128 * K, 'g');
  m["/g"].replace(0, 4 * K, data.substr(0, 4 * K));
  m["/g"] += data.substr(64 * K);
  ASSERT_EQ(Verify(img, m), "");
}

// The kernel's reflinks (cp --reflink=always, xfs_io reflink) and dedupe,
// in a subvolume, changed by ubtrfs (which clones across them as well).
TEST(KernelReflinks, UbtrfsChangesThemAndTheKernelAgrees) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const bool have_xfs_io = !FindProgram("xfs_io").empty();
  TempDir tmp("ubtrfs-kreflink");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  Model m;
  m["/sv/f"] = SeededBytes(1024 * K, 11);
  m["/sv/h"] = m["/sv/f"].substr(0, 256 * K) + SeededBytes(256 * K, 12);
  {
    LoopMount lm;
    ASSERT_EQ(lm.Mount(img, mnt), "");
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "create", mnt + "/sv"}), "");
    WriteHostFile(mnt + "/sv/f", m["/sv/f"]);
    WriteHostFile(mnt + "/sv/h", m["/sv/h"]);
    ASSERT_EQ(MustRun({"sync"}), "");
    ASSERT_EQ(MustRun({"cp", "--reflink=always", mnt + "/sv/f", mnt + "/sv/g"}), "");
    m["/sv/g"] = m["/sv/f"];
    ASSERT_EQ(MustRun({"cp", "--reflink=always", mnt + "/sv/f", mnt + "/top"}), "");
    m["/top"] = m["/sv/f"];
    if (have_xfs_io) {
      WriteHostFile(mnt + "/sv/r", std::string(512 * K, 'r'));
      m["/sv/r"] = std::string(512 * K, 'r');
      ASSERT_EQ(MustRun({"xfs_io", "-c", "reflink " + mnt + "/sv/f 64k 128k 256k", mnt + "/sv/r"}), "");
      CloneModel(m, "/sv/f", 64 * K, "/sv/r", 128 * K, 256 * K);
      ASSERT_EQ(MustRun({"xfs_io", "-c", "dedupe " + mnt + "/sv/f 0 0 256k", mnt + "/sv/h"}), "");
    } else {
      std::cout << "[ INFO ] xfs_io missing (package xfsprogs): no xfs_io reflink or dedupe\n";
    }
    ASSERT_EQ(lm.Unmount(), "");
  }
  ASSERT_EQ(Verify(img, m), "");
  const DataExtents kernel_made = CountDataExtents(img);
  {
    Writable f(img);
    ASSERT_TRUE(f.ok()) << f.error();
    // Overwrite inside the shared extents, truncate, delete, clone across.
    const std::string p(12 * K, 'P');
    ASSERT_TRUE(f->Write(f.Id("/sv/g"), 100 * K, SpanOf(p)).ok());
    m["/sv/g"].replace(100 * K, p.size(), p);
    ubtrfs::AttrChange t;
    t.size = 300 * K + 1;
    ASSERT_OK(f->SetAttr(f.Id("/sv/f"), t));
    m["/sv/f"].resize(*t.size);
    f.NewFile("/", "c", "");
    ASSERT_OK(f.Clone("/sv/g", 0, "/c", 0, 0));
    CloneModel(m, "/sv/g", 0, "/c", 0, m["/sv/g"].size());
    if (have_xfs_io) {
      ASSERT_TRUE(f->Write(f.Id("/sv/h"), 0, SpanOf(p)).ok());
      m["/sv/h"].replace(0, p.size(), p);
      ASSERT_OK(f->Unlink(f.Id("/sv"), "r"));
      m.erase("/sv/r");
    }
    ASSERT_OK(f->Commit());
  }
  ASSERT_EQ(Verify(img, m), "");
  // Only what was written: two 12 KiB patches and the truncated file's last sector.
  EXPECT_LE(CountDataExtents(img).bytes, kernel_made.bytes + 28 * K) << "ubtrfs' clone took data space";
  KernelAgrees(img, mnt, m);
  {
    // The kernel writes and deletes too; ubtrfs changes it again.
    LoopMount lm;
    ASSERT_EQ(lm.Mount(img, mnt), "");
    EXPECT_EQ(unlink((mnt + "/top").c_str()), 0);
    m.erase("/top");
    EXPECT_EQ(lm.Unmount(), "");
  }
  {
    Writable f(img);
    ASSERT_TRUE(f.ok()) << f.error();
    ASSERT_OK(f->Unlink(f.Id("/sv"), "g"));
    m.erase("/sv/g");
    ASSERT_OK(f->Unlink(f.Id("/sv"), "f"));
    m.erase("/sv/f");
    ASSERT_OK(f->Commit());
  }
  ASSERT_EQ(Verify(img, m), "");
  KernelAgrees(img, mnt, m);
}


// `ubtrfs cp --reflink IMAGE:SRC IMAGE:DST`: a tree copied inside the image,
// across subvolumes too, its regular files sharing their data; the rest
// (directories, symlinks, fifos, hard links, xattrs, modes and times) as cp
// keeps them.
TEST(CliReflink, CopiesATreeSharingTheData) {
  if (std::string r = MkfsMissingReason(); !r.empty()) GTEST_SKIP() << r;
  TempDir tmp("ubtrfs-cli-reflink");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  Model m;
  {
    Writable f(img);
    ASSERT_TRUE(f.ok()) << f.error();
    ASSERT_OK(f->Mkdir(f->Root(), "tree", ubtrfs::NewInode{.mode = 0750}).status());
    ASSERT_OK(f->Mkdir(f.Id("/tree"), "sub", ubtrfs::NewInode{.mode = 0700}).status());
    for (int i = 0; i < 5; ++i) {
      m["/tree/f" + std::to_string(i)] = SeededBytes(50000 + i * 70000, 30 + i);
      f.NewFile("/tree", "f" + std::to_string(i), m["/tree/f" + std::to_string(i)]);
    }
    m["/tree/sub/small"] = "small";
    const ubtrfs::InodeId small = f.NewFile("/tree/sub", "small", "small");
    ASSERT_OK(f->Link(small, f.Id("/tree"), "hard"));
    m["/tree/hard"] = "small";
    ASSERT_OK(f->SetXattr(f.Id("/tree/f1"), "user.note", "kept"));
    ASSERT_OK(f->Symlink(f.Id("/tree"), "link", "sub/small", FileAttrs()).status());
    ubtrfs::NewInode fifo = FileAttrs();
    fifo.mode = S_IFIFO | 0600;
    ASSERT_OK(f->Mknod(f.Id("/tree/sub"), "fifo", fifo).status());
    ubtrfs::AttrChange t;
    t.mtime = ubtrfs::Time{1000000000, 5};
    ASSERT_OK(f->SetAttr(f.Id("/tree/f2"), t));
    ASSERT_OK(f->CreateSnapshot(f->Root(), f->Root(), "sv", false).status());
    ASSERT_OK(f->CreateSnapshot(f->Root(), f->Root(), "ro", true).status());
    ASSERT_OK(f->Commit());
  }
  const DataExtents before = CountDataExtents(img);
  for (const auto& [dst, prefix] : std::vector<std::pair<std::string, std::string>>{{"/copy", "/copy"},
                                                                                     {"/sv/tree2", "/sv/tree2"}}) {
    CommandResult r = RunCommand({UBTRFS_CLI_PATH, "cp", "--reflink", img + ":/tree", img + ":" + dst});
    ASSERT_TRUE(r.ok()) << r.Describe();
    for (const auto& [path, data] : Model(m)) {
      if (path.rfind("/tree/", 0) == 0) m[prefix + path.substr(5)] = data;
    }
  }
  ASSERT_EQ(Verify(img, m), "");
  EXPECT_EQ(CountDataExtents(img).bytes, before.bytes) << "the copies took data space";
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    ubtrfs::Filesystem& f = **fs;
    for (const std::string top : {"/copy", "/sv/tree2"}) {
      auto a = f.GetStat(*f.Lookup("/tree/f2")), b = f.GetStat(*f.Lookup(top + "/f2"));
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(b->mtime.sec, a->mtime.sec);
      EXPECT_EQ(b->mtime.nsec, a->mtime.nsec);
      auto d = f.GetStat(*f.Lookup(top));
      ASSERT_TRUE(d.ok());
      EXPECT_EQ(d->mode & 07777, 0750u);
      EXPECT_EQ(*f.GetXattr(*f.Lookup(top + "/f1"), "user.note"), "kept");
      EXPECT_EQ(*f.ReadLink(*f.Lookup(top + "/link")), "sub/small");
      auto fifo = f.GetStat(*f.Lookup(top + "/sub/fifo"));
      ASSERT_TRUE(fifo.ok());
      EXPECT_TRUE(S_ISFIFO(fifo->mode));
      EXPECT_EQ(*f.Lookup(top + "/hard"), *f.Lookup(top + "/sub/small")) << "hard link kept";
    }
  }
  // Refused: into a read-only snapshot, into itself, across images.
  CommandResult ro = RunCommand({UBTRFS_CLI_PATH, "cp", "--reflink", img + ":/tree", img + ":/ro/tree2"});
  EXPECT_EQ(ro.exit_code, 1) << ro.Describe();
  EXPECT_NE(ro.err.find("read-only"), std::string::npos) << ro.err;
  CommandResult self = RunCommand({UBTRFS_CLI_PATH, "cp", "--reflink", img + ":/tree", img + ":/tree/sub"});
  EXPECT_EQ(self.exit_code, 1) << self.Describe();
  EXPECT_NE(self.err.find("into itself"), std::string::npos) << self.err;
  CommandResult other = RunCommand({UBTRFS_CLI_PATH, "cp", "--reflink", img + ":/tree", tmp.Sub("host")});
  EXPECT_EQ(other.exit_code, 2) << other.Describe();
  ASSERT_EQ(Verify(img, m), "");
  KernelAgrees(img, mnt, m, [](const std::string& rel) { return rel == "ro/sv"; });
}

// copy_file_range through the FUSE mount shares whole sectors (no new data
// extent) and copies what is not whole sectors; cp (coreutils' default
// --reflink=auto falls back to copy_file_range) therefore reflinks too.
TEST(FuseReflink, CopyFileRangeSharesAlignedRanges) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(512ull << 20), "");
  Model m;
  m["/src"] = SeededBytes(1024 * K + 100, 21);
  {
    Writable f(s.img);
    ASSERT_TRUE(f.ok()) << f.error();
    f.NewFile("/", "src", m["/src"]);
    ASSERT_OK(f->Commit());
  }
  const DataExtents before = CountDataExtents(s.img);
  MountProcess mount;
  START_MOUNT(mount, s, "-o", "stats");
  const auto copy = [&](const std::string& from, off_t in_off, const std::string& to, off_t out_off, size_t len) {
    const int in = open((s.mnt + from).c_str(), O_RDONLY);
    const int out = open((s.mnt + to).c_str(), O_WRONLY | O_CREAT, 0644);
    EXPECT_GE(in, 0);
    EXPECT_GE(out, 0);
    size_t total = 0;
    while (total < len) {
      const ssize_t n = copy_file_range(in, &in_off, out, &out_off, len - total, 0);
      EXPECT_GE(n, 0) << strerror(errno);
      if (n <= 0) break;
      total += static_cast<size_t>(n);
    }
    close(in);
    close(out);
    return total;
  };
  // The whole file, its partial last sector included (the destination is new).
  EXPECT_EQ(copy("/src", 0, "/whole", 0, m["/src"].size()), m["/src"].size());
  CloneModel(m, "/src", 0, "/whole", 0, m["/src"].size());
  // Aligned offsets, an unaligned length: the sectors shared, the tail copied.
  EXPECT_EQ(copy("/src", 64 * K, "/part", 0, 128 * K + 10), 128 * K + 10);
  CloneModel(m, "/src", 64 * K, "/part", 0, 128 * K + 10);
  // Unaligned offsets: a copy.
  EXPECT_EQ(copy("/src", 100, "/bytes", 0, 5000), 5000u);
  CloneModel(m, "/src", 100, "/bytes", 0, 5000);
  EXPECT_TRUE(ReadHostFile(s.mnt + "/whole") == m["/whole"]) << "the mount reads the clone";
  EXPECT_TRUE(ReadHostFile(s.mnt + "/part") == m["/part"]);
  // cp as a user runs it.
  CommandResult cp = RunCommand({"cp", s.mnt + "/src", s.mnt + "/cp"});
  EXPECT_TRUE(cp.ok()) << cp.Describe();
  m["/cp"] = m["/src"];
  // FICLONE never reaches a FUSE server (the VFS answers it): documented.
  CommandResult always = RunCommand({"cp", "--reflink=always", s.mnt + "/src", s.mnt + "/always"});
  std::cout << "[ INFO ] cp --reflink=always on the mount: " << (always.ok() ? "works" : always.Describe()) << "\n";
  unlink((s.mnt + "/always").c_str());
  std::string err;
  EXPECT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
  ASSERT_EQ(Verify(s.img, m), "");
  // New data: the 10-byte tail of /part and /bytes' 5000 bytes, a sector or
  // two each; nothing for /whole or /cp.
  const DataExtents after = CountDataExtents(s.img);
  EXPECT_EQ(after.count, before.count + 2);
  EXPECT_EQ(after.bytes, before.bytes + 4 * K + 8 * K);
}

}  // namespace
}  // namespace ubtrfs_test
