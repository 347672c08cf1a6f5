// ubtrfs send to the kernel: chains of read-only snapshots made by the kernel
// (on a loop mount) and by ubtrfs's own CreateSnapshot, changed between
// snapshots by renames (directory moves, swaps of two names, a directory
// and its child trading places), hard links, xattrs, holes, reflinks,
// truncates, deletions, chmod/chown/utimes. `ubtrfs send` makes a full
// stream of the first and `-p` streams of each next one; the kernel's `btrfs
// receive` must accept each (and `btrfs receive --dump` parse it) with a
// tree equal to the source snapshot, and `ubtrfs receive` of the same chain
// must give the same; both images check clean. Then: an incremental stream
// of a snapshot with few changes is small and its tree comparison skips the
// shared subtrees.
//
// The chains need root and working loop mounts; skipped otherwise.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "fs/fs_impl.h"
#include "send/tree_diff.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/send.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

using ubtrfs::InodeId;
using ubtrfs::Status;

std::string Ubtrfs() { return UBTRFS_CLI_PATH; }

CompareOptions Opts() {
  CompareOptions o;
  o.source_only_xattrs.clear();
  return o;
}

size_t Count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// What the chain checks saw, for assertions on the streams themselves.
struct ChainStats {
  size_t renames = 0, links = 0, unlinks = 0, rmdirs = 0, clones = 0, encoded = 0;
};

// Sends snap1..snapN of `src` with ubtrfs (snap1 full, then -p of the one
// before), receives each with the kernel's btrfs receive (a loop mount of a
// fresh mkfs.btrfs image) and with ubtrfs receive (a fresh ubtrfs image),
// and compares both to the source snapshot as ubtrfs reads it. At the end a
// full stream of the last snapshot with -c of the one before goes to both
// too (clones from a clone source, in another directory).
void SendChain(const std::string& src, int n, const std::vector<std::string>& extra, ChainStats* stats) {
  TempDir tmp{"send-chain"};
  const std::string kimg = tmp.Sub("k.img"), kmnt = tmp.Sub("kmnt"), uimg = tmp.Sub("u.img");
  ASSERT_EQ(mkdir(kmnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(kimg, "", 16384, "crc32c", 512ull << 20), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "mkfs", "--size", "512M", uimg}), "");
  LoopMount km;
  ASSERT_EQ(km.Mount(kimg, kmnt), "");
  const auto check = [&](const std::string& snap, const std::string& where) {
    auto fs = ubtrfs::Filesystem::Open(src);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto mism = CompareTreeToImage(kmnt + "/" + where, **fs, Opts(), "/" + snap);
    EXPECT_TRUE(mism.empty()) << snap << " as the kernel received it: " << FormatMismatches(mism);
    auto ufs = ubtrfs::Filesystem::Open(uimg);
    ASSERT_TRUE(ufs.ok()) << ufs.status().ToString();
    mism = CompareTreeToImage(kmnt + "/" + where, **ufs, Opts(), "/" + where);
    EXPECT_TRUE(mism.empty()) << snap << " as ubtrfs received it: " << FormatMismatches(mism);
  };
  const auto send_and_receive = [&](const std::vector<std::string>& args, const std::string& snap,
                                    const std::string& where, const std::string& dir) {
    const std::string f = tmp.Sub(where.empty() ? snap : where + "-" + snap) + ".stream";
    std::vector<std::string> argv = {Ubtrfs(), "send", "-f", f};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(src + ":/" + snap);
    CommandResult r = RunCommand(argv);
    ASSERT_TRUE(r.ok()) << ShellJoin(argv) << ": " << r.Describe();
    CommandResult dump = RunCommand({"btrfs", "receive", "--dump", "-f", f});
    ASSERT_TRUE(dump.ok()) << f << ": " << dump.Describe();
    stats->renames += Count(dump.out, "\nrename ");
    stats->links += Count(dump.out, "\nlink ");
    stats->unlinks += Count(dump.out, "\nunlink ");
    stats->rmdirs += Count(dump.out, "\nrmdir ");
    stats->clones += Count(dump.out, "\nclone ");
    stats->encoded += Count(dump.out, "\nencoded_write ");
    CommandResult k = RunCommand({"btrfs", "-q", "receive", "-f", f, kmnt + dir});
    ASSERT_TRUE(k.ok()) << "btrfs receive of " << ShellJoin(argv) << ": " << k.Describe() << "\n" << dump.out;
    CommandResult u = RunCommand({Ubtrfs(), "receive", "-f", f, uimg + ":" + (dir.empty() ? "/" : dir)});
    ASSERT_TRUE(u.ok()) << "ubtrfs receive of " << f << ": " << u.Describe();
    check(snap, (dir.empty() ? "" : dir.substr(1) + "/") + snap);
  };
  for (int i = 1; i <= n; ++i) {
    const std::string snap = "snap" + std::to_string(i);
    std::vector<std::string> args;
    if (i > 1) args = {"-p", "/snap" + std::to_string(i - 1)};
    send_and_receive(args, snap, "", "");
    if (testing::Test::HasFatalFailure()) return;
  }
  // A full stream with a clone source, into another directory.
  ASSERT_EQ(mkdir((kmnt + "/alt").c_str(), 0755), 0);
  ASSERT_EQ(MustRun({Ubtrfs(), "mkdir", uimg + ":/alt"}), "");
  send_and_receive({"-c", "/snap" + std::to_string(n - 1)}, "snap" + std::to_string(n), "alt", "/alt");
  ASSERT_EQ(km.Unmount(), "");
  EXPECT_EQ(BtrfsCheck(kimg), "");
  EXPECT_EQ(BtrfsCheck(uimg), "");
}

// ---- A chain the kernel made ----

