// POSIX behaviour through a real `ubtrfs mount`: what pjdfstest checks (see
// docs/CONFORMANCE.md), re-expressed as our own cases so that CI, which
// cannot fetch pjdfstest, still runs them. Each test mounts a fresh image
// with allow_other (other users' calls reach us; permission checks are the
// kernel's, default_permissions), runs system calls -- some as other users
// from a forked child -- and ends with an unmount that must exit 0 and an
// image that btrfs check finds clean.
//
// Expectations are Linux's on a native file system, with one btrfs-ism: a
// directory's st_nlink is 1 (btrfs does not count subdirectories).
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/fuse_mount.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::BtrfsCheck;

constexpr uid_t kUserA = 65531, kUserB = 65532;
constexpr gid_t kGroupA = 65531, kGroupB = 65532, kGroupC = 65533;

// 0 if the call succeeded, else its errno.
int Errno(long r) { return r < 0 ? errno : 0; }

// Runs fn in a forked child as uid/gid (supplementary groups `groups`);
// returns 0 or the errno fn ended with (fn returns < 0 on failure), 250+
// when the child could not become that user.
int AsUser(uid_t uid, gid_t gid, const std::function<long()>& fn, std::vector<gid_t> groups = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(groups.size(), groups.data()) != 0) _exit(250);
    if (setgid(gid) != 0) _exit(251);
    if (setuid(uid) != 0) _exit(252);
    errno = 0;
    const long r = fn();
    _exit(r < 0 ? (errno ? errno : 249) : 0);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 248;
  return WEXITSTATUS(status);
}

bool TimeLess(const timespec& a, const timespec& b) {
  return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

// Waits until the coarse clock (the kernel's current_time(), which the
// mount's timestamps come from too) is past t, so that a time stamped from
// now on is later than t. A fixed sleep is not enough: the clock ticks
// every few milliseconds, and t may itself be a tick ahead of it.
void WaitForTheClockToPass(const timespec& t) {
  for (;;) {
    timespec now;
    clock_gettime(CLOCK_REALTIME_COARSE, &now);
    if (TimeLess(t, now)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

struct stat Lstat(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(lstat(p.c_str(), &st), 0) << p << ": " << strerror(errno);
  return st;
}

int CreateFile(const std::string& p, mode_t mode = 0644) {
  const int fd = open(p.c_str(), O_CREAT | O_EXCL | O_WRONLY, mode);
  if (fd < 0) return -1;
  return close(fd);
}

// 0 if open(path, flags) works (the descriptor is closed again), else errno.
int OpenErr(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags, 0644);
  if (fd < 0) return errno;
  close(fd);
  return 0;
}

std::string Name(size_t len, char c = 'n') { return std::string(len, c); }

// A POSIX ACL xattr value (version 2): {tag, perm, id} entries.
std::string AclValue(const std::vector<std::array<uint32_t, 3>>& entries) {
  std::string v;
  auto put = [&](uint32_t x, int bytes) {
    for (int i = 0; i < bytes; ++i) v.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
  };
  put(2, 4);
  for (const auto& e : entries) {
    put(e[0], 2);
    put(e[1], 2);
    put(e[2], 4);
  }
  return v;
}
constexpr uint32_t kUserObj = 1, kUser = 2, kGroupObj = 4, kMask = 0x10, kOther = 0x20, kUndefinedId = ~0u;

// With UBTRFS_POSIX_RBD_CONF=CEPH_CONF in the environment (tests/rbd_test.cc
// sets it), every FusePosix case mounts an RBD image in that cluster instead
// of an image file: the fresh image file is imported into pool rbd, mounted
// as rbd:rbd/NAME, and exported again for btrfs check.
std::string PosixRbdConf() {
  const char* c = std::getenv("UBTRFS_POSIX_RBD_CONF");
  return c ? c : "";
}

class FusePosix : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string r = ubtrfs_test::FuseUnavailableReason(); !r.empty()) GTEST_SKIP() << r;
    if (geteuid() != 0) GTEST_SKIP() << "needs root: the cases act as other users and change owners";
    ASSERT_EQ(s_.Make(), "");
    image_ = s_.img;
    if (const std::string conf = PosixRbdConf(); !conf.empty()) {
      const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
      rbd_name_ = std::string("posix-") + info->test_suite_name() + "-" + info->name() + "-" + std::to_string(getpid());
      auto r = ubtrfs_test::RunCommand({"rbd", "-c", conf, "import", "--no-progress", s_.img, "rbd/" + rbd_name_});
      ASSERT_TRUE(r.ok()) << r.Describe();
      image_ = "rbd:rbd/" + rbd_name_ + ":conf=" + conf;
    }
    // Other users must reach the mount point inside the (0700) scratch directory.
    ASSERT_EQ(chmod(s_.dir.path().c_str(), 0755), 0);
    std::string skip, error;
    if (!mount_.Start(image_, s_.mnt, s_.log, {"-o", "allow_other" + Options()}, &skip, &error)) {
      if (!skip.empty()) GTEST_SKIP() << skip;
      FAIL() << error;
    }
    mounted_ = true;
    umask(022);
    d_ = s_.mnt + "/t";
    ASSERT_EQ(mkdir(d_.c_str(), 0755), 0);
    ASSERT_EQ(chmod(d_.c_str(), 0777), 0);
  }
  void TearDown() override {
    if (!mounted_) return;
    std::string err;
    EXPECT_EQ(mount_.Unmount(&err), 0) << err << "\nlog: " << mount_.Log();
    EXPECT_EQ(CheckImage(), "");
    if (!rbd_name_.empty()) (void)ubtrfs_test::RunCommand({"rbd", "-c", PosixRbdConf(), "rm", "--no-progress", "rbd/" + rbd_name_});
  }
  // btrfs check of the image as it is now ("" when clean).
  std::string CheckImage() {
    if (rbd_name_.empty()) return BtrfsCheck(s_.img);
    const std::string out = s_.img + ".export";
    ::unlink(out.c_str());
    auto r = ubtrfs_test::RunCommand({"rbd", "-c", PosixRbdConf(), "export", "--no-progress", "rbd/" + rbd_name_, out});
    if (!r.ok()) return "rbd export: " + r.Describe();
    std::string c = BtrfsCheck(out);
    ::unlink(out.c_str());
    return c;
  }
  virtual std::string Options() const { return ""; }
  std::string P(const std::string& rel) const { return d_ + "/" + rel; }
  // Kills the daemon (no unmount, no final commit) and opens the image as
  // it was left: only committed changes are in it.
  std::unique_ptr<ubtrfs::Filesystem> KillAndOpen() {
    EXPECT_EQ(kill(mount_.pid(), SIGKILL), 0);
    EXPECT_EQ(mount_.Wait(30), 128 + SIGKILL);
    mount_.Cleanup();  // the dead mount's entry
    mounted_ = false;
    EXPECT_EQ(CheckImage(), "");
    auto fs = ubtrfs::Filesystem::Open(image_);
    EXPECT_TRUE(fs.ok()) << fs.status().ToString();
    return fs.ok() ? std::move(*fs) : nullptr;
  }
  // The content of `path` in `fs`, or "<error>" with why.
  static std::string ReadBack(ubtrfs::Filesystem& fs, const std::string& path) {
    auto id = fs.Lookup(path);
    if (!id.ok()) return "<" + id.status().ToString() + ">";
    auto st = fs.GetStat(*id);
    if (!st.ok()) return "<" + st.status().ToString() + ">";
    std::string back(st->size, '\0');
    auto n = fs.Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(back.data()), back.size()));
    if (!n.ok()) return "<" + n.status().ToString() + ">";
    back.resize(*n);
    return back;
  }

  ubtrfs_test::Scratch s_;
  ubtrfs_test::MountProcess mount_;
  bool mounted_ = false;
  std::string d_;
  std::string image_;    // what is mounted: s_.img, or an rbd: spec
  std::string rbd_name_;  // the RBD image's name in pool rbd, if one
};

