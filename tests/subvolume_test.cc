// Subvolumes the kernel made, changed by ubtrfs: a read-only subvolume
// refuses every change with EROFS (library, CLI and FUSE mount) while the
// rest of the image stays writable; images the kernel balanced (tree blocks
// with full backrefs, shared data refs) become writable; --subvol/--subvolid
// choose where paths start.
//
// Needs root and working loop mounts for the kernel-made images; skipped
// otherwise.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
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

#define SKIP_IF_NO_LOOP()                                                                \
  do {                                                                                   \
    std::string why_;                                                                    \
    if (!LoopMountsAvailable(&why_)) GTEST_SKIP() << "loop mounts unavailable: " << why_; \
  } while (0)

// Runs a shell-free command and records failures.
void Must(const std::vector<std::string>& argv) {
  CommandResult r = RunCommand(argv);
  EXPECT_TRUE(r.ok()) << ShellJoin(argv) << ": " << r.Describe();
}

// An image the kernel wrote: /ro (a subvolume, then made read-only) with a
// file, a directory and an xattr; /rw (a writable subvolume) with a file; a
// file at the top.
struct RoImage {
  TempDir tmp{"ubtrfs-subvol"};
  std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");

  std::string Make() {
    if (mkdir(mnt.c_str(), 0755) != 0) return "mkdir " + mnt + ": " + strerror(errno);
    if (std::string e = RunMkfs(img, "", 16384, "crc32c", 512ull << 20); !e.empty()) return e;
    LoopMount m;
    if (std::string e = m.Mount(img, mnt); !e.empty()) return e;
    for (const char* sv : {"ro", "rw"}) {
      CommandResult r = RunCommand({"btrfs", "subvolume", "create", mnt + "/" + sv});
      if (!r.ok()) return r.Describe();
    }
    WriteHostFile(mnt + "/ro/f", std::string(10000, 'r'));
    WriteHostFile(mnt + "/ro/small", "small");
    if (mkdir((mnt + "/ro/d").c_str(), 0755) != 0) return "mkdir ro/d";
    WriteHostFile(mnt + "/ro/d/inner", "inner");
    if (setxattr((mnt + "/ro/f").c_str(), "user.k", "v", 1, 0) != 0) return "setxattr";
    WriteHostFile(mnt + "/rw/g", std::string(5000, 'w'));
    WriteHostFile(mnt + "/top", "top");
    CommandResult r = RunCommand({"btrfs", "property", "set", mnt + "/ro", "ro", "true"});
    if (!r.ok()) return r.Describe();
    return m.Unmount();
  }
};