// Shell steps run in the subvolume between snapshots.
const std::vector<std::string> kKernelSteps = {
    // State 1.
    "mkdir -p a/b c d1 d2 outer/inner empty\n"
    "echo small > small\nhead -c 300000 /dev/urandom > a/random\n"
    "seq 1 20000 > a/b/text\nhead -c 200000 /dev/urandom > tochange\n"
    "echo x > x\necho y > y\necho d1 > d1/f\necho d2 > d2/f\necho in > outer/inner/g\n"
    "dd if=/dev/urandom of=holes bs=4096 count=2 status=none\n"
    "dd if=/dev/urandom of=holes bs=4096 seek=300 count=3 status=none conv=notrunc\ntruncate -s 3M holes\n"
    "cp --reflink=always a/random reflinked\n"
    "ln small a/hardlink\nln small a/b/hardlink2\nln -s ../small a/symlink\nln -s /nonexistent dangling\n"
    "mkfifo fifo\nmknod chardev c 1 3\n"
    "setfattr -n user.one -v value1 small\nsetfattr -n user.dir -v dirvalue a\n"
    "chown 1000:1001 a/random\nchown -h 7:8 a/symlink\nchmod 4755 x\nchmod 1777 empty\n"
    "touch -d '2001-02-03 04:05:06.789' y\n",
    // 1 -> 2: renames, swaps of two files and of two directories, a directory
    // and its child trading places, a move between directories, appends.
    "mv x x2\nmv y tmp && mv tochange y && mv tmp tochange\n"
    "mv d1 dtmp && mv d2 d1 && mv dtmp d2\n"
    "mv outer/inner inner_top && mv outer inner_top/outer_now_inside\n"
    "mv a/random c/random_moved\necho more >> small\n"
    "dd if=/dev/urandom of=tochange bs=1000 count=10 seek=50 conv=notrunc status=none\n"
    "setfattr -n user.two -v value2 small\n",
    // 2 -> 3: unlinks, a hard link dropped and one added, a truncate, a hole
    // punched, xattr removed, chmod, chown, utimes.
    "rm a/hardlink\nln c/random_moved a/random_link\ntruncate -s 1000 y\n"
    "fallocate -p -o 0 -l 8192 holes\nrm dangling\nsetfattr -x user.one small\nchmod 0600 small\n"
    "chown 5:6 tochange\ntouch -d '1999-12-31 23:59:59.5' c\n",
    // 3 -> 4: a tree moved under a new one, new files, a new reflink of an
    // unchanged file, a device.
    "mkdir -p new/deep/er\nmv a new/deep/er/a_moved\n"
    "for i in $(seq 1 50); do echo file $i > new/f$i; done\n"
    "cp --reflink=always reflinked new/reflinked_again\nmknod blockdev b 7 200\n",
    // 4 -> 5: rename over an existing file, a file replaced by a directory,
    // a file's only name moved into a new directory, a big xattr.
    "echo replacement > new/f2\nmv new/f2 new/f1\nrm new/f3\nmkdir new/f3\necho inside > new/f3/g\n"
    "mkdir z\nmv new/f4 z/f4\ntouch -d '1999-12-31 23:59:59' z/f4\n"
    "setfattr -n user.big -v \"$(head -c 3000 /dev/zero | tr '\\0' z)\" new/f5\n",
    // 5 -> 6: lots gone, some back under old names, data changed in the middle.
    "rm -r new/deep\necho back > x\nln -s new/f1 new/link_to_f1\n"
    "dd if=/dev/urandom of=new/f6 bs=65536 count=3 status=none\n"
    "dd if=/dev/urandom of=holes bs=4096 seek=100 count=1 conv=notrunc status=none\n"
    "mv d1 d1_renamed && mv inner_top/outer_now_inside outer_again\n",
};

struct KernelChain {
  std::string why_not;
  TempDir tmp{"send-kchain"};
  std::string img = tmp.Sub("src.img"), mnt = tmp.Sub("mnt");

  std::string Build() {
    if (mkdir(mnt.c_str(), 0755) != 0) return "mkdir " + mnt;
    if (std::string e = RunMkfs(img, "", 16384, "crc32c", 512ull << 20); !e.empty()) return e;
    LoopMount m;
    if (std::string e = m.Mount(img, mnt, "compress=zstd"); !e.empty()) return e;
    const std::string sv = mnt + "/sv";
    if (std::string e = MustRun({"btrfs", "subvolume", "create", sv}); !e.empty()) return e;
    for (size_t i = 0; i < kKernelSteps.size(); ++i) {
      if (std::string e = MustRun({"sh", "-ec", "cd " + sv + "\n" + kKernelSteps[i]}); !e.empty()) return e;
      if (std::string e = MustRun({"sync"}); !e.empty()) return e;
      const std::string snap = mnt + "/snap" + std::to_string(i + 1);
      if (std::string e = MustRun({"btrfs", "subvolume", "snapshot", "-r", sv, snap}); !e.empty()) return e;
    }
    return m.Unmount();
  }
};

KernelChain* g_chain = nullptr;

class SendKernelChain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_chain = new KernelChain;
    std::string why;
    if (!LoopMountsAvailable(&why)) {
      g_chain->why_not = "loop mounts unavailable: " + why;
    } else if (std::string e = MkfsMissingReason(); !e.empty()) {
      g_chain->why_not = e;
    } else if (std::string e = g_chain->Build(); !e.empty()) {
      g_chain->why_not = "building the kernel's chain failed: " + e;
    }
  }
  static void TearDownTestSuite() {
    delete g_chain;
    g_chain = nullptr;
  }
  void SetUp() override {
    if (!g_chain->why_not.empty()) GTEST_SKIP() << g_chain->why_not;
  }
};

TEST_F(SendKernelChain, Protocol1IsAcceptedByKernelReceive) {
  ChainStats st;
  SendChain(g_chain->img, static_cast<int>(kKernelSteps.size()), {}, &st);
  // The streams did carry what the steps asked of them.
  EXPECT_GE(st.renames, 8u);
  EXPECT_GE(st.links, 3u);
  EXPECT_GE(st.unlinks, 4u);
  EXPECT_GE(st.rmdirs, 3u);
  EXPECT_GE(st.clones, 2u);  // the reflink of an unchanged file, and the -c stream's
  EXPECT_EQ(st.encoded, 0u);
}

TEST_F(SendKernelChain, Protocol2CompressedIsAcceptedByKernelReceive) {
  CommandResult help = RunCommand({"btrfs", "send", "--help"});
  if ((help.out + help.err).find("--compressed-data") == std::string::npos) {
    GTEST_SKIP() << "btrfs here has no protocol 2 (--compressed-data)";
  }
  ChainStats st;
  SendChain(g_chain->img, static_cast<int>(kKernelSteps.size()), {"--proto", "2", "--compressed-data"}, &st);
  EXPECT_GT(st.encoded, 0u);
}