// Names up to 255 bytes work; longer ones fail with ENAMETOOLONG from every
// call that takes a name, lookups included.
TEST_F(FusePosix, NameLengthLimits) {
  const std::string ok = P(Name(255)), ok2 = P(Name(255, 'm')), ok3 = P(Name(255, 'o'));
  const std::string bad = P(Name(256));
  EXPECT_EQ(Errno(CreateFile(ok)), 0);
  EXPECT_EQ(Lstat(ok).st_size, 0);
  EXPECT_EQ(Errno(rename(ok.c_str(), ok2.c_str())), 0);
  EXPECT_EQ(Errno(link(ok2.c_str(), ok3.c_str())), 0);
  EXPECT_EQ(Errno(unlink(ok3.c_str())), 0);
  EXPECT_EQ(Errno(CreateFile(bad)), ENAMETOOLONG);
  EXPECT_EQ(Errno(mkdir(bad.c_str(), 0755)), ENAMETOOLONG);
  EXPECT_EQ(Errno(symlink("x", bad.c_str())), ENAMETOOLONG);
  EXPECT_EQ(Errno(mkfifo(bad.c_str(), 0644)), ENAMETOOLONG);
  EXPECT_EQ(Errno(link(ok2.c_str(), bad.c_str())), ENAMETOOLONG);
  EXPECT_EQ(Errno(rename(ok2.c_str(), bad.c_str())), ENAMETOOLONG);
  struct stat st;
  EXPECT_EQ(Errno(lstat(bad.c_str(), &st)), ENAMETOOLONG);
  EXPECT_EQ(Errno(unlink(bad.c_str())), ENAMETOOLONG);
  // A whole path longer than PATH_MAX.
  std::string deep = d_;
  while (deep.size() <= PATH_MAX) deep += "/" + Name(200);
  EXPECT_EQ(Errno(mkdir(deep.c_str(), 0755)), ENAMETOOLONG);
  // Symlink targets: up to PATH_MAX - 1 bytes are kept whole.
  const std::string target(PATH_MAX - 1, 't');
  ASSERT_EQ(Errno(symlink(target.c_str(), P("long").c_str())), 0);
  std::string back(PATH_MAX + 10, '\0');
  EXPECT_EQ(readlink(P("long").c_str(), back.data(), back.size()), static_cast<ssize_t>(target.size()));
  EXPECT_EQ(Lstat(P("long")).st_size, static_cast<off_t>(target.size()));
  EXPECT_EQ(Errno(symlink(std::string(PATH_MAX, 't').c_str(), P("toolong").c_str())), ENAMETOOLONG);
}