// Every change inside a read-only subvolume is EROFS and changes nothing;
// the writable parts of the same image still take changes.
TEST(ReadOnlySubvolume, EveryChangeInsideIsErofs) {
  SKIP_IF_NO_LOOP();
  RoImage im;
  ASSERT_EQ(im.Make(), "");
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(im.img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    auto dir = f.Lookup("/ro");
    auto file = f.Lookup("/ro/f");
    auto sub = f.Lookup("/ro/d");
    auto rw = f.Lookup("/rw");
    auto top = f.Lookup("/top");
    ASSERT_TRUE(dir.ok() && file.ok() && sub.ok() && rw.ok() && top.ok());
    ubtrfs::NewInode attrs;
    attrs.mode = 0644;
    auto expect_erofs = [](const ubtrfs::Status& st, const char* what) {
      EXPECT_EQ(st.code(), EROFS) << what << ": " << st.ToString();
    };
    expect_erofs(f.Create(*dir, "new", attrs).status(), "create");
    attrs.mode = 0755;
    expect_erofs(f.Mkdir(*dir, "newdir", attrs).status(), "mkdir");
    attrs.mode = S_IFIFO | 0644;
    expect_erofs(f.Mknod(*dir, "fifo", attrs).status(), "mknod");
    attrs.mode = 0777;
    expect_erofs(f.Symlink(*dir, "ln", "f", attrs).status(), "symlink");
    expect_erofs(f.Link(*file, *dir, "hard"), "link");
    expect_erofs(f.Unlink(*dir, "f"), "unlink");
    expect_erofs(f.Unlink(*sub, "inner"), "unlink in a subdirectory");
    expect_erofs(f.Rmdir(*dir, "d"), "rmdir");
    expect_erofs(f.Rename(*dir, "f", *dir, "f2"), "rename inside");
    expect_erofs(f.Rename(*dir, "small", *rw, "small"), "rename out of it");
    expect_erofs(f.Rename(*rw, "g", *dir, "g"), "rename into it");
    const std::string data = "xyz";
    expect_erofs(f.Write(*file, 0, std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size())).status(),
                 "write");
    ubtrfs::AttrChange trunc;
    trunc.size = 0;
    expect_erofs(f.SetAttr(*file, trunc), "truncate");
    ubtrfs::AttrChange chmod;
    chmod.mode = 0600;
    expect_erofs(f.SetAttr(*dir, chmod), "chmod of the subvolume's top");
    expect_erofs(f.SetXattr(*file, "user.new", "1"), "setxattr");
    expect_erofs(f.RemoveXattr(*file, "user.k"), "removexattr");
    expect_erofs(f.Fallocate(*file, 0, 0, 1 << 20), "fallocate");

    // The rest of the image is writable in the same transaction.
    attrs.mode = 0644;
    auto made = f.Create(*rw, "made", attrs);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    ASSERT_TRUE(f.Write(*made, 0, std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size())).ok());
    EXPECT_TRUE(f.Unlink(f.Root(), "top").ok());
    ASSERT_TRUE(f.Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(im.img), "");

  // The CLI says so, and changes nothing either.
  const std::string host = im.tmp.Sub("host");
  WriteHostFile(host, "host");
  for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
           {UBTRFS_CLI_PATH, "mkdir", im.img + ":/ro/x"},
           {UBTRFS_CLI_PATH, "rm", im.img + ":/ro/f"},
           {UBTRFS_CLI_PATH, "rm", "-r", im.img + ":/ro/d"},
           {UBTRFS_CLI_PATH, "cp", host, im.img + ":/ro/"}}) {
    CommandResult r = RunCommand(argv);
    EXPECT_FALSE(r.ok()) << ShellJoin(argv);
    // "subvolume N is read-only", or strerror(EROFS) as coreutils put it.
    EXPECT_TRUE(r.err.find("read-only") != std::string::npos || r.err.find("Read-only") != std::string::npos)
        << ShellJoin(argv) << ": " << r.Describe();
  }
  CommandResult ok = RunCommand({UBTRFS_CLI_PATH, "mkdir", im.img + ":/rw/x"});
  EXPECT_TRUE(ok.ok()) << ok.Describe();
  EXPECT_EQ(BtrfsCheck(im.img), "");

  // The kernel sees the read-only subvolume as it left it.
  LoopMount m;
  ASSERT_EQ(m.Mount(im.img, im.mnt, "ro"), "");
  EXPECT_EQ(ReadHostFile(im.mnt + "/ro/f"), std::string(10000, 'r'));
  EXPECT_EQ(ReadHostFile(im.mnt + "/ro/d/inner"), "inner");
  EXPECT_EQ(ReadHostFile(im.mnt + "/rw/made"), "xyz");
  EXPECT_EQ(ReadHostFile(im.mnt + "/rw/g"), std::string(5000, 'w'));
  struct stat st;
  EXPECT_NE(lstat((im.mnt + "/top").c_str(), &st), 0);
  EXPECT_EQ(lstat((im.mnt + "/rw/x").c_str(), &st), 0);
  for (const char* gone : {"/ro/new", "/ro/newdir", "/ro/fifo", "/ro/ln", "/ro/hard", "/ro/f2", "/ro/g", "/ro/x",
                           "/ro/host"}) {
    EXPECT_NE(lstat((im.mnt + gone).c_str(), &st), 0) << gone;
  }
  char v[8];
  EXPECT_EQ(getxattr((im.mnt + "/ro/f").c_str(), "user.k", v, sizeof v), 1);
  EXPECT_EQ(m.Unmount(), "");
}