// One stream of several snapshots, each the parent of the next (btrfs send
// -c snap1 snap2 snap3 snap4 makes snap3's parent snap2, which comes earlier
// in the same stream), received by ubtrfs: each is equal to its source; a
// copy of the stream cut inside snap4 leaves snap2 and snap3 received.
TEST_F(SendKernelChain, ParentsReceivedEarlierInTheSameStream) {
  TempDir tmp{"send-multi"};
  const std::string smnt = tmp.Sub("smnt"), multi = tmp.Sub("multi.stream"), first = tmp.Sub("snap1.stream");
  ASSERT_EQ(mkdir(smnt.c_str(), 0755), 0);
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(g_chain->img, smnt, "ro"), "");
    ASSERT_EQ(MustRun({"btrfs", "-q", "send", "-f", multi, "-c", smnt + "/snap1", smnt + "/snap2", smnt + "/snap3",
                       smnt + "/snap4"}),
              "");
    ASSERT_EQ(m.Unmount(), "");
  }
  CommandResult dump = RunUbtrfs({"receive", "--dump", "-f", multi});
  ASSERT_TRUE(dump.ok()) << dump.Describe();
  ASSERT_NE(dump.out.find("snapshot        ./snap3 "), std::string::npos);
  ASSERT_EQ(MustRun({Ubtrfs(), "send", "-f", first, g_chain->img + ":/snap1"}), "");
  // Our own streams, concatenated, make the same kind of stream.
  std::string ours;
  for (int i = 2; i <= 4; ++i) {
    const std::string f = tmp.Sub("u" + std::to_string(i));
    ASSERT_EQ(MustRun({Ubtrfs(), "send", "-f", f, "-p", "/snap" + std::to_string(i - 1),
                       g_chain->img + ":/snap" + std::to_string(i)}),
              "");
    ours += ReadHostFile(f);
  }
  WriteHostFile(tmp.Sub("ours.stream"), ours);
  for (const std::string& stream : {multi, tmp.Sub("ours.stream")}) {
    const std::string img = tmp.Sub("u.img");
    unlink(img.c_str());
    ASSERT_EQ(MustRun({Ubtrfs(), "mkfs", "--size", "512M", img}), "");
    ASSERT_EQ(MustRun({Ubtrfs(), "receive", "-f", first, img}), "");
    CommandResult r = RunUbtrfs({"receive", "-v", "-f", stream, img});
    ASSERT_TRUE(r.ok()) << stream << ": " << r.Describe();
    auto src = ubtrfs::Filesystem::Open(g_chain->img);
    auto dst = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(src.ok() && dst.ok());
    TempDir out{"send-multi-out"};
    for (int i = 2; i <= 4; ++i) {
      const std::string snap = "snap" + std::to_string(i);
      // Through a host copy of the source, compared with the received image.
      ASSERT_EQ(MustRun({Ubtrfs(), "cp", g_chain->img + ":/" + snap, out.Sub(snap)}), "");
      auto mism = CompareTreeToImage(out.Sub(snap), **dst, Opts(), "/" + snap);
      EXPECT_TRUE(mism.empty()) << stream << " " << snap << ": " << FormatMismatches(mism);
    }
    EXPECT_EQ(BtrfsCheck(img), "");
  }
  // Cut inside snap4: snap2 and snap3 stay (committed before snap3's
  // snapshot of snap2, and before snap4's of snap3), snap4 does not.
  const std::string img = tmp.Sub("cut.img");
  ASSERT_EQ(MustRun({Ubtrfs(), "mkfs", "--size", "512M", img}), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "receive", "-f", first, img}), "");
  const std::string whole = ReadHostFile(multi);
  const size_t at4 = whole.find("snap4");
  ASSERT_NE(at4, std::string::npos);
  WriteHostFile(tmp.Sub("cut.stream"), whole.substr(0, at4 + 200));
  CommandResult r = RunUbtrfs({"receive", "-f", tmp.Sub("cut.stream"), img});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  auto dst = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(dst.ok());
  EXPECT_TRUE((*dst)->Lookup("/snap3").ok());
  EXPECT_FALSE((*dst)->Lookup("/snap4").ok());
  auto ro = (*dst)->SubvolumeReadOnly(*(*dst)->Lookup("/snap3"));
  EXPECT_TRUE(ro.ok() && *ro);
  EXPECT_EQ(BtrfsCheck(img), "");
}

// ---- A chain ubtrfs made (CreateSnapshot) ----

#define UB_OK(expr)                                            \
  do {                                                         \
    const Status st_ = (expr);                                 \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_.ToString();  \
  } while (0)

struct Editor {
  ubtrfs::Filesystem& fs;
  InodeId At(const std::string& p) {
    auto r = fs.Lookup(p);
    EXPECT_TRUE(r.ok()) << p << ": " << r.status().ToString();
    return r.ok() ? *r : InodeId{};
  }
  std::pair<InodeId, std::string> Parent(const std::string& p) {
    const size_t slash = p.rfind('/');
    return {At(slash == 0 ? "/" : p.substr(0, slash)), p.substr(slash + 1)};
  }
  void File(const std::string& p, const std::string& data, uint64_t at = 0) {
    auto [dir, name] = Parent(p);
    auto id = fs.LookupChild(dir, name);
    if (!id.ok()) {
      ubtrfs::NewInode a;
      a.mode = 0644;
      id = fs.Create(dir, name, a);
    }
    ASSERT_TRUE(id.ok()) << p << ": " << id.status().ToString();
    auto n = fs.Write(*id, at, SpanOf(data));
    ASSERT_TRUE(n.ok() && *n == data.size()) << p;
  }
  void Dir(const std::string& p) {
    auto [dir, name] = Parent(p);
    ubtrfs::NewInode a;
    a.mode = 0755;
    ASSERT_TRUE(fs.Mkdir(dir, name, a).ok()) << p;
  }
  void Mv(const std::string& a, const std::string& b) {
    auto [da, na] = Parent(a);
    auto [db, nb] = Parent(b);
    UB_OK(fs.Rename(da, na, db, nb, 0));
  }
  void Swap(const std::string& a, const std::string& b) {
    auto [da, na] = Parent(a);
    auto [db, nb] = Parent(b);
    UB_OK(fs.Rename(da, na, db, nb, ubtrfs::kRenameExchange));
  }
  void Ln(const std::string& target, const std::string& p) {
    auto [dir, name] = Parent(p);
    UB_OK(fs.Link(At(target), dir, name));
  }
  void Rm(const std::string& p) {
    auto [dir, name] = Parent(p);
    UB_OK(fs.Unlink(dir, name));
  }
  void Rmdir(const std::string& p) {
    auto [dir, name] = Parent(p);
    UB_OK(fs.Rmdir(dir, name));
  }
  void Attr(const std::string& p, const ubtrfs::AttrChange& c) { UB_OK(fs.SetAttr(At(p), c)); }
};

