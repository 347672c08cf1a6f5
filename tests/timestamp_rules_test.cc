// Which calls change which mtimes and ctimes, with the kernel's btrfs as the
// oracle: every call runs on a loop-mounted btrfs and through libubtrfs on an
// image of its own, on the same tree, and for every inode it may touch the
// two must agree on whether mtime changed and whether ctime changed.
//
// Before each call every watched inode gets old times on both sides (on the
// kernel's side the ctime then is "now"; the call waits until the coarse
// clock, the kernel's current_time(), has moved past it, so a ctime the
// kernel leaves alone shows as unchanged). Inodes are followed by an O_PATH
// descriptor (kernel) and an InodeId (library), so a rename does not lose
// them.
//
// The host model of the other suites is ext4 or tmpfs, which keep a few
// rules of their own (truncate(2) to the size a file has stamps both times
// on ext4, on btrfs neither); this test is where the btrfs rules are pinned.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <thread>

#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

bool Same(const timespec& a, const timespec& b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }
bool Same(const Time& a, const Time& b) { return a.sec == b.sec && a.nsec == b.nsec; }
std::span<const uint8_t> Bytes(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

class TimestampRules : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
    std::string why;
    if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "no kernel btrfs to compare with: " << why;
    kimg_ = dir_.Sub("kernel.img");
    uimg_ = dir_.Sub("ubtrfs.img");
    mnt_ = dir_.Sub("mnt");
    ASSERT_EQ(mkdir(mnt_.c_str(), 0755), 0);
    for (const auto& img : {kimg_, uimg_}) {
      ASSERT_TRUE(RunCommand({"truncate", "-s", "256M", img}).ok());
      auto r = RunCommand({"mkfs.btrfs", "-q", "-f", img});
      ASSERT_TRUE(r.ok()) << r.Describe();
    }
    ASSERT_EQ(loop_.Mount(kimg_, mnt_), "");
    OpenOptions o;
    o.writable = true;
    auto fs = Filesystem::Open(uimg_, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(*fs);
  }
  void TearDown() override {
    fs_.reset();
    if (loop_.mounted()) {
      EXPECT_EQ(loop_.Unmount(), "");
    }
  }

  std::string K(const std::string& rel) const { return rel.empty() ? mnt_ : mnt_ + "/" + rel; }
  InodeId U(const std::string& rel) {
    auto id = fs_->Lookup("/" + rel);
    EXPECT_TRUE(id.ok()) << rel << ": " << id.status().ToString();
    return id.ok() ? *id : InodeId{};
  }
  InodeId UParent(const std::string& rel) {
    const auto slash = rel.rfind('/');
    return U(slash == std::string::npos ? "" : rel.substr(0, slash));
  }
  static std::string Name(const std::string& rel) {
    const auto slash = rel.rfind('/');
    return slash == std::string::npos ? rel : rel.substr(slash + 1);
  }

  // One call on both sides, `watch` the paths (before the call) whose inodes
  // it may touch. The outcomes (errno) must agree, and so must the times.
  void Call(const std::string& what, const std::vector<std::string>& watch, const std::function<int()>& kernel,
            const std::function<Status()>& library) {
    struct Watched {
      std::string rel;
      int fd;
      struct stat k;
      InodeId id;
      Stat u;
    };
    std::vector<Watched> w;
    for (const auto& rel : watch) {
      ++clock_;
      const timespec old{1400000000 + clock_, clock_ * 1000};
      const timespec ts[2] = {old, old};
      ASSERT_EQ(utimensat(AT_FDCWD, K(rel).c_str(), ts, AT_SYMLINK_NOFOLLOW), 0) << rel << ": " << strerror(errno);
      AttrChange c;
      c.atime = c.mtime = c.ctime = Time{old.tv_sec, static_cast<uint32_t>(old.tv_nsec)};
      const InodeId id = U(rel);
      ASSERT_TRUE(fs_->SetAttr(id, c).ok()) << rel;
      Watched x{rel, open(K(rel).c_str(), O_PATH | O_NOFOLLOW), {}, id, {}};
      ASSERT_GE(x.fd, 0) << rel;
      ASSERT_EQ(fstat(x.fd, &x.k), 0);
      auto st = fs_->GetStat(id);
      ASSERT_TRUE(st.ok());
      x.u = *st;
      w.push_back(x);
    }
    for (const auto& x : w) {  // the kernel's clock past every armed ctime
      for (;;) {
        timespec now;
        clock_gettime(CLOCK_REALTIME_COARSE, &now);
        if (now.tv_sec > x.k.st_ctim.tv_sec || (now.tv_sec == x.k.st_ctim.tv_sec && now.tv_nsec > x.k.st_ctim.tv_nsec)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    errno = 0;
    const int ke = kernel() < 0 ? errno : 0;
    const Status us = library();
    EXPECT_EQ(us.code(), ke) << what << ": kernel " << strerror(ke) << ", ubtrfs " << us.ToString();
    for (auto& x : w) {
      struct stat k;
      const bool kok = fstat(x.fd, &k) == 0;
      close(x.fd);
      auto u = fs_->GetStat(x.id);
      if (!kok || k.st_nlink == 0 || !u.ok()) continue;  // gone
      ++compared_;
      const bool km = !Same(k.st_mtim, x.k.st_mtim), kc = !Same(k.st_ctim, x.k.st_ctim);
      const bool um = !Same(u->mtime, x.u.mtime), uc = !Same(u->ctime, x.u.ctime);
      EXPECT_EQ(um, km) << what << ": " << (x.rel.empty() ? "/" : x.rel) << ": mtime " << (km ? "changed" : "kept")
                        << " by the kernel's btrfs, " << (um ? "changed" : "kept") << " by ubtrfs";
      EXPECT_EQ(uc, kc) << what << ": " << (x.rel.empty() ? "/" : x.rel) << ": ctime " << (kc ? "changed" : "kept")
                        << " by the kernel's btrfs, " << (uc ? "changed" : "kept") << " by ubtrfs";
    }
  }

  // Creates a regular file with contents on both sides (not compared).
  void MakeFile(const std::string& rel, const std::string& data) {
    const int fd = open(K(rel).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    ASSERT_GE(fd, 0) << rel << ": " << strerror(errno);
    ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    close(fd);
    NewInode a;
    a.mode = 0644;
    auto id = fs_->Create(UParent(rel), Name(rel), a);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ASSERT_TRUE(fs_->Write(*id, 0, Bytes(data)).ok());
  }
  void MakeDir(const std::string& rel) {
    ASSERT_EQ(mkdir(K(rel).c_str(), 0755), 0) << rel << ": " << strerror(errno);
    NewInode a;
    a.mode = 0755;
    ASSERT_TRUE(fs_->Mkdir(UParent(rel), Name(rel), a).ok());
  }

  TempDir dir_{"ubtrfs-times"};
  std::string kimg_, uimg_, mnt_;
  ubtrfs_test::LoopMount loop_;
  std::unique_ptr<Filesystem> fs_;
  long clock_ = 0;
  int compared_ = 0;
};

TEST_F(TimestampRules, EachCallMatchesTheKernelsBtrfs) {
  MakeDir("d1");
  MakeDir("d2");
  MakeFile("d1/f", "hello, world");
  MakeFile("d1/g", std::string(10000, 'g'));
  MakeFile("d1/h", "h");
  ASSERT_FALSE(HasFatalFailure());
  NewInode file;
  file.mode = 0644;
  NewInode dir;
  dir.mode = 0755;

  Call("create", {"d1"}, [&] { return close(open(K("d1/new").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644)); },
       [&] { return fs_->Create(U("d1"), "new", file).status(); });
  Call("mkdir", {"d1"}, [&] { return mkdir(K("d1/sub").c_str(), 0755); },
       [&] { return fs_->Mkdir(U("d1"), "sub", dir).status(); });
  Call("symlink", {"d1"}, [&] { return symlink("target", K("d1/sl").c_str()); },
       [&] { return fs_->Symlink(U("d1"), "sl", "target", NewInode{}).status(); });
  Call("mkfifo", {"d1"}, [&] { return mkfifo(K("d1/fifo").c_str(), 0644); }, [&] {
    NewInode a;
    a.mode = S_IFIFO | 0644;
    return fs_->Mknod(U("d1"), "fifo", a).status();
  });
  Call("link", {"d1/f", "d2"}, [&] { return link(K("d1/f").c_str(), K("d2/f2").c_str()); },
       [&] { return fs_->Link(U("d1/f"), U("d2"), "f2"); });
  Call("unlink of a second name", {"d2/f2", "d2"}, [&] { return unlink(K("d2/f2").c_str()); },
       [&] { return fs_->Unlink(U("d2"), "f2"); });
  Call("unlink", {"d1/new", "d1"}, [&] { return unlink(K("d1/new").c_str()); },
       [&] { return fs_->Unlink(U("d1"), "new"); });
  Call("rmdir", {"d1/sub", "d1"}, [&] { return rmdir(K("d1/sub").c_str()); },
       [&] { return fs_->Rmdir(U("d1"), "sub"); });
  Call("rename within a directory", {"d1/g", "d1"}, [&] { return rename(K("d1/g").c_str(), K("d1/g2").c_str()); },
       [&] { return fs_->Rename(U("d1"), "g", U("d1"), "g2"); });
  Call("rename to another directory", {"d1/g2", "d1", "d2"},
       [&] { return rename(K("d1/g2").c_str(), K("d2/g").c_str()); },
       [&] { return fs_->Rename(U("d1"), "g2", U("d2"), "g"); });
  Call("rename of a directory", {"d2", ""}, [&] { return rename(K("d2").c_str(), K("d3").c_str()); },
       [&] { return fs_->Rename(U(""), "d2", U(""), "d3"); });
  Call("rename of a directory into another", {"d3", "", "d1"}, [&] { return rename(K("d3").c_str(), K("d1/d3").c_str()); },
       [&] { return fs_->Rename(U(""), "d3", U("d1"), "d3"); });
  MakeFile("d1/d3/over", "to be replaced");
  MakeFile("d1/keep", "k");
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(link(K("d1/d3/over").c_str(), K("d1/over2").c_str()), 0);  // the replaced inode lives on
  ASSERT_TRUE(fs_->Link(U("d1/d3/over"), U("d1"), "over2").ok());
  Call("rename over a file", {"d1/h", "d1", "d1/d3", "d1/over2"},
       [&] { return rename(K("d1/h").c_str(), K("d1/d3/over").c_str()); },
       [&] { return fs_->Rename(U("d1"), "h", U("d1/d3"), "over"); });
  Call("rename exchange", {"d1/f", "d1/d3/g", "d1", "d1/d3"},
       [&] { return renameat2(AT_FDCWD, K("d1/f").c_str(), AT_FDCWD, K("d1/d3/g").c_str(), RENAME_EXCHANGE); },
       [&] { return fs_->Rename(U("d1"), "f", U("d1/d3"), "g", kRenameExchange); });
  ASSERT_EQ(link(K("d1/keep").c_str(), K("d1/d3/keep").c_str()), 0);
  ASSERT_TRUE(fs_->Link(U("d1/keep"), U("d1/d3"), "keep").ok());
  Call("rename onto another name of the same inode", {"d1/keep", "d1", "d1/d3"},
       [&] { return rename(K("d1/d3/keep").c_str(), K("d1/keep").c_str()); },
       [&] { return fs_->Rename(U("d1/d3"), "keep", U("d1"), "keep"); });
  Call("failed rename", {"d1/keep", "d1"}, [&] { return rename(K("d1/keep").c_str(), K("d1/nodir/x").c_str()); },
       [&] { return fs_->Rename(U("d1"), "keep", InodeId{U("d1").root, 999999}, "x"); });
  const std::string f = "d1/keep";
  auto truncate_to = [&](uint64_t size) {
    Call("truncate to " + std::to_string(size), {f}, [&] { return truncate(K(f).c_str(), static_cast<off_t>(size)); },
         [&] {
           AttrChange c;
           c.size = size;
           return fs_->SetAttr(U(f), c);
         });
  };
  truncate_to(5000);
  truncate_to(5000);  // to the size it has
  truncate_to(100);
  Call("write", {f}, [&] {
    const int fd = open(K(f).c_str(), O_WRONLY);
    const int r = static_cast<int>(pwrite(fd, "abc", 3, 10));
    close(fd);
    return r < 0 ? -1 : 0;
  }, [&] { return fs_->Write(U(f), 10, Bytes("abc")).status(); });
  Call("chmod", {f}, [&] { return chmod(K(f).c_str(), 0600); }, [&] {
    AttrChange c;
    c.mode = 0600;
    return fs_->SetAttr(U(f), c);
  });
  Call("setxattr", {f}, [&] { return setxattr(K(f).c_str(), "user.a", "v", 1, 0); },
       [&] { return fs_->SetXattr(U(f), "user.a", "v", 0); });
  Call("setxattr on a directory", {"d1"}, [&] { return setxattr(K("d1").c_str(), "user.a", "v", 1, 0); },
       [&] { return fs_->SetXattr(U("d1"), "user.a", "v", 0); });
  Call("removexattr", {f}, [&] { return removexattr(K(f).c_str(), "user.a"); },
       [&] { return fs_->RemoveXattr(U(f), "user.a"); });
  Call("removexattr of a missing name", {f}, [&] { return removexattr(K(f).c_str(), "user.a"); },
       [&] { return fs_->RemoveXattr(U(f), "user.a"); });
  std::cout << "[ times    ] " << compared_ << " inodes' mtime and ctime compared with the kernel's btrfs\n";
  EXPECT_GT(compared_, 30);
}

}  // namespace

namespace UBTRFS_UNITY_ID {

// SetCallerKeepsFileTimes (the writeback_cache mount, issue 15): the calls
// that stamp a file's mtime and ctime on their own leave both alone, a time
// given in an AttrChange is still set, and off again they stamp as before.
TEST(CallerKeepsFileTimes, WriteFallocateCloneAndTruncateLeaveTimesAlone) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-keep-times");
  const std::string img = dir.Sub("img");
  ASSERT_TRUE(RunCommand({"truncate", "-s", "256M", img}).ok());
  ASSERT_TRUE(RunCommand({"mkfs.btrfs", "-q", "-f", img}).ok());
  OpenOptions o;
  o.writable = true;
  auto opened = Filesystem::Open(img, o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Filesystem& fs = **opened;
  NewInode attrs;
  attrs.mode = 0644;
  auto src = fs.Create(fs.Root(), "src", attrs);
  auto f = fs.Create(fs.Root(), "f", attrs);
  ASSERT_TRUE(src.ok() && f.ok());
  const std::string data(64 * 1024, 'd');
  ASSERT_TRUE(fs.Write(*src, 0, Bytes(data)).ok());
  ASSERT_TRUE(fs.Write(*f, 0, Bytes(data)).ok());
  auto before = fs.GetStat(*f);
  ASSERT_TRUE(before.ok());
  fs.SetCallerKeepsFileTimes(true);
  auto unchanged = [&](const char* what) {
    auto st = fs.GetStat(*f);
    ASSERT_TRUE(st.ok());
    EXPECT_TRUE(Same(st->mtime, before->mtime)) << what << ": mtime";
    EXPECT_TRUE(Same(st->ctime, before->ctime)) << what << ": ctime";
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(fs.Write(*f, 100, Bytes("overwritten")).ok());
  unchanged("write");
  ASSERT_TRUE(fs.Fallocate(*f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8192, 8192).ok());
  unchanged("punch");
  ASSERT_TRUE(fs.Fallocate(*f, 0, 0, 1 << 20).ok());
  unchanged("fallocate extending");
  ASSERT_TRUE(fs.Clone(*src, 0, *f, 16384, 16384).ok());
  unchanged("clone");
  AttrChange trunc;
  trunc.size = 10000;
  ASSERT_TRUE(fs.SetAttr(*f, trunc).ok());
  unchanged("truncate");
  AttrChange times;
  times.mtime = Time{1600000000, 5};
  times.ctime = Time{1600000001, 6};
  ASSERT_TRUE(fs.SetAttr(*f, times).ok());
  auto st = fs.GetStat(*f);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(Same(st->mtime, *times.mtime));
  EXPECT_TRUE(Same(st->ctime, *times.ctime));
  fs.SetCallerKeepsFileTimes(false);
  ASSERT_TRUE(fs.Write(*f, 0, Bytes("again")).ok());
  st = fs.GetStat(*f);
  ASSERT_TRUE(st.ok());
  EXPECT_GT(st->mtime.sec, times.mtime->sec) << "stamped again once off";
  EXPECT_GT(st->ctime.sec, times.ctime->sec);
}

}  // namespace
