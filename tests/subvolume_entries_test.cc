// rmdir, unlink, rename and RENAME_EXCHANGE on entries that name subvolumes
// (and on snapshots' stubs of nested subvolumes), call for call as the
// kernel answers them. One table of calls with the errno each gets: ubtrfs
// runs it through the library on one copy of an image; where loop mounts
// work, the kernel runs it with system calls on another copy, each answer
// must be the table's, and the two results must look the same through a
// kernel mount (tree, subvolume list). btrfs check and ubtrfs check judge
// ubtrfs's copy either way.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/fuse_mount.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/check.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

using ubtrfs::InodeId;

enum class Op { kRmdir, kUnlink, kRename, kExchange, kLink };

struct Call {
  Op op;
  std::string a, b;
  int expect;  // 0 or the errno the kernel gives
};

// Kernel 6.18 gave each of these answers on a loop mount.
const std::vector<Call>& Calls() {
  static const std::vector<Call> calls = {
      {Op::kRmdir, "a", "", 0},                        // an empty subvolume
      {Op::kRmdir, "b", "", ENOTEMPTY},                // one with a file
      {Op::kUnlink, "b", "", EISDIR},
      {Op::kRename, "ro", "ro_b", 0},                  // read-only, same directory
      {Op::kRename, "ro_b", "d/ro_c", EROFS},          // read-only, elsewhere
      {Op::kRmdir, "ro2", "", 0},                      // read-only and empty
      {Op::kRmdir, "par", "", ENOTEMPTY},              // holds a nested subvolume
      {Op::kRmdir, "snap/nest", "", 0},                // a stub
      {Op::kRename, "par/nest", "par/nest2", 0},
      {Op::kRename, "b", "b/inside", EINVAL},          // into itself
      {Op::kRename, "s2/g", "b", EISDIR},              // a file onto a subvolume
      {Op::kRename, "e", "emp", ENOTEMPTY},            // a directory onto an empty subvolume
      {Op::kRename, "c", "s2/full", ENOTEMPTY},
      {Op::kRename, "c", "f", ENOTDIR},
      {Op::kRename, "c", "s2/empty", 0},               // onto an empty directory of another subvolume
      {Op::kRename, "f", "snap/file", EXDEV},
      {Op::kRename, "mv", "s2/mv", 0},                 // into another subvolume
      {Op::kRename, "s2/mv", "s2/full/mv", 0},         // deeper in it
      {Op::kExchange, "s2/g", "emp", EXDEV},
      {Op::kExchange, "emp", "s2/g", EXDEV},
      {Op::kExchange, "emp", "d", 0},                  // a subvolume and a directory
      {Op::kExchange, "sv1", "f", 0},                  // a subvolume and a file
      {Op::kExchange, "sv2", "s2/b2", 0},              // two subvolumes of two parents
      {Op::kExchange, "e", "s2/b2", EXDEV},
      {Op::kRename, "sts/n1", "sts/n1b", ENOTEMPTY},  // a stub does not move
      {Op::kRename, "sts/ff", "sts/n1", EISDIR},
      {Op::kRename, "sts/dd", "sts/n2", 0},            // a directory onto a stub
      {Op::kRename, "g2", "sts/n3", 0},                // a subvolume onto a stub
      {Op::kRename, "sts/sub", "sts/sub/n5", EINVAL},  // a directory onto a stub inside it
      {Op::kRename, "rop/inner", "rop/inner2", EROFS},
      {Op::kRename, "x", "rop/x", EROFS},
      {Op::kLink, "f", "s2/ff", EPERM},                // f is a subvolume now
      {Op::kLink, "sv1", "s2/ff", EXDEV},              // and sv1 the file
      {Op::kRmdir, "rsnap/nest", "", EROFS},
      {Op::kUnlink, "sts/n1", "", EISDIR},
      {Op::kRmdir, "sts/n1", "", 0},
      {Op::kRename, "y", "x", ENOTEMPTY},              // a subvolume onto another
      {Op::kRename, "x", "x2", 0},
      {Op::kRmdir, "x2", "", 0},
  };
  return calls;
}

std::string Describe(const Call& c) {
  static const char* names[] = {"rmdir", "unlink", "rename", "exchange", "link"};
  return std::string(names[static_cast<int>(c.op)]) + " " + c.a + (c.b.empty() ? "" : " " + c.b);
}

std::pair<std::string, std::string> Split(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {"/", path};
  return {"/" + path.substr(0, slash), path.substr(slash + 1)};
}