std::string BuildUbtrfsChain(const std::string& img, int* snaps) {
  if (std::string e = MustRun({Ubtrfs(), "mkfs", "--size", "512M", "--nodesize", "4096", img}); !e.empty()) return e;
  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = ubtrfs::Filesystem::Open(img, o);
  if (!fs.ok()) return fs.status().ToString();
  ubtrfs::NewInode a;
  a.mode = 0755;
  auto sv = (*fs)->CreateSubvolume((*fs)->Root(), "sv", a);
  if (!sv.ok()) return sv.status().ToString();
  Editor e{**fs};
  int n = 0;
  const auto snap = [&]() -> std::string {
    ++n;
    auto s = (*fs)->CreateSnapshot(*sv, (*fs)->Root(), "snap" + std::to_string(n), true);
    if (!s.ok()) return s.status().ToString();
    Status c = (*fs)->Commit();
    return c.ok() ? "" : c.ToString();
  };
  const auto t = [](int64_t sec, uint32_t nsec) { return ubtrfs::Time{sec, nsec}; };
  // State 1: many files (a tree of several levels), links, xattrs, a hole.
  e.Dir("/sv/a");
  e.Dir("/sv/a/b");
  e.Dir("/sv/c");
  e.Dir("/sv/p");
  e.Dir("/sv/p/q");
  for (int i = 0; i < 400; ++i) e.File("/sv/a/f" + std::to_string(i), "file " + std::to_string(i) + "\n");
  e.File("/sv/big", SeededBytes(600000, 3));
  e.File("/sv/sparse", SeededBytes(8192, 4));
  e.File("/sv/sparse", SeededBytes(4096, 5), 1 << 20);
  e.File("/sv/x", "x\n");
  e.File("/sv/y", "y\n");
  e.File("/sv/p/q/deep", "deep\n");
  e.Ln("/sv/x", "/sv/a/b/x_link");
  if ((*fs)->SetXattr(e.At("/sv/x"), "user.k", "v1", 0).ok() == false) return "setxattr";
  if (::testing::Test::HasFailure()) return "state 1";
  if (std::string s = snap(); !s.empty()) return s;
  // 1 -> 2: swaps (files, directories), p/q trading places, a reflink, a chown.
  e.Swap("/sv/x", "/sv/y");
  e.Swap("/sv/a", "/sv/c");
  e.Mv("/sv/p/q", "/sv/q");
  e.Mv("/sv/p", "/sv/q/p");
  {
    ubtrfs::NewInode fa;
    fa.mode = 0640;
    auto r = (*fs)->Create(e.At("/sv"), "big_clone", fa);
    if (!r.ok()) return r.status().ToString();
    Status c = (*fs)->Clone(e.At("/sv/big"), 0, *r, 0, 0);
    if (!c.ok()) return c.ToString();
  }
  ubtrfs::AttrChange own;
  own.uid = 1234;
  own.gid = 99;
  e.Attr("/sv/c/f7", own);
  if (::testing::Test::HasFailure()) return "step 2";
  if (std::string s = snap(); !s.empty()) return s;
  // 2 -> 3: deletions, a truncate, data in the middle, a new hard link, a mode.
  for (int i = 0; i < 400; i += 7) e.Rm("/sv/c/f" + std::to_string(i));
  ubtrfs::AttrChange tr;
  tr.size = 100000;
  e.Attr("/sv/big", tr);
  e.File("/sv/big_clone", SeededBytes(5000, 9), 200000);
  e.Ln("/sv/big_clone", "/sv/a/big_clone_link");
  ubtrfs::AttrChange md;
  md.mode = 02750;
  e.Attr("/sv/q/p", md);
  if ((*fs)->RemoveXattr(e.At("/sv/y"), "user.k").ok() == false) return "removexattr";
  if (::testing::Test::HasFailure()) return "step 3";
  if (std::string s = snap(); !s.empty()) return s;
  // 3 -> 4: a tree moved under a new directory, a name swapped with a
  // directory, times.
  e.Dir("/sv/n");
  e.Dir("/sv/n/m");
  e.Mv("/sv/c", "/sv/n/m/c");
  e.Swap("/sv/y", "/sv/q");
  ubtrfs::AttrChange tm;
  tm.mtime = t(999999999, 123456789);
  tm.atime = t(1000, 0);
  e.Attr("/sv/n/m/c/f8", tm);
  e.File("/sv/sparse", SeededBytes(4096, 6), 4096 * 40);
  if (::testing::Test::HasFailure()) return "step 4";
  if (std::string s = snap(); !s.empty()) return s;
  // 4 -> 5: a directory removed with its files, a file renamed over another,
  // the old hard link's last name moved.
  e.Mv("/sv/n/m/c/b/x_link", "/sv/n/x_link_moved");
  e.Rmdir("/sv/n/m/c/b");
  for (int i = 0; i < 400; ++i) {
    if (i % 7 != 0) e.Rm("/sv/n/m/c/f" + std::to_string(i));
  }
  e.Rmdir("/sv/n/m/c");
  e.Mv("/sv/a/big_clone_link", "/sv/x");
  tm.mtime = t(1234567890, 5);
  e.Attr("/sv/n", tm);
  if (::testing::Test::HasFailure()) return "step 5";
  if (std::string s = snap(); !s.empty()) return s;
  // 5 -> 6: a new file under an old name, a truncate up (a hole), xattrs.
  e.File("/sv/a/f1", "back again\n");
  tr.size = 3 << 20;
  e.Attr("/sv/sparse", tr);
  if ((*fs)->SetXattr(e.At("/sv/n"), "user.dir", std::string(2000, 'd'), 0).ok() == false) return "setxattr 2";
  if (::testing::Test::HasFailure()) return "step 6";
  if (std::string s = snap(); !s.empty()) return s;
  *snaps = n;
  return "";
}