// The flag set and cleared by ubtrfs (library and `ubtrfs property`), read
// back by the kernel's tools, and enforced at once.
TEST(ReadOnlySubvolume, PropertySetAndGet) {
  SKIP_IF_NO_LOOP();
  RoImage im;
  ASSERT_EQ(im.Make(), "");
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(im.img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    auto ro = f.Lookup("/ro");
    auto rw = f.Lookup("/rw");
    auto g = f.Lookup("/rw/g");
    ASSERT_TRUE(ro.ok() && rw.ok() && g.ok());
    auto is_ro = [&](ubtrfs::InodeId id) {
      auto r = f.SubvolumeReadOnly(id);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      return r.ok() && *r;
    };
    EXPECT_TRUE(is_ro(*ro));
    EXPECT_FALSE(is_ro(*rw));
    EXPECT_EQ(f.SubvolumeReadOnly(*g).status().code(), EINVAL);
    ubtrfs::NewInode attrs;
    attrs.mode = 0644;
    ASSERT_TRUE(f.Create(*rw, "before", attrs).ok());
    ASSERT_TRUE(f.SetSubvolumeReadOnly(*rw, true).ok());
    EXPECT_EQ(f.Create(*rw, "after", attrs).status().code(), EROFS);
    EXPECT_TRUE(is_ro(*rw));
    ASSERT_TRUE(f.SetSubvolumeReadOnly(*ro, false).ok());
    auto made = f.Create(*ro, "now_writable", attrs);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    ASSERT_TRUE(f.Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(im.img), "");
  CommandResult r = RunCommand({UBTRFS_CLI_PATH, "property", "get", im.img + ":/rw", "ro"});
  EXPECT_EQ(r.out, "ro=true\n") << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "property", "get", im.img + ":/ro"});
  EXPECT_EQ(r.out, "ro=false\n") << r.Describe();
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(im.img, im.mnt), "");
    r = RunCommand({"btrfs", "property", "get", im.mnt + "/rw", "ro"});
    EXPECT_EQ(r.out, "ro=true\n") << r.Describe();
    r = RunCommand({"btrfs", "property", "get", im.mnt + "/ro", "ro"});
    EXPECT_EQ(r.out, "ro=false\n") << r.Describe();
    struct stat st;
    EXPECT_EQ(lstat((im.mnt + "/rw/before").c_str(), &st), 0);
    EXPECT_EQ(lstat((im.mnt + "/ro/now_writable").c_str(), &st), 0);
    EXPECT_NE(mkdir((im.mnt + "/rw/k").c_str(), 0755), 0);
    EXPECT_EQ(errno, EROFS);
    EXPECT_EQ(m.Unmount(), "");
  }
  r = RunCommand({UBTRFS_CLI_PATH, "property", "set", im.img + ":/rw", "ro", "false"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "mkdir", im.img + ":/rw/again"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "property", "set", im.img + ":/rw/g", "ro", "true"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.err.find("not the top of a subvolume"), std::string::npos) << r.Describe();
  EXPECT_EQ(BtrfsCheck(im.img), "");
  LoopMount m;
  ASSERT_EQ(m.Mount(im.img, im.mnt), "");
  r = RunCommand({"btrfs", "property", "get", im.mnt + "/rw", "ro"});
  EXPECT_EQ(r.out, "ro=false\n") << r.Describe();
  EXPECT_EQ(mkdir((im.mnt + "/rw/k").c_str(), 0755), 0) << strerror(errno);
  EXPECT_EQ(m.Unmount(), "");
  EXPECT_EQ(BtrfsCheck(im.img), "");
}

// No kernel needed: the top level's own flag, set and cleared by ubtrfs on
// an image mkfs.btrfs made, holds across a reopen.
TEST(ReadOnlySubvolume, TopLevelFlagAcrossReopen) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-subvol-top");
  const std::string img = tmp.Sub("img");
  ASSERT_EQ(RunMkfs(img, "", 16384, "crc32c", 256ull << 20), "");
  ubtrfs::OpenOptions o;
  o.writable = true;
  ubtrfs::NewInode attrs;
  attrs.mode = 0644;
  {
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto f = (*fs)->Create((*fs)->Root(), "f", attrs);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*fs)->Write(*f, 0, SpanOf("before")).ok());
    ASSERT_TRUE((*fs)->SetSubvolumeReadOnly((*fs)->Root(), true).ok());
    EXPECT_EQ((*fs)->Write(*f, 0, SpanOf("after")).status().code(), EROFS);
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  {
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    auto ro = f.SubvolumeReadOnly(f.Root());
    ASSERT_TRUE(ro.ok());
    EXPECT_TRUE(*ro);
    EXPECT_EQ(f.Mkdir(f.Root(), "d", attrs).status().code(), EROFS);
    EXPECT_EQ(f.Unlink(f.Root(), "f").code(), EROFS);
    ASSERT_TRUE(f.SetSubvolumeReadOnly(f.Root(), false).ok());
    EXPECT_TRUE(f.Mkdir(f.Root(), "d", attrs).ok());
    ASSERT_TRUE(f.Commit().ok());
    auto id = f.Lookup("/f");
    ASSERT_TRUE(id.ok());
    std::string buf(16, '\0');
    auto n = f.Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(buf.data()), buf.size()));
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(buf.substr(0, *n), "before");
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  CommandResult r = RunCommand({UBTRFS_CLI_PATH, "property", "get", img + ":/"});
  EXPECT_EQ(r.out, "ro=false\n") << r.Describe();
}