// The errno the library gives for a call (0 when it succeeds).
int RunOnImage(ubtrfs::Filesystem& fs, const Call& c) {
  auto [ad, an] = Split(c.a);
  auto dir = fs.Lookup(ad);
  if (!dir.ok()) return dir.status().code();
  ubtrfs::Status st;
  if (c.op == Op::kRmdir) {
    st = fs.Rmdir(*dir, an);
  } else if (c.op == Op::kUnlink) {
    st = fs.Unlink(*dir, an);
  } else {
    auto [bd, bn] = Split(c.b);
    auto to = fs.Lookup(bd);
    if (!to.ok()) return to.status().code();
    if (c.op == Op::kLink) {
      auto id = fs.LookupChild(*dir, an);
      st = id.ok() ? fs.Link(*id, *to, bn) : id.status();
    } else {
      st = fs.Rename(*dir, an, *to, bn, c.op == Op::kExchange ? ubtrfs::kRenameExchange : 0);
    }
  }
  return st.ok() ? 0 : st.code();
}

int RunOnMount(const std::string& mnt, const Call& c) {
  const std::string a = mnt + "/" + c.a, b = mnt + "/" + c.b;
  int r = 0;
  switch (c.op) {
    case Op::kRmdir: r = rmdir(a.c_str()); break;
    case Op::kUnlink: r = unlink(a.c_str()); break;
    case Op::kRename: r = renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), 0); break;
    case Op::kExchange: r = renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE); break;
    case Op::kLink: r = link(a.c_str(), b.c_str()); break;
  }
  return r == 0 ? 0 : errno;
}

// The starting image, made through the library so that it needs no root:
// subvolumes empty and full, read-only ones, nested ones, snapshots whose
// copies of nested subvolumes are stubs, and plain files and directories.
std::string Populate(const std::string& img) {
  auto fs = ubtrfs::Filesystem::Open(img, {.writable = true});
  if (!fs.ok()) return fs.status().ToString();
  ubtrfs::Filesystem& f = **fs;
  const InodeId top = f.Root();
  ubtrfs::NewInode dir_attrs{.mode = 0755};
  ubtrfs::NewInode file_attrs{.mode = 0644};
  std::string err;
  auto must = [&](const ubtrfs::Status& s, const std::string& what) {
    if (!s.ok() && err.empty()) err = what + ": " + s.ToString();
  };
  auto at = [&](const std::string& path) -> InodeId {
    auto id = f.Lookup(path);
    must(id.status(), "lookup " + path);
    return id.ok() ? *id : top;
  };
  auto subvol = [&](const std::string& path) {
    auto [d, n] = Split(path);
    must(f.CreateSubvolume(at(d), n, dir_attrs).status(), "subvolume " + path);
  };
  auto mkdir_ = [&](const std::string& path) {
    auto [d, n] = Split(path);
    must(f.Mkdir(at(d), n, dir_attrs).status(), "mkdir " + path);
  };
  auto file = [&](const std::string& path) {
    auto [d, n] = Split(path);
    auto id = f.Create(at(d), n, file_attrs);
    must(id.status(), "create " + path);
    if (id.ok()) must(f.Write(*id, 0, std::vector<uint8_t>(100, 'x')).status(), "write " + path);
  };
  auto snapshot = [&](const std::string& src, const std::string& path, bool ro) {
    auto [d, n] = Split(path);
    must(f.CreateSnapshot(at("/" + src), at(d), n, ro).status(), "snapshot " + path);
  };
  auto read_only = [&](const std::string& path) { must(f.SetSubvolumeReadOnly(at("/" + path), true), "ro " + path); };
  for (const char* s : {"a", "b", "ro", "ro2", "emp", "c", "mv", "sv1", "sv2", "g2", "x", "y", "s2", "par", "st",
                        "rop", "s2/b2", "par/nest", "st/n1", "st/n2", "st/n3", "st/n4", "rop/inner"}) {
    subvol(s);
  }
  mkdir_("st/sub");
  subvol("st/sub/n5");
  file("b/x");
  for (const char* d : {"d", "e", "s2/full", "s2/empty"}) mkdir_(d);
  for (const char* p : {"f", "s2/g", "s2/full/x", "par/file"}) file(p);
  snapshot("par", "snap", false);
  snapshot("par", "rsnap", true);
  snapshot("st", "sts", false);
  mkdir_("sts/dd");
  file("sts/ff");
  for (const char* p : {"ro", "ro2", "rop"}) read_only(p);
  must(f.Commit(), "commit");
  return err;
}

// Ids, parents and paths; not generations, which count commits (ubtrfs
// commits after each change to a subvolume's entry, the kernel does not).
std::string SubvolumeList(const std::string& mnt) {
  CommandResult r = RunCommand({"btrfs", "subvolume", "list", mnt});
  if (!r.ok()) return r.Describe();
  std::string out;
  for (size_t at = 0; at < r.out.size();) {
    size_t end = r.out.find('\n', at);
    if (end == std::string::npos) end = r.out.size();
    std::string line = r.out.substr(at, end - at);
    const size_t g = line.find(" gen "), t = line.find(" top level ");
    if (g != std::string::npos && t != std::string::npos && g < t) line.erase(g, t - g);
    out += line + "\n";
    at = end + 1;
  }
  return out;
}