TEST(SendUbtrfsChain, SnapshotsMadeByUbtrfsAreAcceptedByKernelReceive) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  if (std::string e = MkfsMissingReason(); !e.empty()) GTEST_SKIP() << e;
  TempDir tmp{"send-uchain"};
  const std::string img = tmp.Sub("src.img");
  int n = 0;
  ASSERT_EQ(BuildUbtrfsChain(img, &n), "");
  ASSERT_EQ(n, 6);
  ASSERT_EQ(BtrfsCheck(img), "");
  ChainStats st;
  SendChain(img, n, {}, &st);
  EXPECT_GE(st.renames, 8u);
  EXPECT_GE(st.clones, 1u);
  EXPECT_GE(st.rmdirs, 1u);
}

// A directory's inode number reused: the kernel numbers a new inode after
// the highest in the subvolume when it loads it (at mount), so a directory
// deleted as the highest, then a remount, gives the next directory its
// number. Names moved into the new directory then have INODE_REFs byte for
// byte those they had in the old one, and must still count as moved (the
// old directory is removed, so they must leave it): once under the same
// name (the snapshot's X is another X), once under another.
TEST(SendKernelInodeReuse, NamesInADirectoryWhoseNumberWentToANewOne) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  if (std::string e = MkfsMissingReason(); !e.empty()) GTEST_SKIP() << e;
  TempDir tmp{"send-reuse"};
  const std::string img = tmp.Sub("src.img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 16384, "crc32c", 256ull << 20), "");
  // Each step is (before the remount, after it); ../ino (outside the
  // subvolume) keeps the number of the directory that goes.
  const std::vector<std::pair<std::string, std::string>> steps = {
      {"mkdir d\necho g > d/g\necho data > f\nmkdir X\nmv f X/a\nmv d X/sub\nstat -c %i X > ../ino\n", ""},
      {"mv X/a a\nmv X/sub sub\nrmdir X\n",
       "mkdir X\ntest $(stat -c %i X) = $(cat ../ino)\nmv a X/a\nmv sub X/sub\necho more >> X/a\n"},
      {"mv X/a a\nmv X/sub sub\nrmdir X\n",
       "mkdir Y\ntest $(stat -c %i Y) = $(cat ../ino)\nmv a Y/a\nmv sub Y/sub2\n"},
  };
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "create", mnt + "/sv"}), "");
    ASSERT_EQ(m.Unmount(), "");
    for (size_t i = 0; i < steps.size(); ++i) {
      for (int half = 0; half < 2; ++half) {
        ASSERT_EQ(m.Mount(img, mnt), "");
        const std::string& sh = half == 0 ? steps[i].first : steps[i].second;
        ASSERT_EQ(MustRun({"sh", "-ec", "cd " + mnt + "/sv\n" + sh}), "") << "step " << i + 1;
        if (half == 1) {
          ASSERT_EQ(MustRun({"btrfs", "subvolume", "snapshot", "-r", mnt + "/sv", mnt + "/snap" + std::to_string(i + 1)}), "");
        }
        ASSERT_EQ(m.Unmount(), "");
      }
    }
  }
  ChainStats st;
  SendChain(img, static_cast<int>(steps.size()), {}, &st);
  EXPECT_GE(st.rmdirs, 2u);
}

// ---- Small changes make small streams, and shared subtrees are skipped ----

TEST(SendIncremental, FewChangesGiveASmallStreamAndReadFewBlocks) {
  TempDir tmp{"send-small"};
  const std::string img = tmp.Sub("src.img"), dst = tmp.Sub("dst.img");
  ASSERT_EQ(MustRun({Ubtrfs(), "mkfs", "--size", "256M", "--nodesize", "4096", img}), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "mkfs", "--size", "256M", dst}), "");
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok());
    ubtrfs::NewInode a;
    a.mode = 0755;
    auto sv = (*fs)->CreateSubvolume((*fs)->Root(), "sv", a);
    ASSERT_TRUE(sv.ok());
    Editor e{**fs};
    for (int d = 0; d < 20; ++d) {
      e.Dir("/sv/d" + std::to_string(d));
      for (int i = 0; i < 400; ++i) {
        e.File("/sv/d" + std::to_string(d) + "/f" + std::to_string(i), SeededBytes(3000, d * 1000 + i));
      }
    }
    ASSERT_TRUE((*fs)->CreateSnapshot(*sv, (*fs)->Root(), "s1", true).ok());
    ASSERT_TRUE((*fs)->Commit().ok());
    e.File("/sv/d3/f17", "changed\n");
    e.Mv("/sv/d5/f100", "/sv/d6/moved");
    e.File("/sv/d9/new", "new file\n");
    ASSERT_TRUE((*fs)->CreateSnapshot(*sv, (*fs)->Root(), "s2", true).ok());
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  auto fs = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  auto s1 = (*fs)->Lookup("/s1");
  auto s2 = (*fs)->Lookup("/s2");
  ASSERT_TRUE(s1.ok() && s2.ok());
  std::string full, incr, full_cmp;
  const auto into = [](std::string* s) {
    return [s](std::span<const uint8_t> b) {
      s->append(reinterpret_cast<const char*>(b.data()), b.size());
      return Status::Ok();
    };
  };
  ubtrfs::SendResult rf, ri, rc;
  UB_OK(ubtrfs::Send(**fs, *s2, into(&full), {}, &rf));
  ubtrfs::SendOptions io;
  io.parent = *s1;
  UB_OK(ubtrfs::Send(**fs, *s2, into(&incr), io, &ri));
  // The same full stream made by the tree comparison (against nothing, with
  // a clone source): it reads every block of the snapshot's tree.
  ubtrfs::SendOptions co;
  co.clone_sources = {*s1};
  UB_OK(ubtrfs::Send(**fs, *s2, into(&full_cmp), co, &rc));
  EXPECT_GT(full.size(), 8000u * 3000u);
  EXPECT_LT(incr.size() * 200, full.size()) << incr.size() << " vs " << full.size();
  // f17; f100 and its two directories; the new file and its directory.
  EXPECT_EQ(ri.changed_inodes, 6u);
  EXPECT_GT(rc.blocks_read, 800u);
  EXPECT_GT(ri.shared_subtrees_skipped, 0u);
  EXPECT_LT(ri.blocks_read * 15, rc.blocks_read) << ri.blocks_read << " of " << rc.blocks_read;
  // Every file of the clone-source stream but the new one and the changed
  // one (written over its shared extent) is a clone of s1's copy.
  EXPECT_EQ(rc.clones, 8000u - 1u);
  // And both apply: the full stream of s1, then the incremental one of s2.
  std::string s1_full;
  UB_OK(ubtrfs::Send(**fs, *s1, into(&s1_full)));
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto d = ubtrfs::Filesystem::Open(dst, o);
    ASSERT_TRUE(d.ok());
    for (const std::string* s : {&s1_full, &incr}) {
      auto pos = std::make_shared<size_t>(0);
      UB_OK(ubtrfs::Receive(**d, [s, pos](std::span<uint8_t> buf) -> ubtrfs::Result<size_t> {
        const size_t k = std::min(buf.size(), s->size() - *pos);
        std::memcpy(buf.data(), s->data() + *pos, k);
        *pos += k;
        return k;
      }));
    }
  }
  auto d = ubtrfs::Filesystem::Open(dst);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(ReadImageFile(**d, "/s2/d3/f17"), "changed\n" + SeededBytes(3000, 3017).substr(8));
  EXPECT_EQ(ReadImageFile(**d, "/s2/d6/moved"), SeededBytes(3000, 5100));
  EXPECT_EQ(ReadImageFile(**d, "/s2/d9/new"), "new file\n");
  EXPECT_FALSE((*d)->Lookup("/s2/d5/f100").ok());
  EXPECT_EQ(ReadImageFile(**d, "/s2/d0/f0"), SeededBytes(3000, 0));
  if (MkfsMissingReason().empty()) {
    EXPECT_EQ(BtrfsCheck(dst), "");  // btrfs-progs is there to ask
  }
}