// Every call that changes a directory's entries updates its mtime and ctime;
// calls that change an inode update its ctime.
TEST_F(FusePosix, TimesUpdatedByEachCall) {
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("d2").c_str(), 0755), 0);
  ASSERT_EQ(CreateFile(P("d/keep")), 0);
  const timespec old[2] = {{1000, 0}, {1000, 0}};
  struct Case {
    const char* what;
    std::function<int()> op;
  };
  const std::vector<Case> dir_cases = {
      {"create", [&] { return CreateFile(P("d/f")); }},
      {"mkdir", [&] { return mkdir(P("d/sub").c_str(), 0755); }},
      {"symlink", [&] { return symlink("target", P("d/sl").c_str()); }},
      {"mkfifo", [&] { return mkfifo(P("d/fifo").c_str(), 0644); }},
      {"link", [&] { return link(P("d/keep").c_str(), P("d/hard").c_str()); }},
      {"unlink", [&] { return unlink(P("d/hard").c_str()); }},
      {"rmdir", [&] { return rmdir(P("d/sub").c_str()); }},
      {"rename within", [&] { return rename(P("d/f").c_str(), P("d/g").c_str()); }},
      {"rename out", [&] { return rename(P("d/g").c_str(), P("d2/g").c_str()); }},
  };
  for (const auto& c : dir_cases) {
    ASSERT_EQ(utimensat(AT_FDCWD, P("d").c_str(), old, 0), 0);
    const struct stat before = Lstat(P("d"));
    ASSERT_EQ(before.st_mtim.tv_sec, 1000);
    WaitForTheClockToPass(before.st_ctim);
    ASSERT_EQ(Errno(c.op()), 0) << c.what;
    const struct stat after = Lstat(P("d"));
    EXPECT_GT(after.st_mtim.tv_sec, 1000) << c.what << ": the directory's mtime";
    EXPECT_TRUE(TimeLess(before.st_ctim, after.st_ctim)) << c.what << ": the directory's ctime";
  }
  // The target directory of a rename changes too.
  const struct stat d2 = Lstat(P("d2"));
  EXPECT_GT(d2.st_mtim.tv_sec, 1000);

  const std::string f = P("d/keep");
  // Calls that change the inode: ctime moves; mtime only where the data or
  // the size changes (a rename moves the directories' mtimes, never the
  // renamed file's). Calls that change nothing move neither.
  enum class Times { kCtime, kBoth, kNone };
  struct InodeCase {
    const char* what;
    std::function<int()> op;
    Times times;
  };
  const std::vector<InodeCase> inode_cases = {
      {"chmod", [&] { return chmod(f.c_str(), 0600); }, Times::kCtime},
      {"chown", [&] { return chown(f.c_str(), kUserA, kGroupA); }, Times::kCtime},
      {"link", [&] { return link(f.c_str(), P("d/keep2").c_str()); }, Times::kCtime},
      {"unlink of a second name", [&] { return unlink(P("d/keep2").c_str()); }, Times::kCtime},
      {"rename", [&] { return rename(f.c_str(), P("d/keep3").c_str()) || rename(P("d/keep3").c_str(), f.c_str()); },
       Times::kCtime},
      {"rename to another directory", [&] { return rename(f.c_str(), P("d2/keep").c_str()) || rename(P("d2/keep").c_str(), f.c_str()); },
       Times::kCtime},
      {"truncate", [&] { return truncate(f.c_str(), 100); }, Times::kBoth},
      {"truncate to its size", [&] { return truncate(f.c_str(), 100); }, Times::kNone},
      {"setxattr", [&] { return setxattr(f.c_str(), "user.k", "v", 1, 0); }, Times::kCtime},
      {"removexattr", [&] { return removexattr(f.c_str(), "user.k"); }, Times::kCtime},
      {"removexattr of a missing name", [&] { return removexattr(f.c_str(), "user.k") == -1 && errno == ENODATA ? 0 : -1; },
       Times::kNone},
  };
  for (const auto& c : inode_cases) {
    // The mtime in the past, so that a change of it shows whatever the
    // clock's resolution; ctime compared after the clock has moved on.
    ASSERT_EQ(utimensat(AT_FDCWD, f.c_str(), old, 0), 0);
    const struct stat before = Lstat(f);
    WaitForTheClockToPass(before.st_ctim);
    ASSERT_EQ(Errno(c.op()), 0) << c.what;
    const struct stat after = Lstat(f);
    EXPECT_EQ(TimeLess(before.st_ctim, after.st_ctim), c.times != Times::kNone) << c.what << ": ctime";
    EXPECT_FALSE(TimeLess(after.st_ctim, before.st_ctim)) << c.what << ": ctime went back";
    EXPECT_EQ(after.st_mtim.tv_sec != 1000, c.times == Times::kBoth) << c.what << ": mtime";
  }
  {
    // utimensat stamps ctime (and sets the times asked for).
    const struct stat before = Lstat(f);
    WaitForTheClockToPass(before.st_ctim);
    const timespec later[2] = {{2000, 0}, {2000, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, f.c_str(), later, 0), 0);
    const struct stat after = Lstat(f);
    EXPECT_TRUE(TimeLess(before.st_ctim, after.st_ctim)) << "utimensat: ctime";
    EXPECT_EQ(after.st_mtim.tv_sec, 2000);
  }
  // write and truncate move mtime as well; a read does not.
  ASSERT_EQ(utimensat(AT_FDCWD, f.c_str(), old, 0), 0);
  int fd = open(f.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char buf[10];
  EXPECT_EQ(pread(fd, buf, sizeof buf, 0), 10);
  EXPECT_EQ(Lstat(f).st_mtim.tv_sec, 1000) << "a read moved mtime";
  ASSERT_EQ(pwrite(fd, "hello", 5, 3), 5);
  close(fd);
  EXPECT_GT(Lstat(f).st_mtim.tv_sec, 1000) << "write";
  ASSERT_EQ(utimensat(AT_FDCWD, f.c_str(), old, 0), 0);
  ASSERT_EQ(truncate(f.c_str(), 1), 0);
  EXPECT_GT(Lstat(f).st_mtim.tv_sec, 1000) << "truncate";
  // utimensat: explicit times are kept to the nanosecond; UTIME_OMIT keeps one.
  const timespec t[2] = {{123456789, 987654321}, {UTIME_OMIT, UTIME_OMIT}};
  const struct stat pre = Lstat(f);
  ASSERT_EQ(utimensat(AT_FDCWD, f.c_str(), t, 0), 0);
  const struct stat post = Lstat(f);
  EXPECT_EQ(post.st_atim.tv_sec, 123456789);
  EXPECT_EQ(post.st_atim.tv_nsec, 987654321);
  EXPECT_EQ(post.st_mtim.tv_sec, pre.st_mtim.tv_sec);
  EXPECT_EQ(post.st_mtim.tv_nsec, pre.st_mtim.tv_nsec);
}

// Mode bits decide who may read, write and search; only the owner (or root)
// may chmod; only root may give a file away; an owner may change the group
// only to one of their own groups.
TEST_F(FusePosix, PermissionsAndOwnership) {
  ASSERT_EQ(mkdir(P("priv").c_str(), 0700), 0);
  ASSERT_EQ(CreateFile(P("priv/f")), 0);
  ASSERT_EQ(CreateFile(P("ro"), 0644), 0);
  ASSERT_EQ(mkdir(P("shut").c_str(), 0755), 0);
  struct stat st;
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return stat(P("priv/f").c_str(), &st); }), EACCES) << "search permission";
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return open(P("ro").c_str(), O_RDONLY); }), 0);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return open(P("ro").c_str(), O_WRONLY); }), EACCES);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return CreateFile(P("shut/x")); }), EACCES) << "no write permission";
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return unlink(P("ro").c_str()); }), 0) << "t is 0777";
  ASSERT_EQ(CreateFile(P("ro"), 0644), 0);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return chmod(P("ro").c_str(), 0666); }), EPERM);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return truncate(P("ro").c_str(), 0); }), EACCES);

  ASSERT_EQ(chown(P("ro").c_str(), kUserA, kGroupA), 0);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return chmod(P("ro").c_str(), 0600); }), 0);
  EXPECT_EQ(Lstat(P("ro")).st_mode & 07777, 0600u);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return chown(P("ro").c_str(), kUserB, -1); }), EPERM);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return chown(P("ro").c_str(), -1, kGroupC); }), EPERM);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return chown(P("ro").c_str(), -1, kGroupB); }, {kGroupB}), 0);
  EXPECT_EQ(Lstat(P("ro")).st_gid, kGroupB);
  EXPECT_EQ(AsUser(kUserB, kGroupB, [&] { return open(P("ro").c_str(), O_RDONLY); }), EACCES) << "mode 0600";

  // A setgid bit set by an owner outside the file's group is dropped.
  ASSERT_EQ(chown(P("ro").c_str(), kUserA, kGroupC), 0);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return chmod(P("ro").c_str(), 02755); }), 0);
  EXPECT_EQ(Lstat(P("ro")).st_mode & 07777, 0755u);

  // Times: anyone with write permission may set "now", only the owner
  // explicit times.
  ASSERT_EQ(chmod(P("ro").c_str(), 0666), 0);
  const timespec now[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}}, explicit_t[2] = {{5, 0}, {5, 0}};
  EXPECT_EQ(AsUser(kUserB, kGroupB, [&] { return utimensat(AT_FDCWD, P("ro").c_str(), now, 0); }), 0);
  EXPECT_EQ(AsUser(kUserB, kGroupB, [&] { return utimensat(AT_FDCWD, P("ro").c_str(), explicit_t, 0); }), EPERM);
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return utimensat(AT_FDCWD, P("ro").c_str(), explicit_t, 0); }), 0);
  EXPECT_EQ(Lstat(P("ro")).st_mtim.tv_sec, 5);
}