TEST(SubvolumeEntries, RmdirRenameAndExchangeAnswerAsTheKernel) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp{"ubtrfs-subvol-entries"};
  const std::string ours = tmp.Sub("ours"), theirs = tmp.Sub("theirs");
  ASSERT_EQ(RunMkfs(ours, "", 16384, "crc32c", 512ull << 20), "");
  ASSERT_EQ(Populate(ours), "");
  ASSERT_TRUE(RunCommand({"cp", "--sparse=always", ours, theirs}).ok());

  {
    auto fs = ubtrfs::Filesystem::Open(ours, {.writable = true});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    for (const Call& c : Calls()) EXPECT_EQ(RunOnImage(**fs, c), c.expect) << Describe(c);
    // The kernel aborts its transaction on these (6.18); we refuse them.
    for (auto [a, b] : {std::pair{"n4", "ff"}, std::pair{"ff", "n4"}}) {
      EXPECT_EQ(RunOnImage(**fs, Call{Op::kExchange, std::string("sts/") + a, std::string("sts/") + b, 0}),
                a == std::string("n4") ? ENOTEMPTY : ENOENT);
    }
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(ours), "");
  auto check = ubtrfs::CheckImage(ours);
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  EXPECT_TRUE(check->clean()) << (check->errors.empty() ? "" : check->errors.front());

  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel's answers not compared: loop mounts unavailable: " << why;
  const std::string m1 = tmp.Sub("m1"), m2 = tmp.Sub("m2");
  ASSERT_EQ(mkdir(m1.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(m2.c_str(), 0755), 0);
  {
    LoopMount k;
    ASSERT_EQ(k.Mount(theirs, m2), "");
    for (const Call& c : Calls()) EXPECT_EQ(RunOnMount(m2, c), c.expect) << "kernel: " << Describe(c);
    ASSERT_EQ(k.Unmount(), "");
  }
  LoopMount a, b;
  ASSERT_EQ(a.Mount(ours, m1, "ro"), "");
  ASSERT_EQ(b.Mount(theirs, m2, "ro"), "");
  CompareOptions o;
  o.compare_mtime = o.compare_dir_mtime = o.compare_symlink_mtime = false;
  EXPECT_EQ(FormatMismatches(CompareHostTrees(m1, m2, o)), FormatMismatches({}));
  EXPECT_EQ(SubvolumeList(m1), SubvolumeList(m2));
}

// What users of the mount do with subvolumes: mv one into another
// subvolume, rm -r a tree that holds one, rmdir an empty one. Before, each
// failed (EOPNOTSUPP, or EXDEV, where mv copied the subvolume into a plain
// directory and deleted it).
TEST(SubvolumeEntries, MvAndRmThroughTheMount) {
  SKIP_IF_NO_FUSE();
  struct {
    TempDir tmp{"ubtrfs-subvol-mount"};
    std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt"), log = tmp.Sub("log");
  } s;
  ASSERT_EQ(RunMkfs(s.img, "", 16384, "crc32c", 512ull << 20), "");
  ASSERT_EQ(Populate(s.img), "");
  ASSERT_EQ(mkdir(s.mnt.c_str(), 0755), 0);
  {
    MountProcess mount;
    START_MOUNT(mount, s, "-o", "commit=0");
    for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
             {"mv", s.mnt + "/mv", s.mnt + "/s2/full/"},
             {"rm", "-r", s.mnt + "/par"},
             {"rmdir", s.mnt + "/a"},
             {"mv", s.mnt + "/snap/nest", s.mnt + "/d/"}}) {
      CommandResult r = RunCommand(argv);
      if (argv.back() == s.mnt + "/d/") {
        EXPECT_FALSE(r.ok()) << "a stub moved";  // ENOTEMPTY, as from the kernel
      } else {
        EXPECT_TRUE(r.ok()) << ShellJoin(argv) << ": " << r.Describe();
      }
    }
    std::string error;
    EXPECT_EQ(mount.Unmount(&error), 0) << error << mount.Log();
  }
  EXPECT_EQ(BtrfsCheck(s.img), "");
  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto list = (*fs)->ListSubvolumes();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  std::vector<std::string> paths;
  for (const auto& v : *list) paths.push_back(v.path);
  auto has = [&](const std::string& p) { return std::find(paths.begin(), paths.end(), p) != paths.end(); };
  EXPECT_TRUE(has("s2/full/mv"));
  EXPECT_FALSE(has("mv"));
  EXPECT_FALSE(has("par"));
  EXPECT_FALSE(has("par/nest"));
  EXPECT_FALSE(has("a"));
  EXPECT_TRUE(has("snap"));
  EXPECT_FALSE((*fs)->Lookup("/par").ok());
  EXPECT_TRUE((*fs)->Lookup("/snap/nest").ok());
}

}  // namespace
}  // namespace ubtrfs_test