// A hostile image: items of the snapshot's own leaves (names, inode items,
// file extent items, xattrs, dir entries) with bytes changed and the block
// checksum made right again, so that only the send's own checks stand
// between the damage and the stream. Each send must end with a stream or a
// clear error; none may crash (the ASan build runs this too).
TEST(SendIncremental, DamagedSnapshotItemsGiveErrorsNotCrashes) {
  TempDir tmp{"send-hostile"};
  const std::string img = tmp.Sub("src.img");
  ASSERT_EQ(MustRun({Ubtrfs(), "mkfs", "--size", "128M", "--nodesize", "4096", img}), "");
  uint64_t owner = 0;  // of the leaves s2 shares with sv, changed since s1 or not
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok());
    ubtrfs::NewInode a;
    a.mode = 0755;
    auto sv = (*fs)->CreateSubvolume((*fs)->Root(), "sv", a);
    ASSERT_TRUE(sv.ok());
    Editor e{**fs};
    e.Dir("/sv/d");
    e.Dir("/sv/d/e");
    for (int i = 0; i < 120; ++i) e.File("/sv/d/f" + std::to_string(i), SeededBytes(100 + 50 * i, i));
    ASSERT_TRUE((*fs)->CreateSnapshot(*sv, (*fs)->Root(), "s1", true).ok());
    for (int i = 0; i < 120; i += 3) e.Mv("/sv/d/f" + std::to_string(i), "/sv/d/e/g" + std::to_string(i));
    for (int i = 1; i < 120; i += 5) e.File("/sv/d/f" + std::to_string(i), "rewritten", 7);
    e.Ln("/sv/d/f2", "/sv/link");
    e.Mv("/sv/d/e", "/sv/e_moved");
    ASSERT_TRUE((*fs)->SetXattr(e.At("/sv/d/f4"), "user.x", "y", 0).ok());
    auto s2 = (*fs)->CreateSnapshot(*sv, (*fs)->Root(), "s2", true);
    ASSERT_TRUE(s2.ok());
    owner = sv->root;
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  // The subvolume's leaves (every copy), which s2 shares: physical offsets by logical address.
  namespace f = ubtrfs::format;
  const uint32_t nodesize = 4096;
  const int fd = ::open(img.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const auto pread_block = [&](uint64_t off, size_t n) {
    std::vector<uint8_t> b(n);
    EXPECT_EQ(::pread(fd, b.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n));
    return b;
  };
  const auto pwrite_block = [&](uint64_t off, const std::vector<uint8_t>& b) {
    EXPECT_EQ(::pwrite(fd, b.data(), b.size(), static_cast<off_t>(off)), static_cast<ssize_t>(b.size()));
  };
  const auto sb = pread_block(f::kSuperInfoOffset, sizeof(f::SuperBlock));
  const uint16_t csum_type = reinterpret_cast<const f::SuperBlock*>(sb.data())->csum_type.get();
  const auto csum_ok = [&](const std::vector<uint8_t>& b) {
    auto c = f::ComputeCsum(csum_type, std::span<const uint8_t>(b).subspan(f::kCsumSize));
    return std::memcmp(c.data(), b.data(), f::kCsumSize) == 0;
  };
  std::map<uint64_t, std::vector<uint64_t>> leaves;
  for (uint64_t off = 0; off + nodesize <= (128ull << 20); off += nodesize) {
    auto b = pread_block(off, nodesize);
    const auto* h = reinterpret_cast<const f::Header*>(b.data());
    if (h->owner.get() == owner && h->level == 0 && h->nritems.get() > 0 && csum_ok(b)) {
      leaves[h->bytenr.get()].push_back(off);
    }
  }
  ASSERT_FALSE(leaves.empty());
  std::mt19937_64 rng(2217);
  int ok = 0, refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    auto it = leaves.begin();
    std::advance(it, static_cast<long>(rng() % leaves.size()));
    const std::vector<uint8_t> orig = pread_block(it->second.front(), nodesize);
    std::vector<uint8_t> b = orig;
    const auto* h = reinterpret_cast<const f::Header*>(b.data());
    const auto* items = reinterpret_cast<const f::Item*>(b.data() + sizeof(f::Header));
    const uint32_t n = h->nritems.get();
    const f::Item& item = items[rng() % n];
    const uint32_t size = item.size.get(), at = item.offset.get();
    if (size == 0) continue;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
      b[sizeof(f::Header) + at + rng() % size] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    auto c = f::ComputeCsum(csum_type, std::span<const uint8_t>(b).subspan(f::kCsumSize));
    std::memcpy(b.data(), c.data(), f::kCsumSize);
    for (uint64_t off : it->second) pwrite_block(off, b);
    {
      auto fs = ubtrfs::Filesystem::Open(img);
      ASSERT_TRUE(fs.ok()) << fs.status().ToString();
      auto s1 = (*fs)->Lookup("/s1");
      auto s2 = (*fs)->Lookup("/s2");
      if (s1.ok() && s2.ok()) {
        ubtrfs::SendOptions io;
        io.parent = *s1;
        io.proto = 2;
        uint64_t bytes = 0;
        Status st = ubtrfs::Send(**fs, *s2, [&](std::span<const uint8_t> d) {
          bytes += d.size();
          return Status::Ok();
        }, io);
        if (st.ok()) {
          ++ok;
          EXPECT_GT(bytes, 0u);
        } else {
          ++refused;
          EXPECT_FALSE(st.message().empty());
        }
      } else {
        ++refused;
      }
    }
    for (uint64_t off : it->second) pwrite_block(off, orig);
  }
  ::close(fd);
  // Some damage is harmless to a send (a changed name, size or time), some
  // is refused; both kinds happened.
  EXPECT_GT(ok, 10);
  EXPECT_GT(refused, 10);
}

