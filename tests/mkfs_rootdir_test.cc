// mkfs --rootdir for image builders (issue 19): --subvol and --inode-flags,
// with the kernel (a loop mount, btrfs-progs) as the judge of the result.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::CommandResult;
using ubtrfs_test::LoopMount;
using ubtrfs_test::RunCommand;
using ubtrfs_test::Sha256;
using ubtrfs_test::TempDir;
using ubtrfs_test::HaveBtrfsProgs;
using ubtrfs_test::RunUbtrfs;
using ubtrfs_test::WriteRandomFile;

const std::string kCli = UBTRFS_CLI_PATH;

void MkDir(const std::string& path) { ASSERT_EQ(mkdir(path.c_str(), 0755), 0) << path; }

// The bytes of data the csum tree covers (crc32c: 4 bytes a 4 KiB sector),
// from btrfs-progs' dump of it.
uint64_t CsumCoveredBytes(const std::string& img) {
  auto r = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "csum", img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  static const std::regex kItem(R"(EXTENT_CSUM EXTENT_CSUM \d+\) itemoff \d+ itemsize (\d+))");
  uint64_t bytes = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), kItem), end; it != end; ++it) {
    bytes += std::stoull((*it)[1].str()) / 4 * 4096;
  }
  return bytes;
}

// --subvol: plain, read-only, nested, below a plain directory, and the
// default (read-only too); the kernel lists them, agrees on the default and
// the ro property, and sees the source's content.
TEST(MkfsRootdirTest, SubvolumesAsTheKernelSeesThem) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs-subvol");
  const std::string src = dir.Sub("src"), img = dir.Sub("img.img");
  MkDir(src);
  WriteRandomFile(src + "/top-file", 100000, 1);
  for (const char* d : {"sv", "ro", "plain", "plain/deep", "def"}) MkDir(src + "/" + d);
  ubtrfs_test::GenerateTree(src + "/sv", 3, ubtrfs_test::ScaledTreeOptions(150));
  MkDir(src + "/sv/nested");
  ubtrfs_test::GenerateTree(src + "/sv/nested", 4, ubtrfs_test::ScaledTreeOptions(80));
  ubtrfs_test::GenerateTree(src + "/ro", 5, ubtrfs_test::ScaledTreeOptions(80));
  MkDir(src + "/plain/deep/inner");
  WriteRandomFile(src + "/plain/deep/inner/data", 300000, 6);
  WriteRandomFile(src + "/def/in-default", 5000, 7);
  ASSERT_EQ(chmod((src + "/ro").c_str(), 0750), 0);
  ASSERT_EQ(chown((src + "/def").c_str(), 1234, 5678), 0);

  auto r = RunUbtrfs({"mkfs", img, "--size", "512M", "--rootdir", src, "--subvol", "sv", "--subvol", "ro:sv/nested",
                "--subvol", "ro:ro", "--subvol", "rw:plain/deep/inner", "--subvol", "default-ro:def"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("  subvolume:        sv/nested (ro)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  subvolume:        def (ro, default)\n"), std::string::npos) << r.out;
  ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string mnt = dir.Sub("mnt");
  MkDir(mnt);
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro,subvolid=5"), "");
    auto list = RunCommand({"btrfs", "subvolume", "list", mnt});
    ASSERT_TRUE(list.ok()) << list.Describe();
    for (const char* p : {" path sv\n", " path sv/nested\n", " path ro\n", " path plain/deep/inner\n", " path def\n"}) {
      EXPECT_NE(list.out.find(p), std::string::npos) << p << " not in:\n" << list.out;
    }
    EXPECT_EQ(std::count(list.out.begin(), list.out.end(), '\n'), 5) << list.out;
    auto def = RunCommand({"btrfs", "subvolume", "get-default", mnt});
    ASSERT_TRUE(def.ok()) << def.Describe();
    EXPECT_NE(def.out.find(" path def\n"), std::string::npos) << def.out;
    for (const auto& [p, want] : std::vector<std::pair<std::string, std::string>>{
             {"sv", "ro=false"}, {"sv/nested", "ro=true"}, {"ro", "ro=true"}, {"plain/deep/inner", "ro=false"},
             {"def", "ro=true"}}) {
      auto g = RunCommand({"btrfs", "property", "get", "-ts", mnt + "/" + p, "ro"});
      ASSERT_TRUE(g.ok()) << g.Describe();
      EXPECT_EQ(g.out, want + "\n") << p;
    }
    // Each subvolume's top is inode 256 of its own tree.
    struct stat st;
    ASSERT_EQ(stat((mnt + "/sv/nested").c_str(), &st), 0);
    EXPECT_EQ(st.st_ino, 256u);
    ASSERT_EQ(stat((mnt + "/plain/deep").c_str(), &st), 0);
    EXPECT_NE(st.st_ino, 256u);
    auto mism = ubtrfs_test::CompareHostTrees(src, mnt, {});
    EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
    ASSERT_EQ(m.Unmount(), "");
  }
  {
    // Without subvol options the kernel mounts the default one.
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    auto mism = ubtrfs_test::CompareHostTrees(src + "/def", mnt, {});
    EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
    ASSERT_EQ(m.Unmount(), "");
  }
}