// setuid and setgid bits are cleared by chown (by anyone) and by a write
// from a user other than root.
TEST_F(FusePosix, SetuidClearedByChownAndWrite) {
  ASSERT_EQ(CreateFile(P("f"), 0644), 0);
  ASSERT_EQ(chmod(P("f").c_str(), 06755), 0);
  ASSERT_EQ(chown(P("f").c_str(), 0, 0), 0);
  EXPECT_EQ(Lstat(P("f")).st_mode & 07777, 0755u) << "chown by root, same owner";
  ASSERT_EQ(chmod(P("f").c_str(), 06777), 0);
  ASSERT_EQ(chown(P("f").c_str(), kUserA, kGroupA), 0);
  EXPECT_EQ(Lstat(P("f")).st_mode & 07777, 0777u);
  ASSERT_EQ(chmod(P("f").c_str(), 06777), 0);
  EXPECT_EQ(AsUser(kUserB, kGroupB, [&] {
              const int fd = open(P("f").c_str(), O_WRONLY);
              if (fd < 0) return -1;
              const ssize_t n = write(fd, "x", 1);
              close(fd);
              return n == 1 ? 0 : -1;
            }),
            0);
  EXPECT_EQ(Lstat(P("f")).st_mode & 07777, 0777u) << "write by another user";
  // A directory keeps its setgid bit through chown.
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  ASSERT_EQ(chmod(P("d").c_str(), 02755), 0);
  ASSERT_EQ(chown(P("d").c_str(), kUserA, kGroupA), 0);
  EXPECT_EQ(Lstat(P("d")).st_mode & 07777, 02755u);
}

// In a sticky directory only the owner of an entry, the owner of the
// directory and root may remove or rename it.
TEST_F(FusePosix, StickyDirectory) {
  ASSERT_EQ(mkdir(P("tmp").c_str(), 0777), 0);
  ASSERT_EQ(chmod(P("tmp").c_str(), 01777), 0);
  ASSERT_EQ(chown(P("tmp").c_str(), kUserB, kGroupB), 0);
  for (const char* n : {"a1", "a2", "a3", "a4"}) {
    ASSERT_EQ(AsUser(kUserA, kGroupA, [&] { return CreateFile(P(std::string("tmp/") + n)); }), 0);
  }
  ASSERT_EQ(AsUser(kUserA, kGroupA, [&] { return mkdir(P("tmp/ad").c_str(), 0777); }), 0);
  const uid_t other = kUserB + 10;
  EXPECT_EQ(AsUser(other, other, [&] { return unlink(P("tmp/a1").c_str()); }), EPERM);
  EXPECT_EQ(AsUser(other, other, [&] { return rename(P("tmp/a1").c_str(), P("tmp/z").c_str()); }), EPERM);
  EXPECT_EQ(AsUser(other, other, [&] { return rmdir(P("tmp/ad").c_str()); }), EPERM);
  ASSERT_EQ(AsUser(other, other, [&] { return CreateFile(P("tmp/o")); }), 0);
  EXPECT_EQ(AsUser(other, other, [&] { return rename(P("tmp/o").c_str(), P("tmp/a2").c_str()); }), EPERM)
      << "replacing another user's file";
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return unlink(P("tmp/a1").c_str()); }), 0) << "the entry's owner";
  EXPECT_EQ(AsUser(kUserB, kGroupB, [&] { return unlink(P("tmp/a2").c_str()); }), 0) << "the directory's owner";
  EXPECT_EQ(unlink(P("tmp/a3").c_str()), 0) << "root";
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return rmdir(P("tmp/ad").c_str()); }), 0);
  struct stat st;
  EXPECT_EQ(Errno(lstat(P("tmp/a4").c_str(), &st)), 0);
}

// A setgid directory hands its group to new entries and its setgid bit to
// new subdirectories.
TEST_F(FusePosix, SetgidDirectoryInheritance) {
  ASSERT_EQ(mkdir(P("g").c_str(), 0777), 0);
  ASSERT_EQ(chown(P("g").c_str(), 0, kGroupC), 0);
  ASSERT_EQ(chmod(P("g").c_str(), 02777), 0);
  ASSERT_EQ(AsUser(kUserA, kGroupA, [&] { return CreateFile(P("g/f")); }), 0);
  ASSERT_EQ(AsUser(kUserA, kGroupA, [&] { return mkdir(P("g/sub").c_str(), 0755); }), 0);
  ASSERT_EQ(AsUser(kUserA, kGroupA, [&] { return symlink("x", P("g/sl").c_str()); }), 0);
  ASSERT_EQ(AsUser(kUserA, kGroupA, [&] { return mkfifo(P("g/fifo").c_str(), 0644); }), 0);
  for (const char* n : {"g/f", "g/sub", "g/sl", "g/fifo"}) {
    const struct stat st = Lstat(P(n));
    EXPECT_EQ(st.st_uid, kUserA) << n;
    EXPECT_EQ(st.st_gid, kGroupC) << n;
  }
  EXPECT_EQ(Lstat(P("g/sub")).st_mode & 07777, 02755u);
  EXPECT_EQ(Lstat(P("g/f")).st_mode & 07777, 0644u);
  // Outside it: the creator's group.
  ASSERT_EQ(AsUser(kUserA, kGroupA, [&] { return CreateFile(P("plain")); }), 0);
  EXPECT_EQ(Lstat(P("plain")).st_gid, kGroupA);
}