// The tree comparison against the plain answer: every pair of snapshots of
// a chain (ubtrfs-made, 4 KiB nodes, trees of several levels) compared by
// CompareTrees must give exactly the differences that walking both trees
// item by item gives, in key order, while reading fewer blocks than the two
// trees have where they share some.
TEST(SendIncremental, TreeComparisonEqualsAFullWalk) {
  TempDir tmp{"send-diff"};
  const std::string img = tmp.Sub("src.img");
  int n = 0;
  ASSERT_EQ(BuildUbtrfsChain(img, &n), "");
  auto fs = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  auto* impl = dynamic_cast<ubtrfs::fsimpl::FilesystemImpl*>(fs->get());
  ASSERT_NE(impl, nullptr);
  using ubtrfs::format::Key;
  struct Diff {
    ubtrfs::send::DiffKind kind;
    Key key;
    bool operator==(const Diff& o) const { return kind == o.kind && key == o.key; }
  };
  const auto walk = [&](const ubtrfs::tree::RootPtr& a, const ubtrfs::tree::RootPtr& b, uint64_t* blocks) {
    std::vector<Diff> out;
    ubtrfs::tree::Cursor ca(impl->SendBlockSource(), a), cb(impl->SendBlockSource(), b);
    EXPECT_TRUE(ca.SeekFirst().ok());
    EXPECT_TRUE(cb.SeekFirst().ok());
    std::set<uint64_t> leaves;
    while (ca.Valid() || cb.Valid()) {
      if (ca.Valid()) leaves.insert(ca.leaf().bytenr());
      if (cb.Valid()) leaves.insert(cb.leaf().bytenr());
      if (!cb.Valid() || (ca.Valid() && ca.key() < cb.key())) {
        out.push_back({ubtrfs::send::DiffKind::kDeleted, ca.key()});
        EXPECT_TRUE(ca.Next().ok());
      } else if (!ca.Valid() || cb.key() < ca.key()) {
        out.push_back({ubtrfs::send::DiffKind::kNew, cb.key()});
        EXPECT_TRUE(cb.Next().ok());
      } else {
        const auto x = ca.data(), y = cb.data();
        if (x.size() != y.size() || !std::equal(x.begin(), x.end(), y.begin())) {
          out.push_back({ubtrfs::send::DiffKind::kChanged, ca.key()});
        }
        EXPECT_TRUE(ca.Next().ok());
        EXPECT_TRUE(cb.Next().ok());
      }
    }
    *blocks = leaves.size();
    return out;
  };
  int pairs = 0;
  for (int i = 1; i <= n; ++i) {
    for (int j = 1; j <= n; ++j) {
      auto a = (*fs)->Lookup("/snap" + std::to_string(i));
      auto b = (*fs)->Lookup("/snap" + std::to_string(j));
      ASSERT_TRUE(a.ok() && b.ok());
      auto ra = impl->SendTreeRoot(a->root);
      auto rb = impl->SendTreeRoot(b->root);
      ASSERT_TRUE(ra.ok() && rb.ok());
      std::vector<Diff> got;
      ubtrfs::send::DiffStats st;
      Status s = ubtrfs::send::CompareTrees(impl->SendBlockSource(), ra->ref, rb->ref,
                                            [&](ubtrfs::send::DiffKind k, const Key& key, std::span<const uint8_t>,
                                                std::span<const uint8_t>) {
                                              got.push_back({k, key});
                                              return Status::Ok();
                                            },
                                            &st);
      ASSERT_TRUE(s.ok()) << s.ToString();
      uint64_t leaves = 0;
      const std::vector<Diff> want = walk(ra->ref, rb->ref, &leaves);
      ASSERT_EQ(got.size(), want.size()) << "snap" << i << " -> snap" << j;
      EXPECT_TRUE(got == want) << "snap" << i << " -> snap" << j;
      if (i == j) {
        EXPECT_TRUE(got.empty());
      }
      // Steps 1 -> 2 and 3 -> 4 leave most files alone (the others touch
      // every leaf): fewer blocks read than the leaves alone of a full walk.
      if ((i == 1 || i == 3) && j == i + 1) {
        EXPECT_GT(st.shared_skipped, 0u) << i;
        EXPECT_LT(st.blocks_read, leaves) << i;
      }
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, 36);
}

TEST(SendIncremental, RefusesWhatBtrfsSendRefuses) {
  TempDir tmp{"send-refuse"};
  const std::string img = tmp.Sub("src.img");
  ASSERT_EQ(MustRun({Ubtrfs(), "mkfs", "--size", "128M", img}), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "subvolume", "create", img + ":/sv"}), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "subvolume", "snapshot", "-r", img + ":/sv", img + ":/s1"}), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "subvolume", "snapshot", img + ":/sv", img + ":/rw"}), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "mkdir", img + ":/sv/dir"}), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "subvolume", "snapshot", "-r", img + ":/sv", img + ":/s2"}), "");
  const std::string out = tmp.Sub("out");
  // A writable parent, a parent that is a directory, compressed data with protocol 1.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"-p", "/rw"}, {"-p", "/sv/dir"}, {"-p", "/s2"}, {"--proto", "1", "--compressed-data"}, {"-c", "/rw"}}) {
    std::vector<std::string> argv = {"send", "-f", out};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(img + ":/s2");
    CommandResult r = RunUbtrfs(argv);
    EXPECT_EQ(r.exit_code, 1) << ShellJoin(argv) << ": " << r.Describe();
    EXPECT_NE(r.err.find("send"), std::string::npos) << r.err;
  }
  CommandResult ok = RunUbtrfs({"send", "-v", "-f", out, "-p", "/s1", img + ":/s2"});
  EXPECT_TRUE(ok.ok()) << ok.Describe();
  EXPECT_NE(ok.err.find("tree comparison"), std::string::npos) << ok.err;
  CommandResult dump = RunUbtrfs({"receive", "--dump", "-f", out});
  ASSERT_TRUE(dump.ok()) << dump.Describe();
  EXPECT_EQ(dump.out.rfind("snapshot        ./s2", 0), 0u) << dump.out;
  EXPECT_NE(dump.out.find("mkdir           ./s2/dir"), std::string::npos) << dump.out;
}

}  // namespace
}  // namespace ubtrfs_test

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