TEST(MkfsRootdirTest, BadSubvolAndInodeFlagsOptions) {
  TempDir dir("ubtrfs-mkfs-subvol-bad");
  const std::string src = dir.Sub("src"), img = dir.Sub("x.img");
  MkDir(src);
  MkDir(src + "/a");
  MkDir(src + "/b");
  WriteRandomFile(src + "/file", 10, 1);
  struct Case {
    std::vector<std::string> extra;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--subvol", "a"}, "--subvol needs --rootdir"},
      {{"--inode-flags", "nodatacow:a"}, "--inode-flags needs --rootdir"},
      {{"--rootdir", src, "--subvol", "missing"}, "No such file"},
      {{"--rootdir", src, "--subvol", "file"}, "not a directory"},
      {{"--rootdir", src, "--subvol", "."}, "top level"},
      {{"--rootdir", src, "--subvol", ".."}, "not below --rootdir"},
      {{"--rootdir", src, "--subvol", "a", "--subvol", "ro:./a/"}, "more than once"},
      {{"--rootdir", src, "--subvol", "default:a", "--subvol", "default-ro:b"}, "only one default"},
      {{"--rootdir", src, "--subvol", "ro:"}, "no directory"},
      {{"--rootdir", src, "--inode-flags", "nodatacow"}, "FLAGS:PATH"},
      {{"--rootdir", src, "--inode-flags", "nocow:a"}, "unknown flag 'nocow'"},
      {{"--rootdir", src, "--inode-flags", "nodatacow:missing"}, "No such file"},
      {{"--rootdir", src, "--inode-flags", "nodatacow:a", "--inode-flags", "nodatasum:a"}, "more than once"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"mkfs", img, "--size", "256M"};
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    auto r = RunUbtrfs(args);
    EXPECT_NE(r.exit_code, 0) << ubtrfs_test::ShellJoin(args);
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << ubtrfs_test::ShellJoin(args) << ": " << r.err;
    EXPECT_NE(access(img.c_str(), F_OK), 0) << ubtrfs_test::ShellJoin(args);
  }
}