// Link counts: hard links count, an open file unlinked reads on with
// st_nlink 0, directories show 1 as on btrfs.
TEST_F(FusePosix, LinkCounts) {
  ASSERT_EQ(CreateFile(P("f")), 0);
  ASSERT_EQ(link(P("f").c_str(), P("g").c_str()), 0);
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  ASSERT_EQ(link(P("f").c_str(), P("d/h").c_str()), 0);
  EXPECT_EQ(Lstat(P("f")).st_nlink, 3u);
  EXPECT_EQ(Lstat(P("g")).st_ino, Lstat(P("f")).st_ino);
  ASSERT_EQ(unlink(P("g").c_str()), 0);
  EXPECT_EQ(Lstat(P("d/h")).st_nlink, 2u);
  EXPECT_EQ(Errno(link(P("d").c_str(), P("dl").c_str())), EPERM) << "hard link to a directory";
  EXPECT_EQ(Lstat(P("d")).st_nlink, 1u) << "btrfs directories report one link";

  const int fd = open(P("f").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "data", 4, 0), 4);
  ASSERT_EQ(unlink(P("f").c_str()), 0);
  ASSERT_EQ(unlink(P("d/h").c_str()), 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  char buf[4];
  EXPECT_EQ(pread(fd, buf, 4, 0), 4);
  EXPECT_EQ(std::string(buf, 4), "data");
  EXPECT_EQ(pwrite(fd, "more", 4, 4), 4);
  close(fd);
  // Nothing of it is left to see.
  EXPECT_EQ(Errno(lstat(P("f").c_str(), &st)), ENOENT);
}

// rename(2) and renameat2(2) rules.
TEST_F(FusePosix, RenameRules) {
  ASSERT_EQ(mkdir(P("a").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("a/b").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("full").c_str(), 0755), 0);
  ASSERT_EQ(CreateFile(P("full/x")), 0);
  ASSERT_EQ(mkdir(P("empty").c_str(), 0755), 0);
  ASSERT_EQ(CreateFile(P("f")), 0);
  ASSERT_EQ(CreateFile(P("f2")), 0);
  EXPECT_EQ(Errno(rename(P("a").c_str(), P("a/b/c").c_str())), EINVAL) << "into its own subdirectory";
  EXPECT_EQ(Errno(rename(P("a").c_str(), P("full").c_str())), ENOTEMPTY);
  EXPECT_EQ(Errno(rename(P("f").c_str(), P("empty").c_str())), EISDIR);
  EXPECT_EQ(Errno(rename(P("empty").c_str(), P("f").c_str())), ENOTDIR);
  EXPECT_EQ(Errno(rename(P("nothere").c_str(), P("z").c_str())), ENOENT);
  const ino_t f_ino = Lstat(P("f")).st_ino;
  EXPECT_EQ(Errno(rename(P("f").c_str(), P("f").c_str())), 0) << "onto itself";
  EXPECT_EQ(Lstat(P("f")).st_ino, f_ino);
  // A directory over an empty one; its ".." follows.
  EXPECT_EQ(Errno(rename(P("a/b").c_str(), P("empty").c_str())), 0);
  EXPECT_EQ(Lstat(P("empty/..")).st_ino, Lstat(d_).st_ino);
  // A hard link over its own other name: both stay.
  ASSERT_EQ(link(P("f").c_str(), P("fl").c_str()), 0);
  EXPECT_EQ(Errno(rename(P("f").c_str(), P("fl").c_str())), 0);
  struct stat st;
  EXPECT_EQ(Errno(lstat(P("f").c_str(), &st)), 0);
  // renameat2 flags.
  EXPECT_EQ(Errno(renameat2(AT_FDCWD, P("f").c_str(), AT_FDCWD, P("f2").c_str(), RENAME_NOREPLACE)), EEXIST);
  const ino_t f2_ino = Lstat(P("f2")).st_ino;
  EXPECT_EQ(Errno(renameat2(AT_FDCWD, P("f").c_str(), AT_FDCWD, P("f2").c_str(), RENAME_EXCHANGE)), 0);
  EXPECT_EQ(Lstat(P("f")).st_ino, f2_ino);
  EXPECT_EQ(Lstat(P("f2")).st_ino, f_ino);
  EXPECT_EQ(Errno(renameat2(AT_FDCWD, P("f").c_str(), AT_FDCWD, P("full").c_str(), RENAME_EXCHANGE)), 0)
      << "a file and a directory trade places";
  EXPECT_TRUE(S_ISDIR(Lstat(P("f")).st_mode));
  EXPECT_EQ(Lstat(P("f/..")).st_ino, Lstat(d_).st_ino);
  EXPECT_EQ(Errno(renameat2(AT_FDCWD, P("f").c_str(), AT_FDCWD, P("zz").c_str(), RENAME_EXCHANGE)), ENOENT);
  EXPECT_EQ(Errno(renameat2(AT_FDCWD, P("f").c_str(), AT_FDCWD, P("zz").c_str(), RENAME_NOREPLACE | RENAME_EXCHANGE)),
            EINVAL);
}