// A subvolume nested in a snapshotted one: each snapshot holds an empty
// stand-in directory in its place (inode 2, the kernel's
// BTRFS_EMPTY_SUBVOL_DIR_OBJECTID). The kernel's send leaves it out (it
// has no inode reference to walk); so must ubtrfs's, full and incremental.
// `cp` out copies the stand-in of every snapshot, each an empty directory.
TEST(SendNestedSubvolume, ItsStandInIsNeitherSentNorTakenForALoop) {
  if (std::string e = MkfsMissingReason(); !e.empty()) GTEST_SKIP() << e;
  TempDir tmp{"send-nested"};
  const std::string img = tmp.Sub("n.img");
  ASSERT_EQ(RunMkfs(img, "", 16384, "crc32c", 256ull << 20), "");
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"subvolume", "create", img + ":/sv"},
           {"subvolume", "create", img + ":/sv/inner"},
           {"mkdir", img + ":/sv/dir"},
           {"subvolume", "snapshot", "-r", img + ":/sv", img + ":/snap1"},
           {"mkdir", img + ":/sv/dir2"},
           {"subvolume", "snapshot", "-r", img + ":/sv", img + ":/snap2"}}) {
    CommandResult r = RunUbtrfs(args);
    ASSERT_TRUE(r.ok()) << ShellJoin(args) << ": " << r.Describe();
  }
  // cp: both stand-ins, no "already copied" warning.
  const std::string out = tmp.Sub("out");
  CommandResult cp = RunUbtrfs({"cp", img + ":/", out});
  ASSERT_TRUE(cp.ok()) << cp.Describe();
  EXPECT_EQ(cp.err, "");
  for (const char* snap : {"snap1", "snap2"}) {
    struct stat st;
    const std::string d = out + "/" + snap + "/inner";
    ASSERT_EQ(::stat(d.c_str(), &st), 0) << d << " was not copied";
    EXPECT_TRUE(S_ISDIR(st.st_mode)) << d;
    EXPECT_TRUE(std::filesystem::is_empty(d)) << d;
  }
  // send: no path under the stand-in, full or incremental.
  const auto dump_of = [&](const std::vector<std::string>& args, const std::string& f) {
    std::vector<std::string> argv = {"send", "-f", f};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunUbtrfs(argv);
    EXPECT_TRUE(r.ok()) << r.Describe();
    CommandResult d = RunCommand({"btrfs", "receive", "--dump", "-f", f});
    EXPECT_TRUE(d.ok()) << d.Describe();
    return d.out;
  };
  const std::string full = dump_of({img + ":/snap1"}, tmp.Sub("full.stream"));
  EXPECT_NE(full.find("./snap1/dir"), std::string::npos) << full;
  EXPECT_EQ(full.find("inner"), std::string::npos) << full;
  const std::string incr = dump_of({"-p", "/snap1", img + ":/snap2"}, tmp.Sub("incr.stream"));
  EXPECT_NE(incr.find("dir2"), std::string::npos) << incr;
  EXPECT_EQ(incr.find("inner"), std::string::npos) << incr;

  std::string why;
  if (!LoopMountsAvailable(&why)) {
    std::fprintf(stderr, "[ skipped  ] the kernel's send: loop mounts unavailable: %s\n", why.c_str());
    return;
  }
  const std::string mnt = tmp.Sub("mnt");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  const std::string k = tmp.Sub("kernel.stream");
  CommandResult ks = RunCommand({"btrfs", "-q", "send", "-f", k, mnt + "/snap1"});
  ASSERT_TRUE(ks.ok()) << ks.Describe();
  CommandResult kd = RunCommand({"btrfs", "receive", "--dump", "-f", k});
  ASSERT_TRUE(kd.ok()) << kd.Describe();
  EXPECT_NE(kd.out.find("./snap1/dir"), std::string::npos) << kd.out;
  EXPECT_EQ(kd.out.find("inner"), std::string::npos) << "the kernel's stream: " << kd.out;
  std::error_code ec;
  EXPECT_TRUE(std::filesystem::is_directory(mnt + "/snap2/inner", ec)) << "the kernel shows the stand-in";
}

}  // namespace UBTRFS_UNITY_ID
}  // namespace ubtrfs_test
