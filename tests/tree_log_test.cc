// ubtrfs's own tree log (Filesystem::Fsync): the same fsync patterns as
// log_replay_test.cc's kernel log, made through the library (a new file in a
// new directory, fsync of an unlinked file's directory, appends, an
// overwrite inside a committed file, writes in 150 places of one, renames of committed and fsynced files,
// an xattr, a hard link, a second subvolume, an inline file, a truncate that
// leaves a hole), and the image copied after the last fsync, as after a
// power cut: the copy has a log (superblock log_root != 0) and every fsynced
// file must come back:
// - through ubtrfs, read-only (replayed in memory) and writable (replayed and
//   committed; btrfs check clean);
// - through the kernel's own replay at mount (where loop mounts work), with
//   the same tree as ubtrfs's replay.
// And an fsync writes only a few blocks, not a commit's.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/fsync_expect.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/stats.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

using ubtrfs::Filesystem;
using ubtrfs::InodeId;
using ubtrfs::Status;

// Library helpers that report the first failure as a string.
class Ops {
 public:
  explicit Ops(Filesystem& fs) : fs_(fs) {}
  std::string err;

  InodeId Path(const std::string& p) {
    auto id = fs_.Lookup(p);
    if (!id.ok()) Fail(p + ": " + id.status().ToString());
    return id.ok() ? *id : InodeId{};
  }
  std::pair<InodeId, std::string> Parent(const std::string& p) {
    const size_t slash = p.rfind('/');
    return {Path(slash == 0 ? "/" : p.substr(0, slash)), p.substr(slash + 1)};
  }
  InodeId Mkdir(const std::string& p) {
    auto [dir, name] = Parent(p);
    ubtrfs::NewInode a;
    a.mode = 040755;
    auto id = fs_.Mkdir(dir, name, a);
    if (!id.ok()) Fail("mkdir " + p + ": " + id.status().ToString());
    return id.ok() ? *id : InodeId{};
  }
  // Writes `data` at `at` (creating the file, or appending at -1).
  InodeId Write(const std::string& p, const std::string& data, int64_t at = 0) {
    auto id = fs_.Lookup(p);
    if (!id.ok()) {
      auto [dir, name] = Parent(p);
      ubtrfs::NewInode a;
      a.mode = 0100644;
      id = fs_.Create(dir, name, a);
      if (!id.ok()) {
        Fail("create " + p + ": " + id.status().ToString());
        return {};
      }
    }
    uint64_t off = static_cast<uint64_t>(at);
    if (at < 0) {
      auto st = fs_.GetStat(*id);
      off = st.ok() ? st->size : 0;
    }
    auto n = fs_.Write(*id, off, SpanOf(data));
    if (!n.ok()) Fail("write " + p + ": " + n.status().ToString());
    return *id;
  }
  void Fsync(const std::string& p) {
    InodeId id = Path(p);
    if (Status s = fs_.Fsync(id, false); !s.ok()) Fail("fsync " + p + ": " + s.ToString());
  }
  void Commit() {
    if (Status s = fs_.Commit(); !s.ok()) Fail("commit: " + s.ToString());
  }
  void Check(const Status& s, const std::string& what) {
    if (!s.ok()) Fail(what + ": " + s.ToString());
  }

 private:
  void Fail(const std::string& e) {
    if (err.empty()) err = e;
  }
  Filesystem& fs_;
};