// unlink, rmdir, open and friends on the wrong kind of file.
TEST_F(FusePosix, ErrorsForTheWrongFileType) {
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  ASSERT_EQ(CreateFile(P("d/f")), 0);
  ASSERT_EQ(symlink("d", P("sl").c_str()), 0);
  ASSERT_EQ(symlink("loop2", P("loop1").c_str()), 0);
  ASSERT_EQ(symlink("loop1", P("loop2").c_str()), 0);
  EXPECT_EQ(Errno(unlink(P("d").c_str())), EISDIR);
  EXPECT_EQ(Errno(rmdir(P("d").c_str())), ENOTEMPTY);
  EXPECT_EQ(Errno(rmdir(P("d/f").c_str())), ENOTDIR);
  EXPECT_EQ(Errno(rmdir(P("d/.").c_str())), EINVAL);
  EXPECT_EQ(Errno(rmdir(P("sl").c_str())), ENOTDIR);
  EXPECT_EQ(Errno(mkdir(P("d").c_str(), 0755)), EEXIST);
  EXPECT_EQ(Errno(mkdir(P("sl").c_str(), 0755)), EEXIST);
  EXPECT_EQ(OpenErr(P("d"), O_WRONLY), EISDIR);
  EXPECT_EQ(OpenErr(P("d/f"), O_RDONLY | O_DIRECTORY), ENOTDIR);
  EXPECT_EQ(OpenErr(P("d/f"), O_CREAT | O_EXCL | O_WRONLY), EEXIST);
  EXPECT_EQ(OpenErr(P("d/f/x"), O_RDONLY), ENOTDIR);
  EXPECT_EQ(OpenErr(P("loop1"), O_RDONLY), ELOOP);
  EXPECT_EQ(OpenErr(P("sl"), O_RDONLY | O_NOFOLLOW), ELOOP);
  EXPECT_EQ(Errno(truncate(P("d").c_str(), 0)), EISDIR);
  EXPECT_EQ(Errno(truncate(P("d/f").c_str(), -1)), EINVAL);
  const int fd = open(P("d/f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Errno(ftruncate(fd, 0)), EINVAL) << "ftruncate on a read-only descriptor";
  close(fd);
  EXPECT_EQ(Errno(rmdir(P("d/f").c_str())), ENOTDIR);
  ASSERT_EQ(unlink(P("d/f").c_str()), 0);
  EXPECT_EQ(Errno(rmdir(P("d").c_str())), 0);
}

// Special files keep their type, mode and device number.
TEST_F(FusePosix, SpecialFiles) {
  ASSERT_EQ(mkfifo(P("fifo").c_str(), 0640), 0);
  ASSERT_EQ(mknod(P("chr").c_str(), S_IFCHR | 0600, makedev(1, 7)), 0);
  ASSERT_EQ(mknod(P("blk").c_str(), S_IFBLK | 0666, makedev(259, 65539)), 0);
  ASSERT_EQ(mknod(P("sock").c_str(), S_IFSOCK | 0644, 0), 0);
  EXPECT_EQ(Lstat(P("fifo")).st_mode, S_IFIFO | 0640u);
  const struct stat c = Lstat(P("chr")), b = Lstat(P("blk"));
  EXPECT_EQ(c.st_mode, S_IFCHR | 0600u);
  EXPECT_EQ(c.st_rdev, makedev(1, 7));
  EXPECT_EQ(b.st_mode, S_IFBLK | 0644u) << "umask 022";
  EXPECT_EQ(b.st_rdev, makedev(259, 65539));
  EXPECT_TRUE(S_ISSOCK(Lstat(P("sock")).st_mode));
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return mknod(P("chr2").c_str(), S_IFCHR | 0600, makedev(1, 3)); }), EPERM)
      << "device nodes are root's";
  // A fifo on the mount works as a fifo.
  const pid_t pid = fork();
  if (pid == 0) {
    const int w = open(P("fifo").c_str(), O_WRONLY);
    _exit(w >= 0 && write(w, "ping", 4) == 4 ? 0 : 1);
  }
  const int r = open(P("fifo").c_str(), O_RDONLY);
  ASSERT_GE(r, 0);
  char buf[4] = {};
  EXPECT_EQ(read(r, buf, 4), 4);
  close(r);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(std::string(buf, 4), "ping");
}

// Extended attributes and POSIX ACLs: an access ACL sets the mode's bits, a
// chmod rewrites the ACL, a default ACL is inherited.
TEST_F(FusePosix, XattrsAndAcls) {
  ASSERT_EQ(CreateFile(P("f")), 0);
  EXPECT_EQ(Errno(setxattr(P("f").c_str(), "user.a", "1", 1, XATTR_REPLACE)), ENODATA);
  EXPECT_EQ(Errno(setxattr(P("f").c_str(), "user.a", "1", 1, XATTR_CREATE)), 0);
  EXPECT_EQ(Errno(setxattr(P("f").c_str(), "user.a", "2", 1, XATTR_CREATE)), EEXIST);
  EXPECT_EQ(Errno(setxattr(P("f").c_str(), "user.a", "22", 2, XATTR_REPLACE)), 0);
  char v[16];
  EXPECT_EQ(getxattr(P("f").c_str(), "user.a", v, sizeof v), 2);
  EXPECT_EQ(std::string(v, 2), "22");
  EXPECT_EQ(Errno(getxattr(P("f").c_str(), "user.a", v, 1)), ERANGE);
  EXPECT_EQ(Errno(getxattr(P("f").c_str(), "user.none", v, sizeof v)), ENODATA);
  EXPECT_EQ(Errno(setxattr(P("f").c_str(), ("user." + Name(251)).c_str(), "x", 1, 0)), ERANGE)
      << "names over 255 bytes";
  EXPECT_EQ(AsUser(kUserA, kGroupA, [&] { return setxattr(P("f").c_str(), "user.b", "1", 1, 0); }), EACCES);
  EXPECT_EQ(Errno(removexattr(P("f").c_str(), "user.a")), 0);
  EXPECT_EQ(Errno(removexattr(P("f").c_str(), "user.a")), ENODATA);

  // Access ACL: user A gets rw, the mask rw, so the group bits read rw.
  const std::string acl = AclValue({{kUserObj, 6, kUndefinedId},
                                    {kUser, 6, kUserA},
                                    {kGroupObj, 4, kUndefinedId},
                                    {kMask, 6, kUndefinedId},
                                    {kOther, 0, kUndefinedId}});
  ASSERT_EQ(Errno(setxattr(P("f").c_str(), "system.posix_acl_access", acl.data(), acl.size(), 0)), 0);
  EXPECT_EQ(Lstat(P("f")).st_mode & 0777, 0660u);
  ASSERT_EQ(chmod(P("f").c_str(), 0640), 0);
  std::string back(256, '\0');
  const ssize_t n = getxattr(P("f").c_str(), "system.posix_acl_access", back.data(), back.size());
  ASSERT_GT(n, 0);
  back.resize(static_cast<size_t>(n));
  EXPECT_EQ(back, AclValue({{kUserObj, 6, kUndefinedId},
                            {kUser, 6, kUserA},
                            {kGroupObj, 4, kUndefinedId},
                            {kMask, 4, kUndefinedId},
                            {kOther, 0, kUndefinedId}}))
      << "chmod sets the mask from the group bits";

  // Default ACL on a directory: new files get it as their access ACL (mode
  // masked by the create mode), new directories get both.
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  const std::string def = AclValue({{kUserObj, 7, kUndefinedId},
                                    {kUser, 7, kUserA},
                                    {kGroupObj, 5, kUndefinedId},
                                    {kMask, 7, kUndefinedId},
                                    {kOther, 1, kUndefinedId}});
  // A create first, so the mount has seen d without a default ACL (it
  // remembers that) before one is set.
  ASSERT_EQ(CreateFile(P("d/before"), 0640), 0);
  EXPECT_EQ(Errno(getxattr(P("d/before").c_str(), "system.posix_acl_access", nullptr, 0)), ENODATA);
  ASSERT_EQ(Errno(setxattr(P("d").c_str(), "system.posix_acl_default", def.data(), def.size(), 0)), 0);
  EXPECT_EQ(Errno(setxattr(P("f").c_str(), "system.posix_acl_default", def.data(), def.size(), 0)), EACCES)
      << "default ACLs are for directories";
  ASSERT_EQ(CreateFile(P("d/new"), 0640), 0);
  EXPECT_EQ(Lstat(P("d/new")).st_mode & 0777, 0640u);
  EXPECT_GT(getxattr(P("d/new").c_str(), "system.posix_acl_access", nullptr, 0), 0);
  EXPECT_EQ(Errno(getxattr(P("d/new").c_str(), "system.posix_acl_default", nullptr, 0)), ENODATA);
  ASSERT_EQ(mkdir(P("d/sub").c_str(), 0777), 0);
  EXPECT_EQ(getxattr(P("d/sub").c_str(), "system.posix_acl_default", nullptr, 0), static_cast<ssize_t>(def.size()));
  EXPECT_EQ(Lstat(P("d/sub")).st_mode & 0777, 0771u) << "a default ACL, not the umask (022), decides";
  ASSERT_EQ(mkdir(P("plain").c_str(), 0777), 0);
  EXPECT_EQ(Lstat(P("plain")).st_mode & 0777, 0755u) << "no default ACL: the umask applies";
  ASSERT_EQ(CreateFile(P("plainf"), 0666), 0);
  EXPECT_EQ(Lstat(P("plainf")).st_mode & 0777, 0644u);
  ASSERT_EQ(symlink("x", P("sl").c_str()), 0);
  EXPECT_EQ(Lstat(P("sl")).st_mode & 0777, 0777u) << "symlinks ignore the umask";
}