// --inode-flags: nodatacow on a directory reaches what is below it (C in
// lsattr), nodatasum on one file; neither has checksums, the rest has.
TEST(MkfsRootdirTest, InodeFlagsNoCowNoSum) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs-iflags");
  const std::string src = dir.Sub("src"), img = dir.Sub("img.img");
  MkDir(src);
  MkDir(src + "/nocow");
  MkDir(src + "/nocow/sub");
  MkDir(src + "/sv");
  WriteRandomFile(src + "/nocow/big", 1 << 20, 1);
  WriteRandomFile(src + "/nocow/small", 300, 2);
  WriteRandomFile(src + "/nocow/sub/deeper", 200000, 3);
  WriteRandomFile(src + "/sumless", 512 << 10, 4);
  WriteRandomFile(src + "/plain", 256 << 10, 5);
  WriteRandomFile(src + "/sv/in-subvol", 128 << 10, 6);
  WriteRandomFile(src + "/sv/plain-in-subvol", 64 << 10, 7);
  auto r = RunUbtrfs({"mkfs", img, "--size", "256M", "--rootdir", src, "--inode-flags", "nodatacow:nocow",
                "--inode-flags", "nodatasum:sumless", "--subvol", "sv", "--inode-flags", "nodatacow,nodatasum:sv/in-subvol",
                "--compress", "zstd"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  auto full = RunCommand({"btrfs", "check", "--readonly", "--check-data-csum", img});
  EXPECT_TRUE(full.ok()) << full.Describe();
  // Only `plain` and sv/plain-in-subvol have checksums (random data: stored
  // plain despite --compress).
  EXPECT_EQ(CsumCoveredBytes(img), uint64_t{(256 + 64) << 10});

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string mnt = dir.Sub("mnt");
  MkDir(mnt);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  auto flags_of = [&](const std::string& p) {
    auto l = RunCommand({"lsattr", "-d", mnt + "/" + p});
    EXPECT_TRUE(l.ok()) << l.Describe();
    return l.out.substr(0, l.out.find(' '));
  };
  for (const char* p : {"nocow", "nocow/big", "nocow/small", "nocow/sub", "nocow/sub/deeper", "sv/in-subvol"}) {
    EXPECT_NE(flags_of(p).find('C'), std::string::npos) << p << ": " << flags_of(p);
  }
  for (const char* p : {"sumless", "plain", "sv", "sv/plain-in-subvol", "."}) {
    EXPECT_EQ(flags_of(p).find('C'), std::string::npos) << p << ": " << flags_of(p);
  }
  auto mism = ubtrfs_test::CompareHostTrees(src, mnt, {});
  EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  ASSERT_EQ(m.Unmount(), "");
}

// A tree with what an archive must carry: owners (not root: the archive
// says root), a device node, a fifo, hard links, a symlink, xattrs
// (user.* and security.*), a sparse file, odd modes and times.
void MakeArchiveTree(const std::string& t) {
  MkDir(t);
  MkDir(t + "/etc");
  MkDir(t + "/etc/deep");
  MkDir(t + "/dev");
  WriteRandomFile(t + "/etc/passwd", 1500, 1);
  WriteRandomFile(t + "/etc/deep/big", 3 << 20, 2);
  ASSERT_EQ(link((t + "/etc/passwd").c_str(), (t + "/etc/passwd-link").c_str()), 0);
  ASSERT_EQ(link((t + "/etc/passwd").c_str(), (t + "/etc/deep/passwd-link2").c_str()), 0);
  ASSERT_EQ(symlink("../etc/passwd", (t + "/dev/sym").c_str()), 0);
  ASSERT_EQ(mknod((t + "/dev/null2").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0) << strerror(errno);
  ASSERT_EQ(mknod((t + "/dev/blk").c_str(), S_IFBLK | 0600, makedev(7, 200)), 0) << strerror(errno);
  ASSERT_EQ(mkfifo((t + "/dev/fifo").c_str(), 0640), 0);
  ASSERT_EQ(setxattr((t + "/etc/passwd").c_str(), "user.origin", "archive", 7, 0), 0) << strerror(errno);
  ASSERT_EQ(setxattr((t + "/etc").c_str(), "security.label", "etc_t", 5, 0), 0) << strerror(errno);
  {
    const int fd = open((t + "/etc/sparse").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "data", 4, 1 << 20), 4);
    ASSERT_EQ(ftruncate(fd, 5 << 20), 0);
    close(fd);
  }
  ASSERT_EQ(chmod((t + "/etc/deep").c_str(), 02750), 0);
  auto r = RunCommand({"chown", "-R", "-h", "1234:5678", t});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({"find", t, "-exec", "touch", "-h", "-d", "@1600000000.25", "{}", "+"});
  ASSERT_TRUE(r.ok()) << r.Describe();
}

std::string FsidOf(const std::string& img) {
  auto fs = ubtrfs::Filesystem::Open(img);
  EXPECT_TRUE(fs.ok()) << fs.status().ToString();
  return fs.ok() ? (*fs)->Info().fsid : std::string();
}

// The argv that runs `args` as nobody (setpriv), when this process can.
std::vector<std::string> AsNobody(std::vector<std::string> args) {
  if (geteuid() != 0 || ubtrfs_test::FindProgram("setpriv").empty()) return args;
  std::vector<std::string> argv = {"setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// --rootdir ARCHIVE: tars (pax with xattrs; plain, gzip, xz, zstd; names
// that say nothing) of a tree with owner 0 recorded, built as `nobody`;
// the kernel's view of the image equals the archive (tar --compare).
TEST(MkfsRootdirTest, TarArchiveAsNobody) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "needs root (mknod, chown) and loop mounts: " << why;
  TempDir dir("ubtrfs-mkfs-tar");
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  const std::string tree = dir.Sub("tree"), out = dir.Sub("out"), mnt = dir.Sub("mnt");
  MakeArchiveTree(tree);
  MkDir(out);
  ASSERT_EQ(chmod(out.c_str(), 0777), 0);
  MkDir(mnt);
  const std::string tar = dir.Sub("plain");
  auto r = RunCommand({"tar", "--format=pax", "--owner", "0", "--group", "0", "--numeric-owner", "--xattrs",
                       "--xattrs-include=*", "--sparse", "-C", tree, "-cf", tar, "."});
  ASSERT_TRUE(r.ok()) << r.Describe();
  struct Variant {
    std::string name;
    std::vector<std::string> compress;  // a filter command: stdin to stdout
  };
  const std::vector<Variant> variants = {
      {"plain", {}}, {"gz", {"gzip", "-c"}}, {"xz", {"xz", "-c"}}, {"zst", {"zstd", "-q", "-c"}}};
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    std::string input = tar;
    if (!v.compress.empty()) {
      if (ubtrfs_test::FindProgram(v.compress[0]).empty()) {
        ADD_FAILURE() << v.compress[0] << " not installed";
        continue;
      }
      input = dir.Sub("archive-" + v.name);  // no telling extension
      r = RunCommand({"sh", "-c", ubtrfs_test::ShellJoin(v.compress) + " < " + tar + " > " + input});
      ASSERT_TRUE(r.ok()) << r.Describe();
    }
    const std::string img = out + "/" + v.name + ".img";
    r = RunCommand(AsNobody({kCli, "mkfs", img, "--size", "256M", "--rootdir", input}));
    ASSERT_TRUE(r.ok()) << r.Describe();
    EXPECT_NE(r.out.find("1 symlinks, 2 hard links, 3 special files"), std::string::npos) << r.out;
    ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
    auto own = RunCommand({kCli, "check", "--check-data-csum", img});
    EXPECT_TRUE(own.ok()) << own.Describe();
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    auto cmp = RunCommand({"tar", "--xattrs", "--xattrs-include=*", "-C", mnt, "--compare", "-f", tar});
    EXPECT_TRUE(cmp.ok()) << cmp.Describe();
    struct stat st;
    ASSERT_EQ(lstat((mnt + "/dev/blk").c_str(), &st), 0);
    EXPECT_TRUE(S_ISBLK(st.st_mode));
    EXPECT_EQ(st.st_rdev, makedev(7, 200));
    EXPECT_EQ(st.st_uid, 0u);
    ASSERT_EQ(lstat((mnt + "/etc/passwd").c_str(), &st), 0);
    EXPECT_EQ(st.st_nlink, 3u);
    EXPECT_EQ(st.st_uid, 0u);
    EXPECT_EQ(st.st_gid, 0u);
    ASSERT_EQ(lstat((mnt + "/etc/deep").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 02750u);
    EXPECT_EQ(st.st_mtim.tv_sec, 1600000000);
    EXPECT_EQ(st.st_mtim.tv_nsec, 250000000);
    char label[16] = {};
    EXPECT_EQ(lgetxattr((mnt + "/etc").c_str(), "security.label", label, sizeof label), 5);
    EXPECT_STREQ(label, "etc_t");
    // The sparse file keeps its holes: one sector of data.
    ASSERT_EQ(lstat((mnt + "/etc/sparse").c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 5 << 20);
    EXPECT_EQ(st.st_blocks * 512, 4096);
    ASSERT_EQ(m.Unmount(), "");
  }
  // From standard input.
  const std::string img = out + "/stdin.img";
  r = RunCommand({"sh", "-c", ubtrfs_test::ShellJoin(AsNobody({kCli, "mkfs", img, "--size", "256M", "-q",
                                                               "--rootdir", "-"})) + " < " + tar});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    auto cmp = RunCommand({"tar", "--xattrs", "--xattrs-include=*", "-C", mnt, "--compare", "-f", tar});
    EXPECT_TRUE(cmp.ok()) << cmp.Describe();
    ASSERT_EQ(m.Unmount(), "");
  }
  // What is not a tar archive is refused, and no image is left behind.
  const std::string junk = dir.Sub("junk");
  WriteRandomFile(junk, 100000, 9);
  r = RunUbtrfs({"mkfs", out + "/junk.img", "--size", "256M", "--rootdir", junk});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("not a tar archive"), std::string::npos) << r.Describe();
  EXPECT_NE(access((out + "/junk.img").c_str(), F_OK), 0);
  r = RunUbtrfs({"mkfs", out + "/x.img", "--size", "256M", "--rootdir", tar, "--subvol", "etc"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("not an archive"), std::string::npos) << r.Describe();
}

// ACLs an archive records as ACLs (pax SCHILY.acl.*, as tar --acls
// writes them) become the kernel's system.posix_acl_* xattrs; the archive is
// made by Python's tarfile, with a device entry no one had to mknod.
TEST(MkfsRootdirTest, ArchiveAclsBecomePosixAclXattrs) {
  if (ubtrfs_test::FindProgram("python3").empty()) GTEST_SKIP() << "python3 not installed";
  TempDir dir("ubtrfs-mkfs-acl");
  const std::string tar = dir.Sub("acl.tar"), img = dir.Sub("img.img");
  const std::string script = R"(
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT) as t:
    d = tarfile.TarInfo("d"); d.type = tarfile.DIRTYPE; d.mode = 0o775; d.mtime = 1500000000
    d.pax_headers = {"SCHILY.acl.default": "user::rwx,group::r-x,other::r-x,user:1000:rwx,mask::rwx"}
    t.addfile(d)
    f = tarfile.TarInfo("d/f"); f.mode = 0o654; f.size = 5; f.mtime = 1500000000; f.uid = 7; f.gid = 8
    f.pax_headers = {"SCHILY.acl.access": "user::rw-,user:99:r-x,group::r--,mask::r-x,other::r--"}
    t.addfile(f, io.BytesIO(b"hello"))
    c = tarfile.TarInfo("tty9"); c.type = tarfile.CHRTYPE; c.devmajor = 4; c.devminor = 9; c.mode = 0o620
    t.addfile(c)
)";
  auto r = RunCommand({"python3", "-c", script, tar});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunUbtrfs({"mkfs", img, "--size", "256M", "--rootdir", tar, "-q"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  if (HaveBtrfsProgs()) {
    EXPECT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  }
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto xattr = [&](const std::string& path, const std::string& name) -> std::string {
      auto id = (*fs)->Lookup(path);
      if (!id.ok()) return "lookup: " + id.status().ToString();
      auto v = (*fs)->GetXattr(*id, name);
      return v.ok() ? *v : v.status().ToString();
    };
    // The xattr layout: version 2, then (tag, perm, id) little-endian.
    auto acl = [](std::vector<std::tuple<uint16_t, uint16_t, uint32_t>> entries) {
      std::string v("\x02\0\0\0", 4);
      for (auto [tag, perm, id] : entries) {
        for (uint64_t x : {uint64_t{tag}, uint64_t{perm}}) v += std::string{static_cast<char>(x), '\0'};
        for (int i = 0; i < 4; ++i) v.push_back(static_cast<char>(id >> (8 * i)));
      }
      return v;
    };
    constexpr uint32_t kNoId = 0xffffffff;
    EXPECT_EQ(xattr("/d/f", "system.posix_acl_access"),
              acl({{0x01, 6, kNoId}, {0x02, 5, 99}, {0x04, 4, kNoId}, {0x10, 5, kNoId}, {0x20, 4, kNoId}}));
    EXPECT_EQ(xattr("/d", "system.posix_acl_default"),
              acl({{0x01, 7, kNoId}, {0x02, 7, 1000}, {0x04, 5, kNoId}, {0x10, 7, kNoId}, {0x20, 5, kNoId}}));
  }

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string mnt = dir.Sub("mnt");
  MkDir(mnt);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  char buf[256];
  const ssize_t n = lgetxattr((mnt + "/d/f").c_str(), "system.posix_acl_access", buf, sizeof buf);
  ASSERT_EQ(n, 4 + 5 * 8) << strerror(errno);
  EXPECT_EQ(buf[12], 2);   // the second entry is ACL_USER...
  EXPECT_EQ(buf[16], 99);  // ...for uid 99
  struct stat st;
  ASSERT_EQ(lstat((mnt + "/tty9").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(4, 9));
  ASSERT_EQ(lstat((mnt + "/d/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 7u);
  EXPECT_EQ(st.st_mode & 07777, 0654u);
  ASSERT_EQ(m.Unmount(), "");
}

// --owner UID:GID: everything imported from a directory, the top too.
TEST(MkfsRootdirTest, OwnerForcesTheOwner) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs-owner");
  const std::string src = dir.Sub("src"), img = dir.Sub("img.img");
  MkDir(src);
  MkDir(src + "/d");
  WriteRandomFile(src + "/d/f", 10000, 1);
  WriteRandomFile(src + "/big", 500000, 2);
  ASSERT_EQ(symlink("d/f", (src + "/l").c_str()), 0);
  auto r = RunUbtrfs({"mkfs", img, "--size", "256M", "--rootdir", src, "--owner", "0:0", "-q"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  for (const char* p : {"/", "/d", "/d/f", "/big", "/l"}) {
    auto s = RunUbtrfs({"stat", img + ":" + p});
    ASSERT_TRUE(s.ok()) << s.Describe();
    EXPECT_TRUE(std::regex_search(s.out, std::regex(R"(Uid: \(\s*0/.*Gid: \(\s*0/)"))) << p << ": " << s.out;
  }
  for (const char* bad : {"0", "a:b", "1:", ":1", "-1:0", "1:2:3"}) {
    r = RunUbtrfs({"mkfs", dir.Sub("bad.img"), "--size", "256M", "--rootdir", src, "--owner", bad});
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.err.find("--owner"), std::string::npos) << bad << ": " << r.err;
  }
}

// Makes the same tree at `root` in the given order of creation; every
// entry then gets the same times.
void MakeOrderedTree(const std::string& root, bool reverse) {
  MkDir(root);
  std::vector<int> order = {0, 1, 2, 3, 4, 5, 6, 7};
  if (reverse) std::reverse(order.begin(), order.end());
  for (int i : order) MkDir(root + "/d" + std::to_string(i));
  for (int i : order) {
    for (int j : order) WriteRandomFile(root + "/d" + std::to_string(i) + "/f" + std::to_string(j), 1000 * i + 300 * j, i * 8 + j);
    WriteRandomFile(root + "/d" + std::to_string(i) + "/big", 200000 + 70000 * i, 100 + i);
  }
  ASSERT_EQ(link((root + "/d1/f1").c_str(), (root + "/d7/link").c_str()), 0);
  ASSERT_EQ(symlink("d2/big", (root + "/sym").c_str()), 0);
  ASSERT_EQ(setxattr((root + "/d3").c_str(), "user.a", "1", 1, 0), 0);
  auto r = RunCommand({"find", root, "-exec", "touch", "-h", "-d", "@1600000000", "{}", "+"});
  ASSERT_TRUE(r.ok()) << r.Describe();
}

// SOURCE_DATE_EPOCH: the same tree made in another order, and the same
// archive twice, give the same image bytes (with subvolumes, compression).
TEST(MkfsRootdirTest, ByteIdenticalImages) {
  TempDir dir("ubtrfs-mkfs-repro");
  const std::string a = dir.Sub("a"), b = dir.Sub("b");
  MakeOrderedTree(a, false);
  sleep(1);  // a later ctime for the second tree: clamped away
  MakeOrderedTree(b, true);
  auto build = [&](const std::vector<std::string>& args, const std::string& img) {
    std::vector<std::string> argv = {"env", "SOURCE_DATE_EPOCH=1700000000", kCli, "mkfs", img, "--size", "256M", "-q"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = RunCommand(argv);
    EXPECT_TRUE(r.ok()) << r.Describe();
  };
  const std::vector<std::string> extra = {"--subvol", "ro:d4", "--subvol", "d5", "--compress", "zstd"};
  auto with = [&](const std::string& src) {
    std::vector<std::string> v = {"--rootdir", src};
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  build(with(a), dir.Sub("a.img"));
  build(with(b), dir.Sub("b.img"));
  EXPECT_EQ(Sha256(dir.Sub("a.img")), Sha256(dir.Sub("b.img")));
  if (HaveBtrfsProgs()) {
    EXPECT_EQ(ubtrfs_test::BtrfsCheck(dir.Sub("a.img")), "");
  }
  // The same with --deterministic and -U, without the variable: equal to
  // each other, not to the ones above (other uuids and times).
  auto r = RunCommand({kCli, "mkfs", dir.Sub("c.img"), "--size", "256M", "-q", "--deterministic", "-U",
                       "01234567-89ab-cdef-0123-456789abcdef", "--rootdir", a});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({kCli, "mkfs", dir.Sub("d.img"), "--size", "256M", "-q", "--deterministic", "-U",
                  "01234567-89ab-cdef-0123-456789abcdef", "--rootdir", b});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(Sha256(dir.Sub("c.img")), Sha256(dir.Sub("d.img")));
  EXPECT_NE(Sha256(dir.Sub("a.img")), Sha256(dir.Sub("c.img")));
  // Without either, two builds differ (random uuids, the clock).
  r = RunCommand({kCli, "mkfs", dir.Sub("e.img"), "--size", "256M", "-q", "--rootdir", a});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(Sha256(dir.Sub("c.img")), Sha256(dir.Sub("e.img")));
  // Twice from one archive.
  r = RunCommand({"tar", "--format=pax", "-C", a, "-cf", dir.Sub("t.tar"), "."});
  ASSERT_TRUE(r.ok()) << r.Describe();
  build({"--rootdir", dir.Sub("t.tar")}, dir.Sub("t1.img"));
  build({"--rootdir", dir.Sub("t.tar")}, dir.Sub("t2.img"));
  EXPECT_EQ(Sha256(dir.Sub("t1.img")), Sha256(dir.Sub("t2.img")));
  // Another label, another seed: the fsid differs.
  build({"--rootdir", dir.Sub("t.tar"), "-L", "other"}, dir.Sub("t3.img"));
  EXPECT_NE(FsidOf(dir.Sub("t1.img")), FsidOf(dir.Sub("t3.img")));
  // A bad SOURCE_DATE_EPOCH is an error.
  r = RunCommand({"env", "SOURCE_DATE_EPOCH=yesterday", kCli, "mkfs", dir.Sub("f.img"), "--size", "256M"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("SOURCE_DATE_EPOCH"), std::string::npos) << r.Describe();
}

// Reading the source leaves its atimes as they were (O_NOATIME): the image
// records them, so a build that changed them would make the next build of
// the same tree differ.
TEST(MkfsRootdirTest, SourceAtimesStayAsTheyWere) {
  TempDir dir("ubtrfs-mkfs-atime");
  const std::string src = dir.Sub("src");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((src + "/d").c_str(), 0755), 0);
  WriteRandomFile(src + "/d/small", 100, 1);
  WriteRandomFile(src + "/big", 3 << 20, 2);
  // atime before mtime: relatime would update it at the first read.
  auto r = RunCommand({"touch", "-m", "-d", "@1600000000", src + "/d/small", src + "/big", src + "/d", src});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({"touch", "-a", "-d", "@1500000000", src + "/d/small", src + "/big", src + "/d", src});
  ASSERT_TRUE(r.ok()) << r.Describe();
  for (const char* compress : {"", "zstd"}) {
    SCOPED_TRACE(compress);
    std::vector<std::string> argv = {kCli, "mkfs", "-q", "-f", "--size", "256M", "--rootdir", src, dir.Sub("i.img")};
    if (*compress) argv.insert(argv.end(), {"--compress", compress});
    r = RunCommand(argv);
    ASSERT_TRUE(r.ok()) << r.Describe();
    for (const std::string& p : {src + "/d/small", src + "/big", src + "/d", src}) {
      struct stat st;
      ASSERT_EQ(lstat(p.c_str(), &st), 0) << p;
      EXPECT_EQ(st.st_atim.tv_sec, 1500000000) << p << ": its atime changed";
    }
  }
}

// A build where no thread can be started (an unprivileged user at its
// process limit) does alone what its helper threads do, and makes the same
// image bytes. It used to abort on std::thread's exception in three places:
// the compressed files read ahead, a directory of 512 names or more probed
// on two threads, a commit of 1,024 blocks or more sealed on two.
TEST(MkfsRootdirTest, BuildWithoutThreadsMakesTheSameImage) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run mkfs as another user";
  for (const char* tool : {"setpriv", "prlimit"}) {
    if (ubtrfs_test::FindProgram(tool).empty()) GTEST_SKIP() << tool << " not installed";
  }
  TempDir dir("ubtrfs-mkfs-nothreads");
  ASSERT_EQ(chmod(dir.path().c_str(), 0777), 0);
  const std::string src = dir.Sub("src");
  MkDir(src);
  MkDir(src + "/d");
  auto text = [](const std::string& path, size_t n) {
    std::ofstream out(path);
    for (size_t i = 0; static_cast<size_t>(out.tellp()) < n; ++i) out << "line " << i % 1000 << " of some text\n";
  };
  text(src + "/d/multi-chunk", (1 << 20) + 12345);
  text(src + "/two-ranges", 200000);
  text(src + "/inline", 900);
  WriteRandomFile(src + "/random", 300000, 1);
  // Enough names for a commit of more than 1,024 tree blocks.
  for (const char* d : {"/a", "/b", "/c"}) {
    MkDir(src + d);
    for (int i = 0; i < 16000; ++i) {
      const int fd = open((src + d + "/f" + std::to_string(i)).c_str(), O_WRONLY | O_CREAT, 0644);
      ASSERT_GE(fd, 0);
      close(fd);
    }
  }
  const std::vector<std::string> mkfs = {"env", "SOURCE_DATE_EPOCH=1500000000", kCli, "mkfs", "-q", "--size", "256M",
                                         "--compress", "zstd", "--rootdir", src};
  auto argv = mkfs;
  argv.push_back(dir.Sub("threads.img"));
  auto r = RunCommand(argv);
  ASSERT_TRUE(r.ok()) << r.Describe();
  // LeakSanitizer needs a thread of its own at exit (an ASan build): the
  // limited run turns it off, in the env that starts mkfs (mkfs[0]).
  const char* asan = getenv("ASAN_OPTIONS");
  const std::string before = asan && *asan ? std::string(asan) + ":" : "";
  argv = {"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "prlimit", "--nproc=1:1",
          mkfs[0],   "ASAN_OPTIONS=" + before + "detect_leaks=0"};
  argv.insert(argv.end(), mkfs.begin() + 1, mkfs.end());
  argv.push_back(dir.Sub("alone.img"));
  r = RunCommand(argv);
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(Sha256(dir.Sub("alone.img")), Sha256(dir.Sub("threads.img")));
  // And it was without threads: a program that starts one fails there.
  r = RunCommand({"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "prlimit", "--nproc=1:1", "sh",
                  "-c", "sleep 0 & wait"});
  EXPECT_FALSE(r.ok()) << "the process limit did not stop a fork: " << r.Describe();
}

// Holes in sparse host files stay holes: no extents for them, the kernel
// finds them with SEEK_HOLE/SEEK_DATA and counts only the data's blocks.
TEST(MkfsRootdirTest, SparseFilesStaySparse) {
  if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs (btrfs check) not installed";
  TempDir dir("ubtrfs-mkfs-sparse");
  const std::string src = dir.Sub("src"), img = dir.Sub("img.img");
  MkDir(src);
  {
    const int fd = open((src + "/sparse").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    std::string block(64 << 10, 'x');
    ASSERT_EQ(pwrite(fd, block.data(), block.size(), 1 << 20), static_cast<ssize_t>(block.size()));
    ASSERT_EQ(pwrite(fd, block.data(), block.size(), 8 << 20), static_cast<ssize_t>(block.size()));
    ASSERT_EQ(ftruncate(fd, 64 << 20), 0);
    close(fd);
  }
  auto r = RunUbtrfs({"mkfs", img, "--size", "256M", "--rootdir", src, "-q"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  // The file's EXTENT_DATA items: the two data runs only (no-holes: no hole items).
  auto dump = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "5", img});
  ASSERT_TRUE(dump.ok()) << dump.Describe();
  static const std::regex kExtent(R"(\(257 EXTENT_DATA (\d+)\))");
  std::vector<uint64_t> offsets;
  for (std::sregex_iterator it(dump.out.begin(), dump.out.end(), kExtent), end; it != end; ++it) {
    offsets.push_back(std::stoull((*it)[1].str()));
  }
  EXPECT_EQ(offsets, (std::vector<uint64_t>{1 << 20, 8 << 20})) << dump.out;

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const std::string mnt = dir.Sub("mnt");
  MkDir(mnt);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  const int fd = open((mnt + "/sparse").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(lseek(fd, 0, SEEK_DATA), 1 << 20);
  EXPECT_EQ(lseek(fd, 1 << 20, SEEK_HOLE), (1 << 20) + (64 << 10));
  EXPECT_EQ(lseek(fd, (1 << 20) + (64 << 10), SEEK_DATA), 8 << 20);
  EXPECT_EQ(lseek(fd, 8 << 20, SEEK_HOLE), (8 << 20) + (64 << 10));
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 64 << 20);
  EXPECT_EQ(st.st_blocks * 512, 2 * (64 << 10));
  close(fd);
  ASSERT_EQ(m.Unmount(), "");
}

// Progress: one updating line on a terminal (script(1) gives the command
// one), nothing with -q or when stderr is no terminal.
TEST(MkfsRootdirTest, ProgressOnATerminalOnly) {
  if (ubtrfs_test::FindProgram("script").empty()) GTEST_SKIP() << "script (util-linux) not installed";
  TempDir dir("ubtrfs-mkfs-progress");
  const std::string src = dir.Sub("src");
  MkDir(src);
  {
    std::string block(1 << 20, '\0');
    std::ofstream f(src + "/big", std::ios::binary);
    for (int i = 0; i < 512; ++i) {
      for (size_t j = 0; j < block.size(); j += 512) block[j] = static_cast<char>(i + j);
      f.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
    ASSERT_TRUE(f.good());
  }
  for (int i = 0; i < 3000; ++i) WriteRandomFile(src + "/f" + std::to_string(i), 10, static_cast<uint32_t>(i));
  auto mkfs = [&](const std::string& img, bool quiet) {
    std::vector<std::string> argv = {kCli, "mkfs", img, "--size", "1G", "--rootdir", src};
    if (quiet) argv.push_back("-q");
    return argv;
  };
  // Under script, stderr is the terminal; its output is what the terminal got.
  auto r = RunCommand({"script", "-qec", ubtrfs_test::ShellJoin(mkfs(dir.Sub("a.img"), false)), "/dev/null"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\r\x1b\[K\d+ files, \d+ directories, \d+ entries; [0-9.]+[KMG]iB, )")))
      << ubtrfs_test::Printable(r.out, 2000);
  EXPECT_NE(r.out.find("Rootdir:"), std::string::npos);
  r = RunCommand({"script", "-qec", ubtrfs_test::ShellJoin(mkfs(dir.Sub("b.img"), true)), "/dev/null"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out, "") << ubtrfs_test::Printable(r.out, 2000);
  r = RunCommand(mkfs(dir.Sub("c.img"), false));
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.err, "");
}

}  // namespace