// The log made on an image of mkfs.btrfs's defaults, or on one without
// no-holes (mkfs.btrfs before 5.15), whose files have an explicit hole item
// over every range without data: the log must carry those too, or a replay
// leaves a gap that btrfs check reports.
template <bool kNoHoles>
class TreeLogOn : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir("ubtrfs-treelog");
    log_img_ = tmp_->Sub("log.img");
    setup_error_ = Make();
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(setup_error_.empty()) << setup_error_; }

  static std::string Make() {
    const std::vector<std::string> features =
        kNoHoles ? std::vector<std::string>{} : std::vector<std::string>{"-O", "^no-holes"};
    if (std::string e = RunMkfs(log_img_, "", 0, "", 256ull << 20, features); !e.empty()) return e;
    Expected& x = expected_;
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fsr = Filesystem::Open(log_img_, o);
    if (!fsr.ok()) return fsr.status().ToString();
    Filesystem& fs = **fsr;
    Ops op(fs);
    // The committed state.
    op.Mkdir("/old");
    op.Write("/old/a", "hello\n");
    op.Write("/old/b", SeededBytes(10000, 2));
    op.Write("/old/c", SeededBytes(65536, 3));
    op.Write("/old/gone", "to be removed");
    op.Write("/old/keep", "kept as it was");
    op.Write("/old/trunc", SeededBytes(40000, 10));
    op.Write("/old/scatter", SeededBytes(2 << 20, 12));
    op.Write("/old/grow", SeededBytes(5000, 13));
    auto sv = fs.CreateSubvolume(op.Path("/"), "sv", ubtrfs::NewInode{.mode = 040755});
    if (!sv.ok()) return "subvolume: " + sv.status().ToString();
    op.Write("/sv/committed", "in a subvolume");
    op.Mkdir("/other");
    op.Mkdir("/other/sub");
    op.Write("/other/sub/inner", "inner");
    op.Write("/other/f", "moved across");
    op.Commit();
    if (!op.err.empty()) return op.err;

    // A new file in a new directory.
    op.Mkdir("/newdir");
    x.files["/newdir/f1"] = SeededBytes(300000, 1);
    op.Write("/newdir/f1", x.files["/newdir/f1"]);
    op.Fsync("/newdir/f1");
    // The directory of an unlinked file.
    op.Check(fs.Unlink(op.Path("/old"), "gone"), "unlink gone");
    op.Fsync("/old");
    x.gone.push_back("/old/gone");
    // A new file in an existing directory.
    x.files["/newdir/f2"] = SeededBytes(200000, 7);
    op.Write("/newdir/f2", x.files["/newdir/f2"]);
    op.Fsync("/newdir/f2");
    // Appends to a committed file, each fsynced; an overwrite inside another.
    std::string b = SeededBytes(10000, 2);
    for (int i = 0; i < 5; ++i) {
      const std::string more = SeededBytes(7000 + i, 40 + i);
      op.Write("/old/b", more, -1);
      op.Fsync("/old/b");
      b += more;
    }
    x.files["/old/b"] = b;
    const std::string patch = SeededBytes(4096, 5);
    op.Write("/old/c", patch, 8192);
    op.Fsync("/old/c");
    x.files["/old/c"] = SeededBytes(65536, 3).replace(8192, 4096, patch);
    // A committed file written in 150 places apart from each other (random
    // writes: each a range of its own to log), then fsynced once.
    {
      std::string want = SeededBytes(2 << 20, 12);
      for (int i = 0; i < 150; ++i) {
        const uint64_t at = uint64_t(i) * 37 % 200 * 8192 + 1000;  // no two in adjacent blocks
        const std::string piece = SeededBytes(100, 200 + i);
        op.Write("/old/scatter", piece, static_cast<int64_t>(at));
        want.replace(at, piece.size(), piece);
      }
      op.Fsync("/old/scatter");
      x.files["/old/scatter"] = want;
    }
    // A committed file truncated and written past a hole.
    {
      InodeId t = op.Path("/old/trunc");
      ubtrfs::AttrChange ch;
      ch.size = 4096;
      op.Check(fs.SetAttr(t, ch), "truncate");
      op.Write("/old/trunc", "tail", 20000);
      op.Fsync("/old/trunc");
      std::string want = SeededBytes(40000, 10).substr(0, 4096);
      want.resize(20000, '\0');
      x.files["/old/trunc"] = want + "tail";
    }
    // A committed file extended by a truncate: a hole to its new end.
    {
      ubtrfs::AttrChange ch;
      ch.size = 1 << 20;
      op.Check(fs.SetAttr(op.Path("/old/grow"), ch), "extend");
      op.Fsync("/old/grow");
      std::string want = SeededBytes(5000, 13);
      want.resize(1 << 20, '\0');
      x.files["/old/grow"] = want;
    }
    // A committed file renamed, and a file fsynced, renamed, fsynced again.
    op.Check(fs.Rename(op.Path("/old"), "a", op.Path("/newdir"), "a_renamed"), "rename a");
    op.Fsync("/newdir/a_renamed");
    x.files["/newdir/a_renamed"] = "hello\n";
    x.gone.push_back("/old/a");
    x.files["/old/r1_moved"] = SeededBytes(5000, 6);
    op.Write("/newdir/r1", x.files["/old/r1_moved"]);
    op.Fsync("/newdir/r1");
    op.Check(fs.Rename(op.Path("/newdir"), "r1", op.Path("/old"), "r1_moved"), "rename r1");
    op.Fsync("/old/r1_moved");
    x.gone.push_back("/newdir/r1");
    // An xattr.
    x.files["/newdir/x"] = "a file with an xattr";
    op.Write("/newdir/x", x.files["/newdir/x"]);
    op.Check(fs.SetXattr(op.Path("/newdir/x"), "user.k", "v1"), "setxattr");
    op.Fsync("/newdir/x");
    // A hard link.
    op.Check(fs.Link(op.Path("/newdir/f1"), op.Path("/old"), "f1link"), "link");
    op.Fsync("/newdir/f1");
    x.files["/old/f1link"] = x.files["/newdir/f1"];
    x.nlink["/newdir/f1"] = 2;
    // A file in another subvolume: a second log tree.
    x.files["/sv/new"] = SeededBytes(20000, 8);
    op.Write("/sv/new", x.files["/sv/new"]);
    op.Fsync("/sv/new");
    x.files["/sv/committed"] = "in a subvolume";
    // A file fsynced, then deleted, then another fsync: it stays gone.
    op.Write("/newdir/tmp", "temporary");
    op.Fsync("/newdir/tmp");
    op.Check(fs.Unlink(op.Path("/newdir"), "tmp"), "unlink tmp");
    // A new directory deep down.
    op.Mkdir("/newdir/d1");
    op.Mkdir("/newdir/d1/d2");
    x.files["/newdir/d1/d2/deep"] = SeededBytes(9000, 11);
    op.Write("/newdir/d1/d2/deep", x.files["/newdir/d1/d2/deep"]);
    op.Fsync("/newdir/d1/d2/deep");
    x.gone.push_back("/newdir/tmp");
    // A committed directory and a committed file moved to another
    // directory (neither directory fsynced): the old names must go at the
    // replay (fsstress found directories with two names, which the
    // kernel's replay refuses).
    op.Check(fs.Rename(op.Path("/other"), "sub", op.Path("/newdir"), "sub_moved"), "rename sub");
    x.files["/newdir/sub_moved/inner2"] = "inner, later";
    op.Write("/newdir/sub_moved/inner2", x.files["/newdir/sub_moved/inner2"]);
    op.Fsync("/newdir/sub_moved/inner2");
    x.files["/newdir/sub_moved/inner"] = "inner";
    x.gone.push_back("/other/sub");
    op.Check(fs.Rename(op.Path("/other"), "f", op.Path("/newdir"), "f_moved"), "rename f");
    op.Fsync("/newdir/f_moved");
    x.files["/newdir/f_moved"] = "moved across";
    x.nlink["/newdir/f_moved"] = 1;
    x.gone.push_back("/other/f");
    // A small (inline) file.
    x.files["/newdir/small"] = "tiny";
    op.Write("/newdir/small", "tiny");
    op.Fsync("/newdir/small");
    x.files["/old/keep"] = "kept as it was";
    if (!op.err.empty()) return op.err;
    // The power cut: the image as it is now, before any commit.
    std::filesystem::copy_file(log_img_, tmp_->Sub("copy.img"));
    fsr->reset();
    std::filesystem::rename(tmp_->Sub("copy.img"), log_img_);
    if (SuperField(log_img_, "log_root") == 0 || SuperField(log_img_, "log_root") == UINT64_MAX) {
      return "the copy has no tree log (log_root 0): the fsyncs committed";
    }
    return "";
  }

  static std::string CopyOf(const std::string& name) {
    const std::string p = tmp_->Sub(name);
    std::filesystem::copy_file(log_img_, p, std::filesystem::copy_options::overwrite_existing);
    return p;
  }

  static void ExpectFsynced(Filesystem& fs) { ExpectFsyncedIn(fs, expected_); }

  static inline std::string setup_error_, log_img_;
  static inline TempDir* tmp_ = nullptr;
  static inline Expected expected_;

  static void ReplayedByUbtrfs();
  static void ReplayedByTheKernel();
};
using TreeLog = TreeLogOn<true>;
using TreeLogHoleItems = TreeLogOn<false>;