// lseek SEEK_DATA / SEEK_HOLE see the holes, copy_file_range copies.
TEST_F(FusePosix, SeekDataHoleAndCopyFileRange) {
  const int fd = open(P("sparse").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  const std::string a(4096, 'a'), b(8192, 'b');
  ASSERT_EQ(pwrite(fd, a.data(), a.size(), 0), 4096);
  ASSERT_EQ(pwrite(fd, b.data(), b.size(), 1 << 20), 8192);
  ASSERT_EQ(ftruncate(fd, 3 << 20), 0);
  EXPECT_EQ(lseek(fd, 0, SEEK_DATA), 0);
  EXPECT_EQ(lseek(fd, 0, SEEK_HOLE), 4096);
  EXPECT_EQ(lseek(fd, 4096, SEEK_DATA), 1 << 20);
  EXPECT_EQ(lseek(fd, (1 << 20) + 100, SEEK_HOLE), (1 << 20) + 8192);
  EXPECT_EQ(Errno(lseek(fd, (1 << 20) + 8192, SEEK_DATA)), ENXIO) << "only a hole follows";
  EXPECT_EQ(lseek(fd, (3 << 20) - 1, SEEK_HOLE), (3 << 20) - 1);
  EXPECT_EQ(Errno(lseek(fd, 3 << 20, SEEK_HOLE)), ENXIO) << "at the end";
  // Preallocated space reads as zeros and counts as a hole, as on kernel
  // btrfs; data written into it is data.
  ASSERT_EQ(fallocate(fd, 0, 2 << 20, 65536), 0) << strerror(errno);
  EXPECT_EQ(Errno(lseek(fd, (1 << 20) + 8192, SEEK_DATA)), ENXIO) << "prealloc is not data";
  ASSERT_EQ(pwrite(fd, "z", 1, (2 << 20) + 4096), 1);
  EXPECT_EQ(lseek(fd, (1 << 20) + 8192, SEEK_DATA), (2 << 20) + 4096);
  EXPECT_EQ(lseek(fd, (2 << 20) + 4096, SEEK_HOLE), (2 << 20) + 8192);

  const int out = open(P("copy").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(out, 0);
  loff_t in_off = 0, out_off = 0;
  size_t total = 0;
  for (;;) {
    const ssize_t n = copy_file_range(fd, &in_off, out, &out_off, (3 << 20) - total, 0);
    ASSERT_GE(n, 0) << strerror(errno);
    if (n == 0) break;
    total += static_cast<size_t>(n);
  }
  EXPECT_EQ(total, 3u << 20);
  std::string got(b.size(), '\0');
  EXPECT_EQ(pread(out, got.data(), got.size(), 1 << 20), static_cast<ssize_t>(b.size()));
  EXPECT_EQ(got, b);
  EXPECT_EQ(lseek(out, 4096, SEEK_DATA), 1 << 20) << "the copy keeps the hole";
  // Into the middle of an existing file, from an offset.
  loff_t from = 100, to = 10;
  ASSERT_EQ(copy_file_range(fd, &from, out, &to, 50, 0), 50);
  char c[60];
  ASSERT_EQ(pread(out, c, 60, 0), 60);
  EXPECT_EQ(std::string(c, 60), std::string(60, 'a'));
  close(out);
  close(fd);
}

// fsync and fdatasync make data durable before they return: a mount killed
// right after them (no unmount, no final commit) has the data in its image.
TEST_F(FusePosix, FsyncIsDurableAcrossAKill) {
  const std::string d1(100000, 'q'), d2(3000, 'r');
  int fd = open(P("synced").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, d1.data(), d1.size()), static_cast<ssize_t>(d1.size()));
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
  fd = open(P("datasynced").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, d2.data(), d2.size()), static_cast<ssize_t>(d2.size()));
  ASSERT_EQ(fdatasync(fd), 0);
  close(fd);
  auto fs = KillAndOpen();
  ASSERT_TRUE(fs);
  for (const auto& [name, data] : {std::pair{"/t/synced", &d1}, std::pair{"/t/datasynced", &d2}}) {
    const std::string back = ReadBack(*fs, name);
    EXPECT_TRUE(back == *data) << name << ": " << back.size() << " bytes read back, " << data->size() << " written";
  }
}

// sync(1) and syncfs(2) send nothing to a FUSE server (Linux 6.18 sends
// FUSE_SYNCFS only to virtiofs), so `sync MOUNTPOINT` -- an fsync of the
// directory, FSYNCDIR -- is what commits from a shell: every change that
// reached the daemon before it, of any file, is in the image after a kill.
TEST_F(FusePosix, FsyncOfTheMountPointCommitsEveryChange) {
  const std::string data(200000, 'w');
  {
    std::ofstream out(P("unsynced"), std::ios::binary);
    out << data;
  }
  ASSERT_EQ(mkdir(P("dir").c_str(), 0755), 0);
  ASSERT_EQ(rename(P("unsynced").c_str(), P("dir/moved").c_str()), 0);
  const int dfd = open(s_.mnt.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dfd, 0);
  EXPECT_EQ(syncfs(dfd), 0);
  EXPECT_EQ(fsync(dfd), 0);
  close(dfd);
  auto fs = KillAndOpen();
  ASSERT_TRUE(fs);
  const std::string back = ReadBack(*fs, "/t/dir/moved");
  EXPECT_TRUE(back == data) << back.size() << " bytes read back: " << back.substr(0, 80);
}