// Through the FUSE mount: the read-only subvolume gives EROFS, the rest works.
TEST(ReadOnlySubvolume, FuseMountGivesErofs) {
  SKIP_IF_NO_LOOP();
  SKIP_IF_NO_FUSE();
  RoImage im;
  ASSERT_EQ(im.Make(), "");
  const std::string fmnt = im.tmp.Sub("fmnt"), log = im.tmp.Sub("mount.log");
  ASSERT_EQ(mkdir(fmnt.c_str(), 0755), 0);
  MountProcess mount;
  std::string skip, error;
  if (!mount.Start(im.img, fmnt, log, {}, &skip, &error)) {
    if (!skip.empty()) GTEST_SKIP() << skip;
    FAIL() << error;
  }
  EXPECT_NE(mkdir((fmnt + "/ro/x").c_str(), 0755), 0);
  EXPECT_EQ(errno, EROFS);
  int fd = open((fmnt + "/ro/new").c_str(), O_CREAT | O_WRONLY, 0644);
  EXPECT_LT(fd, 0);
  EXPECT_EQ(errno, EROFS);
  if (fd >= 0) close(fd);
  // As the kernel: opening for writing fails already, O_RDWR and O_TRUNC
  // too; reading works.
  for (int flags : {O_WRONLY, O_RDWR, O_WRONLY | O_TRUNC, O_RDWR | O_APPEND}) {
    fd = open((fmnt + "/ro/f").c_str(), flags);
    EXPECT_LT(fd, 0) << "open flags " << flags;
    EXPECT_EQ(errno, EROFS) << "open flags " << flags;
    if (fd >= 0) close(fd);
  }
  fd = open((fmnt + "/ro/f").c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << strerror(errno);
  if (fd >= 0) close(fd);
  EXPECT_NE(unlink((fmnt + "/ro/f").c_str()), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(rename((fmnt + "/ro/small").c_str(), (fmnt + "/ro/small2").c_str()), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(truncate((fmnt + "/ro/f").c_str(), 0), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(setxattr((fmnt + "/ro/f").c_str(), "user.z", "1", 1, 0), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(chmod((fmnt + "/ro/f").c_str(), 0600), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(mkdir((fmnt + "/rw/x").c_str(), 0755), 0) << strerror(errno);
  WriteHostFile(fmnt + "/rw/y", "why");
  EXPECT_EQ(ReadHostFile(fmnt + "/ro/f"), std::string(10000, 'r'));
  EXPECT_EQ(mount.Unmount(&error), 0) << error << "\nlog: " << mount.Log();
  EXPECT_EQ(BtrfsCheck(im.img), "");
  LoopMount m;
  ASSERT_EQ(m.Mount(im.img, im.mnt, "ro"), "");
  EXPECT_EQ(ReadHostFile(im.mnt + "/rw/y"), "why");
  EXPECT_EQ(ReadHostFile(im.mnt + "/ro/f"), std::string(10000, 'r'));
  EXPECT_EQ(ReadHostFile(im.mnt + "/ro/small"), "small");
  EXPECT_EQ(m.Unmount(), "");
}

// ---- Balanced images ---------------------------------------------------------------------------

size_t CountInDump(const std::string& img, const std::string& word) {
  CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "extent", img});
  size_t n = 0;
  for (size_t at = r.out.find(word); at != std::string::npos; at = r.out.find(word, at + 1)) ++n;
  return n;
}

// The kernel fills an image (small nodes, so the trees have several
// levels), balances every chunk, and unmounts: the fs tree blocks come back
// with FULL_BACKREF and their data extents with shared data refs. ubtrfs
// then changes every part of it, and the kernel agrees.
struct BalanceCase {
  const char* name;
  std::vector<std::string> args;  // after `btrfs balance start`
};

class BalancedImage : public ::testing::TestWithParam<BalanceCase> {};

TEST_P(BalancedImage, WritableAfterBalance) {
  SKIP_IF_NO_LOOP();
  TempDir tmp("ubtrfs-balance");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    ASSERT_EQ(mkdir((mnt + "/a").c_str(), 0755), 0);
    for (int i = 0; i < 800; ++i) WriteHostFile(mnt + "/a/f" + std::to_string(i), "file " + std::to_string(i));
    for (int i = 0; i < 12; ++i) WriteHostFile(mnt + "/a/big" + std::to_string(i), SeededBytes(200000, i));
    Must({"btrfs", "subvolume", "create", mnt + "/sv"});
    for (int i = 0; i < 300; ++i) WriteHostFile(mnt + "/sv/s" + std::to_string(i), "sub " + std::to_string(i));
    for (int i = 0; i < 6; ++i) WriteHostFile(mnt + "/sv/big" + std::to_string(i), SeededBytes(150000, 100 + i));
    Must({"sync"});
    std::vector<std::string> balance = {"btrfs", "balance", "start"};
    balance.insert(balance.end(), GetParam().args.begin(), GetParam().args.end());
    balance.push_back(mnt);
    Must(balance);
    ASSERT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  const size_t full = CountInDump(img, "FULL_BACKREF"), shared = CountInDump(img, "shared data backref");
  EXPECT_GT(full, 0u) << "the balance left no tree block with full backrefs: nothing tested";
  EXPECT_GT(shared, 0u) << "the balance left no shared data refs: nothing tested";

  std::string big3 = SeededBytes(200000, 3);
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    auto a = f.Lookup("/a");
    auto sv = f.Lookup("/sv");
    ASSERT_TRUE(a.ok() && sv.ok());
    // An overwrite inside an extent (its head and tail stay: two refs).
    auto b3 = f.LookupChild(*a, "big3");
    ASSERT_TRUE(b3.ok());
    const std::string patch(4096, 'P');
    ASSERT_TRUE(f.Write(*b3, 8192, SpanOf(patch)).ok());
    big3.replace(8192, patch.size(), patch);
    // A truncate, a whole-file unlink, many small unlinks, many creates.
    auto b4 = f.LookupChild(*a, "big4");
    ASSERT_TRUE(b4.ok());
    ubtrfs::AttrChange t;
    t.size = 100000;
    ASSERT_TRUE(f.SetAttr(*b4, t).ok());
    ASSERT_TRUE(f.Unlink(*a, "big5").ok());
    for (int i = 0; i < 800; i += 2) ASSERT_TRUE(f.Unlink(*a, "f" + std::to_string(i)).ok()) << i;
    ubtrfs::NewInode attrs;
    attrs.mode = 0755;
    auto nd = f.Mkdir(f.Root(), "new", attrs);
    ASSERT_TRUE(nd.ok()) << nd.status().ToString();
    attrs.mode = 0644;
    for (int i = 0; i < 400; ++i) {
      auto c = f.Create(*nd, "n" + std::to_string(i), attrs);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      ASSERT_TRUE(f.Write(*c, 0, SpanOf(i % 50 == 0 ? SeededBytes(20000, 1000 + i) : "new " + std::to_string(i))).ok());
    }
    // The other subvolume too.
    ASSERT_TRUE(f.Unlink(*sv, "big0").ok());
    for (int i = 0; i < 300; i += 3) ASSERT_TRUE(f.Unlink(*sv, "s" + std::to_string(i)).ok());
    auto ns = f.Create(*sv, "made", attrs);
    ASSERT_TRUE(ns.ok());
    ASSERT_TRUE(f.Write(*ns, 0, SpanOf(SeededBytes(50000, 7))).ok());
    auto st = f.Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  EXPECT_LT(CountInDump(img, "FULL_BACKREF"), full);

  // The CLI: cp in, rm -r, mkdir.
  const std::string host = tmp.Sub("host");
  ASSERT_EQ(mkdir(host.c_str(), 0755), 0);
  for (int i = 0; i < 50; ++i) WriteHostFile(host + "/h" + std::to_string(i), SeededBytes(3000 + i * 100, 500 + i));
  for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
           {UBTRFS_CLI_PATH, "cp", host, img + ":/sv/"},
           {UBTRFS_CLI_PATH, "rm", "-r", img + ":/a"},
           {UBTRFS_CLI_PATH, "mkdir", img + ":/made_by_cli"}}) {
    CommandResult r = RunCommand(argv);
    EXPECT_TRUE(r.ok()) << ShellJoin(argv) << ": " << r.Describe();
    EXPECT_EQ(BtrfsCheck(img), "") << "after " << ShellJoin(argv);
  }

  // The kernel sees what ubtrfs sees.
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    auto mismatches = CompareTreeToImage(mnt, **fs, KernelMountCompareOptions());
    EXPECT_TRUE(mismatches.empty()) << FormatMismatches(mismatches);
    EXPECT_EQ(ReadHostFile(mnt + "/sv/host/h7"), SeededBytes(3700, 507));
    EXPECT_EQ(ReadHostFile(mnt + "/sv/made"), SeededBytes(50000, 7));
    struct stat st;
    EXPECT_NE(lstat((mnt + "/a").c_str(), &st), 0);
    EXPECT_EQ(m.Unmount(), "");
  }
  // The kernel writes to it, and ubtrfs changes it again.
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    WriteHostFile(mnt + "/new/kernel", SeededBytes(70000, 9));
    EXPECT_EQ(unlink((mnt + "/new/n1").c_str()), 0);
    EXPECT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  CommandResult r = RunCommand({UBTRFS_CLI_PATH, "rm", "-r", img + ":/new"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(BtrfsCheck(img), "");
}

INSTANTIATE_TEST_SUITE_P(Kinds, BalancedImage,
                         ::testing::Values(BalanceCase{"full", {"--full-balance"}}, BalanceCase{"data", {"-d"}},
                                           BalanceCase{"metadata", {"-m"}}),
                         [](const ::testing::TestParamInfo<BalanceCase>& info) { return std::string(info.param.name); });

// ---- Choosing a subvolume ------------------------------------------------------------------------

// @ (the default) and @home beside files at the top level, as installers
// lay them out.
struct LayoutImage {
  TempDir tmp{"ubtrfs-subvol-choice"};
  std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  uint64_t home_id = 0;

  std::string Make() {
    if (mkdir(mnt.c_str(), 0755) != 0) return "mkdir";
    if (std::string e = RunMkfs(img, "", 16384, "crc32c", 512ull << 20); !e.empty()) return e;
    LoopMount m;
    if (std::string e = m.Mount(img, mnt); !e.empty()) return e;
    for (const char* sv : {"@", "@home"}) {
      CommandResult r = RunCommand({"btrfs", "subvolume", "create", mnt + "/" + sv});
      if (!r.ok()) return r.Describe();
    }
    WriteHostFile(mnt + "/@/etc_file", "root fs");
    WriteHostFile(mnt + "/@home/user_file", "home");
    WriteHostFile(mnt + "/top_file", "top");
    CommandResult r = RunCommand({"btrfs", "subvolume", "set-default", mnt + "/@"});
    if (!r.ok()) return r.Describe();
    struct stat st;
    if (stat((mnt + "/@home").c_str(), &st) != 0) return "stat @home";
    r = RunCommand({"btrfs", "inspect-internal", "rootid", mnt + "/@home"});
    if (!r.ok()) return r.Describe();
    home_id = std::stoull(r.out);
    return m.Unmount();
  }
};

TEST(ChooseSubvolume, OpenOptionsPickWherePathsStart) {
  SKIP_IF_NO_LOOP();
  LayoutImage im;
  ASSERT_EQ(im.Make(), "");
  auto open = [&](const std::string& subvol, uint64_t id) {
    ubtrfs::OpenOptions o;
    o.subvol = subvol;
    o.subvolid = id;
    return ubtrfs::Filesystem::Open(im.img, o);
  };
  auto def = open("", 0);
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_TRUE((*def)->Lookup("/etc_file").ok());
  EXPECT_FALSE((*def)->Lookup("/top_file").ok());
  auto top = open("", 5);
  ASSERT_TRUE(top.ok()) << top.status().ToString();
  EXPECT_TRUE((*top)->Lookup("/top_file").ok());
  EXPECT_TRUE((*top)->Lookup("/@home/user_file").ok());
  EXPECT_EQ((*top)->Root().root, 5u);
  for (const char* p : {"@home", "/@home", "/@home/"}) {
    auto home = open(p, 0);
    ASSERT_TRUE(home.ok()) << p << ": " << home.status().ToString();
    EXPECT_EQ((*home)->Root().root, im.home_id);
    EXPECT_TRUE((*home)->Lookup("/user_file").ok());
    auto parent = (*home)->Lookup("/..");
    ASSERT_TRUE(parent.ok());
    EXPECT_EQ(*parent, (*home)->Root()) << "'..' of the top stays at the top";
  }
  auto both = open("@home", im.home_id);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ((*both)->Root().root, im.home_id);
  auto byid = open("", im.home_id);
  ASSERT_TRUE(byid.ok()) << byid.status().ToString();
  EXPECT_TRUE((*byid)->Lookup("/user_file").ok());
  EXPECT_EQ(open("@home", 5).status().code(), EINVAL);
  EXPECT_EQ(open("top_file", 0).status().code(), EINVAL);
  EXPECT_EQ(open("nothing", 0).status().code(), ENOENT);
  EXPECT_EQ(open("", 4242).status().code(), ENOENT);
  EXPECT_EQ(open("", 3).status().code(), EINVAL);
}

TEST(ChooseSubvolume, CliAndMountTakeSubvolAndSubvolid) {
  SKIP_IF_NO_LOOP();
  LayoutImage im;
  ASSERT_EQ(im.Make(), "");
  CommandResult r = RunCommand({UBTRFS_CLI_PATH, "ls", "--subvolid", "5", im.img, "/"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("@home"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top_file"), std::string::npos) << r.out;
  r = RunCommand({UBTRFS_CLI_PATH, "cat", "--subvol", "@home", im.img, "/user_file"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out, "home");
  r = RunCommand({UBTRFS_CLI_PATH, "cat", im.img, "/etc_file"});
  EXPECT_EQ(r.out, "root fs") << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "mkdir", "--subvolid", "5", im.img + ":/made_at_top"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "rm", "--subvol", "@home", im.img + ":/user_file"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  const std::string host = im.tmp.Sub("h");
  WriteHostFile(host, "copied");
  r = RunCommand({UBTRFS_CLI_PATH, "cp", "--subvol", "/@home", host, im.img + ":/"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({UBTRFS_CLI_PATH, "ls", "--subvol", "top_file", im.img});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.err.find("not a subvolume"), std::string::npos) << r.Describe();
  EXPECT_EQ(BtrfsCheck(im.img), "");
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(im.img, im.mnt, "ro,subvolid=5"), "");
    struct stat st;
    EXPECT_EQ(stat((im.mnt + "/made_at_top").c_str(), &st), 0);
    EXPECT_NE(stat((im.mnt + "/@home/user_file").c_str(), &st), 0);
    EXPECT_EQ(ReadHostFile(im.mnt + "/@home/h"), "copied");
    EXPECT_EQ(m.Unmount(), "");
  }
  if (std::string why = FuseUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  const std::string fmnt = im.tmp.Sub("fmnt"), log = im.tmp.Sub("mount.log");
  ASSERT_EQ(mkdir(fmnt.c_str(), 0755), 0);
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{{"-o", "subvol=@home"}, {"--subvolid", std::to_string(im.home_id)}}) {
    MountProcess mount;
    std::string skip, error;
    if (!mount.Start(im.img, fmnt, log, extra, &skip, &error)) {
      if (!skip.empty()) GTEST_SKIP() << skip;
      FAIL() << error;
    }
    EXPECT_EQ(ReadHostFile(fmnt + "/h"), "copied") << ShellJoin(extra);
    struct stat st;
    EXPECT_NE(stat((fmnt + "/etc_file").c_str(), &st), 0);
    EXPECT_EQ(mount.Unmount(&error), 0) << error;
  }
  EXPECT_EQ(BtrfsCheck(im.img), "");
}

}  // namespace
}  // namespace ubtrfs_test