TEST_F(TreeLog, UbtrfsReplaysItsOwnLog) { ReplayedByUbtrfs(); }
TEST_F(TreeLog, TheKernelReplaysIt) { ReplayedByTheKernel(); }
TEST_F(TreeLogHoleItems, UbtrfsReplaysItsOwnLog) { ReplayedByUbtrfs(); }
TEST_F(TreeLogHoleItems, TheKernelReplaysIt) { ReplayedByTheKernel(); }

template <bool kNoHoles>
void TreeLogOn<kNoHoles>::ReplayedByUbtrfs() {
  {
    const std::string img = CopyOf("ro.img");
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ExpectFsynced(**fs);
  }
  const std::string img = CopyOf("rw.img");
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ExpectFsynced(**fs);
  }
  EXPECT_EQ(SuperField(img, "log_root"), 0u);
  CommandResult check = RunCommand({"btrfs", "check", "--readonly", "--check-data-csum", img});
  EXPECT_TRUE(check.ok()) << check.Describe();
  CommandResult ours = RunUbtrfs({"check", img});
  EXPECT_TRUE(ours.ok()) << ours.Describe();
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  ExpectFsynced(**fs);
}

template <bool kNoHoles>
void TreeLogOn<kNoHoles>::ReplayedByTheKernel() {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string img = CopyOf("kernel.img"), mnt = tmp_->Sub("kernel.mnt");
  mkdir(mnt.c_str(), 0755);
  {
    LoopMount m;  // the kernel replays the log at this mount
    std::string e = m.Mount(img, mnt, "noatime");
    ASSERT_TRUE(e.empty()) << e;
    for (const auto& [path, bytes] : expected_.files) EXPECT_EQ(ReadHostFile(mnt + path), bytes) << path;
    for (const auto& [path, n] : expected_.nlink) {
      struct stat st;
      ASSERT_EQ(stat((mnt + path).c_str(), &st), 0) << path;
      EXPECT_EQ(st.st_nlink, n) << path;
    }
    for (const auto& path : expected_.gone) EXPECT_NE(access((mnt + path).c_str(), F_OK), 0) << path;
    e = m.Unmount();
    ASSERT_TRUE(e.empty()) << e;
  }
  EXPECT_EQ(SuperField(img, "log_root"), 0u);
  CommandResult check = RunCommand({"btrfs", "check", "--readonly", "--check-data-csum", img});
  EXPECT_TRUE(check.ok()) << check.Describe();
  // The kernel's replay and ubtrfs's give the same tree.
  const std::string ours_img = CopyOf("ours.img");
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = Filesystem::Open(ours_img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  }
  auto fs = Filesystem::Open(ours_img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  LoopMount m;
  std::string e = m.Mount(img, mnt, "ro");
  ASSERT_TRUE(e.empty()) << e;
  auto mismatches = CompareTreeToImage(mnt, **fs, KernelMountCompareOptions());
  EXPECT_TRUE(mismatches.empty()) << "the kernel's replay vs ubtrfs's: " << FormatMismatches(mismatches);
}

// An fsync writes the changed part of the log and one superblock; a commit
// rewrites every changed tree. 50 appends of 4 KiB, each fsynced: a few
// blocks per fsync.
TEST_F(TreeLog, AnFsyncWritesFewBlocks) {
  const std::string img = tmp_->Sub("few.img");
  ASSERT_EQ(RunMkfs(img, "", 0, "", 256ull << 20), "");
  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = Filesystem::Open(img, o);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  Ops op(**fs);
  op.Write("/f", "");
  op.Commit();
  ubtrfs::ResetStats();
  std::string want;
  for (int i = 0; i < 50; ++i) {
    const std::string more = SeededBytes(4096, 100 + i);
    op.Write("/f", more, -1);
    op.Fsync("/f");
    want += more;
  }
  ASSERT_TRUE(op.err.empty()) << op.err;
  const auto st = ubtrfs::CollectStats();
  const uint64_t logged = st.Counter("fsync.logged"), committed = st.Counter("fsync.committed");
  const uint64_t blocks = st.Counter("fsync.log_blocks_written");
  EXPECT_EQ(logged, 50u);
  EXPECT_EQ(committed, 0u);
  EXPECT_GT(blocks, 0u);
  EXPECT_LE(blocks, 50u * 4) << "more than 4 blocks per fsync";
  // A copy now (the power cut) holds every append.
  const std::string copy = tmp_->Sub("few-copy.img");
  std::filesystem::copy_file(img, copy);
  fs->reset();
  auto back = Filesystem::Open(copy);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ReadImageFile(**back, "/f"), want);
}