// The periodic commit bounds what a kill loses: with commit=1, a change
// made two seconds before the kill is in the image.
class FusePosixCommit1 : public FusePosix {
 protected:
  std::string Options() const override { return ",commit=1"; }
};

TEST_F(FusePosixCommit1, PeriodicCommitBoundsTheLoss) {
  ASSERT_EQ(mkdir(P("kept").c_str(), 0755), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto fs = KillAndOpen();
  ASSERT_TRUE(fs);
  EXPECT_TRUE(fs->Lookup("/t/kept").ok());
}

// The same POSIX cases hold with the kernel's write-back cache.
class FusePosixWriteback : public FusePosix {
 protected:
  std::string Options() const override { return ",writeback_cache"; }
};

// With the write-back cache a file's written pages may still be in the
// kernel: sync(2) sends them (WRITE, and SETATTR with the times), an fsync
// of the mount point then commits them.
TEST_F(FusePosixWriteback, SyncThenFsyncOfTheMountPointIsDurable) {
  const std::string data(300000, 'c');
  {
    std::ofstream out(P("cached"), std::ios::binary);
    out << data;
  }
  sync();
  const int dfd = open(s_.mnt.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dfd, 0);
  EXPECT_EQ(fsync(dfd), 0);
  close(dfd);
  auto fs = KillAndOpen();
  ASSERT_TRUE(fs);
  const std::string back = ReadBack(*fs, "/t/cached");
  EXPECT_TRUE(back == data) << back.size() << " bytes read back: " << back.substr(0, 80);
}

TEST_F(FusePosixWriteback, TimesUpdatedByEachCall) {
  // Re-run two of the cases most exposed to the cache.
  ASSERT_EQ(CreateFile(P("f")), 0);
  const timespec old[2] = {{1000, 0}, {1000, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, P("f").c_str(), old, 0), 0);
  int fd = open(P("f").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "hello", 5, 3), 5);
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
  const struct stat st = Lstat(P("f"));
  EXPECT_GT(st.st_mtim.tv_sec, 1000);
  EXPECT_EQ(st.st_size, 8);
}

// The kernel does not write its cached pages back before asking us about
// holes, so with the write-back cache the mount declines the question and
// the kernel's answer (all data up to the size) stands: never a hole where
// data was written.
TEST_F(FusePosixWriteback, SeekDataHoleSeesCachedData) {
  const int fd = open(P("sparse").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  const std::string b(8192, 'b');
  ASSERT_EQ(pwrite(fd, b.data(), b.size(), 1 << 20), 8192);
  const off_t data = lseek(fd, 0, SEEK_DATA);
  EXPECT_LE(data, 1 << 20) << strerror(errno);
  EXPECT_GE(data, 0);
  EXPECT_EQ(lseek(fd, 1 << 20, SEEK_HOLE), (1 << 20) + 8192);
  close(fd);
}

// Bad mount options are refused with exit code 2 and a message naming the
// option, before anything is mounted.
TEST(FusePosixOptions, BadOptionsAreRefusedClearly) {
  SKIP_IF_NO_FUSE();
  ubtrfs_test::Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"commit=soon", "bad commit interval"},  {"commit", "needs a value"},
      {"attr_timeout=-1", "bad attr_timeout"}, {"entry_timeout=x", "bad entry_timeout"},
      {"threads=0", "bad thread count"},       {"no_such_option", "no_such_option"},
      {"allow_other,nodefault_permissions", "every user"},
  };
  for (const auto& [opt, msg] : cases) {
    auto r = ubtrfs_test::RunCommand({UBTRFS_CLI_PATH, "mount", "-f", s.img, s.mnt, "-o", opt});
    EXPECT_NE(r.exit_code, 0) << opt;
    EXPECT_NE(r.err.find(msg), std::string::npos) << opt << ": " << r.Describe();
    EXPECT_FALSE(ubtrfs_test::IsUbtrfsMount(s.mnt)) << opt;
  }
  // Good ones mount (timeouts of 0 included: nothing cached by the kernel).
  ubtrfs_test::MountProcess m;
  START_MOUNT(m, s, "-o", "attr_timeout=0,entry_timeout=0,negative_timeout=0,commit=7,threads=2,noreaddirplus");
  EXPECT_EQ(CreateFile(s.mnt + "/f"), 0);
  struct stat st;
  EXPECT_EQ(stat((s.mnt + "/f").c_str(), &st), 0);
  std::string err;
  EXPECT_EQ(m.Unmount(&err), 0) << err;
  EXPECT_EQ(BtrfsCheck(s.img), "");
}

// A read-only mount refuses every change with EROFS.
TEST(FusePosixReadOnly, ChangesFailWithErofs) {
  SKIP_IF_NO_FUSE();
  ubtrfs_test::Scratch s;
  ASSERT_EQ(s.Make(), "");
  {
    ubtrfs_test::MountProcess rw;
    START_MOUNT(rw, s);
    ASSERT_EQ(CreateFile(s.mnt + "/f"), 0);
    std::string err;
    ASSERT_EQ(rw.Unmount(&err), 0) << err;
  }
  ubtrfs_test::MountProcess ro;
  START_MOUNT(ro, s, "-o", "ro");
  const std::string f = s.mnt + "/f";
  EXPECT_EQ(Errno(CreateFile(s.mnt + "/g")), EROFS);
  EXPECT_EQ(Errno(mkdir((s.mnt + "/d").c_str(), 0755)), EROFS);
  EXPECT_EQ(OpenErr(f, O_WRONLY), EROFS);
  EXPECT_EQ(Errno(chmod(f.c_str(), 0600)), EROFS);
  EXPECT_EQ(Errno(unlink(f.c_str())), EROFS);
  EXPECT_EQ(Errno(setxattr(f.c_str(), "user.x", "1", 1, 0)), EROFS);
  EXPECT_EQ(OpenErr(f, O_RDONLY), 0);
  std::string err;
  EXPECT_EQ(ro.Unmount(&err), 0) << err;
  EXPECT_EQ(BtrfsCheck(s.img), "");
}

}  // namespace