// Mixed block groups and compression, found by killing the mount under
// fsync-heavy load: files overwritten in the middle of compressed extents
// hold two items naming one extent each. The kernel's replay on a mixed
// filesystem takes every logged extent out of the free space cache once per
// item, and the second time fails (EINVAL) where the space is kept as a
// bitmap: the mount was refused. Such an fsync commits instead now.
TEST(TreeLogMixedGroups, TheKernelReplaysAfterOverwritesOfCompressedExtents) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-log-mixed");
  const std::string img = tmp.Sub("img"), cut = tmp.Sub("cut.img");
  CommandResult mk = RunUbtrfs({"mkfs", "-M", "--size", "1G", img});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  ubtrfs::OpenOptions o;
  o.writable = true;
  o.compress.force = true;
  ASSERT_TRUE(ubtrfs::ParseCompressSpec("lzo", &o.compress).ok());
  auto fs = Filesystem::Open(img, o);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  PutFile(**fs, "/", "committed", "before the log");
  ASSERT_TRUE((*fs)->Commit().ok());
  std::map<std::string, std::string> want;
  uint64_t rng = 5;
  auto next = [&rng](uint64_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (rng >> 33) % n;
  };
  for (int i = 0; i < 40; ++i) {
    const std::string name = "f" + std::to_string(i);
    auto id = (*fs)->Create((*fs)->Root(), name, ubtrfs::NewInode{.mode = 0100644});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    std::string& content = want[name];
    for (int j = 0; j < 20; ++j) {
      const uint64_t off = next(2u << 20), n = 1 + next(300000);
      std::string chunk;
      const std::string word = "abc" + std::to_string(next(100));
      while (chunk.size() < n) chunk += word;
      chunk.resize(n);
      ASSERT_TRUE((*fs)->Write(*id, off, SpanOf(chunk)).ok());
      if (content.size() < off + n) content.resize(off + n, '\0');
      content.replace(off, n, chunk);
    }
    ASSERT_TRUE((*fs)->Fsync(*id, false).ok());
  }
  std::filesystem::copy_file(img, cut);  // the power cut: after the fsyncs, before a commit
  fs->reset();
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel's replay: " << why;
  const std::string mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  LoopMount m;
  ASSERT_EQ(m.Mount(cut, mnt), "") << "the kernel does not replay the log";
  for (const auto& [name, content] : want) EXPECT_TRUE(ReadHostFile(mnt + "/" + name) == content) << name;
  EXPECT_EQ(m.Unmount(), "");
  EXPECT_EQ(BtrfsCheck(cut), "");
}

}  // namespace
}  // namespace ubtrfs_test
