// `ubtrfs mount` (FUSE): ordinary POSIX calls, cp -a and tar through the
// mount, then unmount, btrfs check and a comparison through libubtrfs.
//
// Every operation of the POSIX test runs on a host directory (the model) and
// on the mount; their results (errno) must agree, and at the end both trees
// must be equal -- through the mount, and after unmounting, in the image.
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/falloc.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "support/fuse_mount.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace {

using ubtrfs_test::CompareOptions;
using ubtrfs_test::FormatMismatches;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::IsUbtrfsMount;
using ubtrfs_test::MountProcess;
using ubtrfs_test::Scratch;

// ---- The model: every operation on the host directory and on the mount ----

class Twin {
 public:
  Twin(std::string model, std::string mnt) : model_(std::move(model)), mnt_(std::move(mnt)) {}

  // Runs f(base) on both sides (f returns -1 with errno set on failure);
  // the outcomes must agree. Returns that errno (0 on success).
  //
  // Timestamps are compared by the kernel's rules, call by call, with the
  // host kernel as the oracle: every entry a call names (recorded by Touch,
  // plus their parent directories) is armed before the next call -- the same
  // old atime and mtime on both sides, and its ctime noted -- so whether a
  // call changed an inode's mtime and ctime can be seen on both sides and must
  // agree (inodes found by st_ino, so a renamed file is still recognized).
  // mtime is always definite (the armed value is in the past); ctime is
  // definite on a side when it changed or when the coarse clock (the
  // kernel's current_time()) was past the armed ctimes before the call,
  // which one call in four waits for. Because everything is armed alike, the
  // whole-tree comparison at the end sees equal mtimes unless some call
  // changed one that it must not (or failed to change one that it must).
  template <typename F>
  int Both(const std::string& what, F f) {
    ArmPending();
    const bool waited = (ops_ % 4) == 0 && WaitPastArmedCtimes();
    touched_.clear();
    recording_ = true;
    errno = 0;
    const int a = f(model_) < 0 ? errno : 0;
    errno = 0;
    const int b = f(mnt_) < 0 ? errno : 0;
    recording_ = false;
    EXPECT_EQ(a, b) << what << ": host " << strerror(a) << ", mount " << strerror(b);
    ++ops_;
    CheckTimes(what, waited);
    return b;
  }

  // Called with every relative path a call uses (P() in the tests).
  void Touch(const std::string& rel) {
    if (!recording_) return;
    touched_.push_back(rel);
    for (std::string p = rel; !p.empty();) {  // the parents too
      const auto slash = p.rfind('/');
      p = slash == std::string::npos ? "" : p.substr(0, slash);
      touched_.push_back(p);
    }
  }

  // Arms what the last call touched (at the end, before comparing trees).
  void ArmPending() {
    std::sort(pending_.begin(), pending_.end());
    pending_.erase(std::unique(pending_.begin(), pending_.end()), pending_.end());
    for (const auto& rel : pending_) {
      struct stat hs, ms;
      if (lstat(Path(model_, rel).c_str(), &hs) != 0 || lstat(Path(mnt_, rel).c_str(), &ms) != 0) continue;
      ++arm_clock_;
      const timespec old{1500000000 + arm_clock_, (arm_clock_ * 7919) % 1000000000};
      const timespec ts[2] = {old, old};
      ASSERT_EQ(utimensat(AT_FDCWD, Path(model_, rel).c_str(), ts, AT_SYMLINK_NOFOLLOW), 0) << rel << ": " << strerror(errno);
      ASSERT_EQ(utimensat(AT_FDCWD, Path(mnt_, rel).c_str(), ts, AT_SYMLINK_NOFOLLOW), 0) << rel << ": " << strerror(errno);
      ASSERT_EQ(lstat(Path(model_, rel).c_str(), &hs), 0);
      ASSERT_EQ(lstat(Path(mnt_, rel).c_str(), &ms), 0);
      host_armed_[hs.st_ino] = {hs.st_mtim, hs.st_ctim};
      mnt_armed_[ms.st_ino] = {ms.st_mtim, ms.st_ctim};
      latest_ctime_ = std::max(latest_ctime_, std::max(Ns(hs.st_ctim), Ns(ms.st_ctim)));
    }
    pending_.clear();
  }

  uint64_t times_checked() const { return times_checked_; }
  uint64_t ctimes_checked() const { return ctimes_checked_; }

  // Writes `data` at `off` in pieces of varying size (open with `flags`).
  int WriteFile(const std::string& rel, const std::string& data, uint64_t off, int flags, std::mt19937_64& rng) {
    const uint64_t seed = rng();
    return Both("write " + rel, [&](const std::string& base) {
      Touch(rel);
      std::mt19937_64 r(seed);
      int fd = open((base + "/" + rel).c_str(), flags, 0644);
      if (fd < 0) return -1;
      size_t pos = 0;
      while (pos < data.size()) {
        size_t n = std::min<size_t>(data.size() - pos, 1 + r() % (r() % 3 == 0 ? 300000 : 9000));
        ssize_t w = pwrite(fd, data.data() + pos, n, static_cast<off_t>(off + pos));
        if (w <= 0) {
          const int e = errno;
          close(fd);
          errno = e;
          return -1;
        }
        pos += static_cast<size_t>(w);
      }
      return close(fd);
    });
  }

  // The file as read through the mount (in odd-sized pieces) equals the model's.
  void CheckContent(const std::string& rel) {
    const std::string want = ReadWhole(model_ + "/" + rel);
    std::string got;
    int fd = open((mnt_ + "/" + rel).c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << rel << ": " << strerror(errno);
    std::vector<char> buf(77777);
    for (;;) {
      ssize_t n = read(fd, buf.data(), buf.size());
      ASSERT_GE(n, 0) << strerror(errno);
      if (n == 0) break;
      got.append(buf.data(), static_cast<size_t>(n));
    }
    // A few preads at odd offsets.
    for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{131071}, want.size() / 2}) {
      if (off >= want.size()) continue;
      const size_t len = std::min<size_t>(want.size() - off, 10000);
      std::string part(len, '\0');
      ASSERT_EQ(pread(fd, part.data(), len, static_cast<off_t>(off)), static_cast<ssize_t>(len));
      EXPECT_EQ(part, want.substr(off, len)) << rel << " at " << off;
    }
    close(fd);
    EXPECT_EQ(got.size(), want.size()) << rel;
    EXPECT_TRUE(got == want) << rel << ": contents differ";
  }


  const std::string& model() const { return model_; }
  const std::string& mnt() const { return mnt_; }
  int ops() const { return ops_; }

 private:
  struct Armed {
    timespec mtime, ctime;
  };
  static std::string Path(const std::string& base, const std::string& rel) {
    return rel.empty() ? base : base + "/" + rel;
  }
  static int64_t Ns(const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }
  static bool Same(const timespec& a, const timespec& b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }

  // Waits until the coarse clock is past every armed ctime; false when
  // nothing is armed.
  bool WaitPastArmedCtimes() {
    if (latest_ctime_ == 0) return false;
    for (;;) {
      timespec now;
      clock_gettime(CLOCK_REALTIME_COARSE, &now);
      if (Ns(now) > latest_ctime_) return true;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  }

  void CheckTimes(const std::string& what, bool waited) {
    for (const auto& rel : touched_) {
      pending_.push_back(rel);
      struct stat hs, ms;
      if (lstat(Path(model_, rel).c_str(), &hs) != 0 || lstat(Path(mnt_, rel).c_str(), &ms) != 0) continue;
      auto h = host_armed_.find(hs.st_ino);
      auto m = mnt_armed_.find(ms.st_ino);
      if (h == host_armed_.end() || m == mnt_armed_.end()) continue;  // new, or never armed
      if (!checked_.insert(rel).second) continue;
      ++times_checked_;
      const std::string where = what + ": " + (rel.empty() ? "/" : rel);
      const bool host_m = !Same(hs.st_mtim, h->second.mtime), mnt_m = !Same(ms.st_mtim, m->second.mtime);
      EXPECT_EQ(mnt_m, host_m) << where << ": mtime " << (host_m ? "changed" : "kept") << " on the host, "
                               << (mnt_m ? "changed" : "kept") << " on the mount";
      const bool host_c = !Same(hs.st_ctim, h->second.ctime), mnt_c = !Same(ms.st_ctim, m->second.ctime);
      // Without the wait a kept ctime may only mean that the clock had not
      // ticked since the arming (on either side): compared only after it.
      if (waited) {
        ++ctimes_checked_;
        EXPECT_EQ(mnt_c, host_c) << where << ": ctime " << (host_c ? "changed" : "kept") << " on the host, "
                                 << (mnt_c ? "changed" : "kept") << " on the mount";
      }
    }
    checked_.clear();
  }

  std::string model_, mnt_;
  int ops_ = 0;
  bool recording_ = false;
  std::vector<std::string> touched_, pending_;
  std::set<std::string> checked_;
  std::map<ino_t, Armed> host_armed_, mnt_armed_;
  int64_t latest_ctime_ = 0;
  long arm_clock_ = 0;
  uint64_t times_checked_ = 0, ctimes_checked_ = 0;
};

std::string Pattern(size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::string s(n, '\0');
  const char fill = static_cast<char>(r());
  for (size_t i = 0; i < n; ++i) s[i] = r() % 4 == 0 ? static_cast<char>(r()) : static_cast<char>(fill + i / 4096);
  return s;
}

std::set<std::string> ListDir(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    EXPECT_TRUE(names.insert(e->d_name).second) << dir << ": " << e->d_name << " listed twice";
  }
  closedir(d);
  return names;
}

// "N requests (x per entry): lookup=a ..." from a finished mount's -o stats.
std::string RequestSummary(const MountProcess& m, size_t entries, const char* per = "entry") {
  uint64_t total = 0;
  std::string parts;
  for (const auto& [k, v] : m.Counters()) {
    total += v;
    parts += " " + k + "=" + std::to_string(v);
  }
  std::ostringstream o;
  o << total << " requests (" << static_cast<double>(total) / static_cast<double>(std::max<size_t>(entries, 1))
    << " per " << per << "):" << parts;
  return o.str();
}

// The POSIX operations, with the mount options given (plus stats and a
// 2-second commit interval, so timer commits happen in the middle).
void PosixOperations(const std::string& options) {
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string model = s.dir.Sub("model");
  ASSERT_EQ(mkdir(model.c_str(), 0755), 0);
  ASSERT_EQ(chmod(model.c_str(), 0755), 0);
  MountProcess mount;
  START_MOUNT(mount, s, "-o", "stats,commit=2" + options);
  Twin t(model, s.mnt);
  std::mt19937_64 rng(42);
  const bool root = geteuid() == 0;
  auto P = [&t](const std::string& base, const std::string& rel) {
    t.Touch(rel);
    return base + "/" + rel;
  };

  // Files of many sizes around the inline limit, sector and extent edges.
  ASSERT_EQ(t.Both("mkdir files", [&](auto& b) { return mkdir(P(b, "files").c_str(), 0755); }), 0);
  const std::vector<size_t> sizes = {0, 1, 100, 2047, 2048, 2049, 4095, 4096, 4097, 65536, (128 << 10) + 3,
                                     (1 << 20) + 17, (5 << 20) + 1};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string rel = "files/f" + std::to_string(sizes[i]);
    ASSERT_EQ(t.WriteFile(rel, Pattern(sizes[i], i), 0, O_CREAT | O_EXCL | O_WRONLY, rng), 0);
    t.CheckContent(rel);
  }
  // Overwrite in the middle, append, write past the end (a hole).
  ASSERT_EQ(t.WriteFile("files/f65536", Pattern(10000, 99), 30000, O_WRONLY, rng), 0);
  ASSERT_EQ(t.WriteFile("files/f4097", Pattern(5000, 98), 4097, O_WRONLY | O_APPEND, rng), 0);
  ASSERT_EQ(t.WriteFile("files/f100", Pattern(3000, 97), 1 << 20, O_WRONLY, rng), 0);
  ASSERT_EQ(t.WriteFile("files/f1", Pattern(10, 96), 0, O_WRONLY | O_TRUNC, rng), 0);
  ASSERT_EQ(t.WriteFile("files/f131075", Pattern(100, 95), 0, O_WRONLY | O_TRUNC, rng), 0);
  ASSERT_EQ(t.Both("open O_TRUNC", [&](auto& b) { return close(open(P(b, "files/f4096").c_str(), O_RDWR | O_TRUNC)); }), 0);
  for (const char* f : {"files/f65536", "files/f4097", "files/f100", "files/f1", "files/f131075", "files/f4096"}) {
    t.CheckContent(f);
  }
  EXPECT_EQ(t.Both("create existing O_EXCL", [&](auto& b) { return open(P(b, "files/f1").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644); }), EEXIST);

  // Truncate down, up, to zero, and ftruncate on an open file.
  t.Both("truncate down", [&](auto& b) { return truncate(P(b, "files/f" + std::to_string((1 << 20) + 17)).c_str(), 300001); });
  t.Both("truncate up", [&](auto& b) { return truncate(P(b, "files/f4095").c_str(), 3 << 20); });
  t.Both("truncate inline", [&](auto& b) { return truncate(P(b, "files/f2047").c_str(), 17); });
  t.Both("ftruncate", [&](auto& b) {
    int fd = open(P(b, "files/f2049").c_str(), O_RDWR);
    if (fd < 0) return -1;
    int r = ftruncate(fd, 5000);
    close(fd);
    return r;
  });
  for (const char* f : {"files/f4095", "files/f2047", "files/f2049"}) t.CheckContent(f);
  t.CheckContent("files/f" + std::to_string((1 << 20) + 17));

  // Directories.
  t.Both("mkdir a", [&](auto& b) { return mkdir(P(b, "a").c_str(), 0750); });
  t.Both("mkdir a/b", [&](auto& b) { return mkdir(P(b, "a/b").c_str(), 0700); });
  EXPECT_EQ(t.Both("mkdir exists", [&](auto& b) { return mkdir(P(b, "a").c_str(), 0755); }), EEXIST);
  EXPECT_EQ(t.Both("name too long", [&](auto& b) { return mkdir(P(b, std::string(256, 'n')).c_str(), 0755); }), ENAMETOOLONG);
  EXPECT_EQ(t.Both("longest name", [&](auto& b) { return mkdir(P(b, std::string(255, 'n')).c_str(), 0755); }), 0);
  t.Both("create a/b/x", [&](auto& b) { return close(open(P(b, "a/b/x").c_str(), O_CREAT | O_WRONLY, 0640)); });
  EXPECT_EQ(t.Both("rmdir non-empty", [&](auto& b) { return rmdir(P(b, "a/b").c_str()); }), ENOTEMPTY);
  EXPECT_EQ(t.Both("rmdir file", [&](auto& b) { return rmdir(P(b, "a/b/x").c_str()); }), ENOTDIR);
  EXPECT_EQ(t.Both("unlink dir", [&](auto& b) { return unlink(P(b, "a/b").c_str()); }), EISDIR);
  t.Both("mkdir gone", [&](auto& b) { return mkdir(P(b, "gone").c_str(), 0755); });
  EXPECT_EQ(t.Both("rmdir", [&](auto& b) { return rmdir(P(b, "gone").c_str()); }), 0);
  EXPECT_EQ(t.Both("stat removed", [&](auto& b) { struct stat st; return lstat(P(b, "gone").c_str(), &st); }), ENOENT);

  // Renames: plain, over an existing file, directories, flags.
  t.WriteFile("r1", Pattern(5000, 1), 0, O_CREAT | O_WRONLY, rng);
  t.WriteFile("r2", Pattern(70000, 2), 0, O_CREAT | O_WRONLY, rng);
  t.WriteFile("r3", Pattern(10, 3), 0, O_CREAT | O_WRONLY, rng);
  EXPECT_EQ(t.Both("rename", [&](auto& b) { return rename(P(b, "r1").c_str(), P(b, "a/r1moved").c_str()); }), 0);
  EXPECT_EQ(t.Both("rename over", [&](auto& b) { return rename(P(b, "r2").c_str(), P(b, "a/r1moved").c_str()); }), 0);
  t.CheckContent("a/r1moved");
  EXPECT_EQ(t.Both("noreplace", [&](auto& b) {
    return renameat2(AT_FDCWD, P(b, "r3").c_str(), AT_FDCWD, P(b, "a/r1moved").c_str(), RENAME_NOREPLACE);
  }), EEXIST);
  EXPECT_EQ(t.Both("exchange", [&](auto& b) {
    return renameat2(AT_FDCWD, P(b, "r3").c_str(), AT_FDCWD, P(b, "a/r1moved").c_str(), RENAME_EXCHANGE);
  }), 0);
  t.CheckContent("r3");
  t.CheckContent("a/r1moved");
  EXPECT_EQ(t.Both("dir into itself", [&](auto& b) { return rename(P(b, "a").c_str(), P(b, "a/b/inside").c_str()); }), EINVAL);
  EXPECT_EQ(t.Both("exchange dir and file", [&](auto& b) {
    return renameat2(AT_FDCWD, P(b, "a/b").c_str(), AT_FDCWD, P(b, "r3").c_str(), RENAME_EXCHANGE);
  }), 0);
  EXPECT_EQ(t.Both("rename dir", [&](auto& b) { return rename(P(b, "r3").c_str(), P(b, "renamed_dir").c_str()); }), 0);
  EXPECT_EQ(t.Both("file over dir", [&](auto& b) { return rename(P(b, "a/b").c_str(), P(b, "renamed_dir").c_str()); }), EISDIR);
  EXPECT_EQ(t.Both("dir over file", [&](auto& b) { return rename(P(b, "renamed_dir").c_str(), P(b, "a/b").c_str()); }), ENOTDIR);
  t.Both("mkdir e1", [&](auto& b) { return mkdir(P(b, "e1").c_str(), 0755); });
  t.Both("mkdir e2", [&](auto& b) { return mkdir(P(b, "e2").c_str(), 0711); });
  EXPECT_EQ(t.Both("dir over non-empty dir", [&](auto& b) { return rename(P(b, "e1").c_str(), P(b, "renamed_dir").c_str()); }), ENOTEMPTY);
  EXPECT_EQ(t.Both("dir over empty dir", [&](auto& b) { return rename(P(b, "e1").c_str(), P(b, "e2").c_str()); }), 0);
  EXPECT_EQ(t.Both("rename missing", [&](auto& b) { return rename(P(b, "e1").c_str(), P(b, "e3").c_str()); }), ENOENT);

  // Hard links.
  t.WriteFile("h1", Pattern(9000, 4), 0, O_CREAT | O_WRONLY, rng);
  EXPECT_EQ(t.Both("link", [&](auto& b) { return link(P(b, "h1").c_str(), P(b, "a/h2").c_str()); }), 0);
  EXPECT_EQ(t.Both("link 3", [&](auto& b) { return link(P(b, "h1").c_str(), P(b, "h3").c_str()); }), 0);
  EXPECT_EQ(t.Both("link to dir", [&](auto& b) { return link(P(b, "a").c_str(), P(b, "adir").c_str()); }), EPERM);
  {
    struct stat s1, s2;
    ASSERT_EQ(lstat(P(s.mnt, "h1").c_str(), &s1), 0);
    ASSERT_EQ(lstat(P(s.mnt, "a/h2").c_str(), &s2), 0);
    EXPECT_EQ(s1.st_nlink, 3u);
    EXPECT_EQ(s1.st_ino, s2.st_ino);
  }
  EXPECT_EQ(t.Both("unlink link", [&](auto& b) { return unlink(P(b, "h3").c_str()); }), 0);
  {
    struct stat st;
    ASSERT_EQ(lstat(P(s.mnt, "a/h2").c_str(), &st), 0);
    EXPECT_EQ(st.st_nlink, 2u);
  }

  // Symlinks, fifos.
  EXPECT_EQ(t.Both("symlink", [&](auto& b) { return symlink("../h1", P(b, "a/sl").c_str()); }), 0);
  EXPECT_EQ(t.Both("dangling symlink", [&](auto& b) { return symlink(std::string(300, 'x').c_str(), P(b, "dangling").c_str()); }), 0);
  {
    char buf[512];
    ssize_t n = readlink(P(s.mnt, "a/sl").c_str(), buf, sizeof buf);
    ASSERT_EQ(n, 5);
    EXPECT_EQ(std::string(buf, 5), "../h1");
    EXPECT_EQ(ReadWhole(P(s.mnt, "a/sl")), ReadWhole(P(model, "h1")));  // followed by the kernel
  }
  EXPECT_EQ(t.Both("mkfifo", [&](auto& b) { return mkfifo(P(b, "fifo").c_str(), 0620); }), 0);

  // Attributes.
  EXPECT_EQ(t.Both("chmod", [&](auto& b) { return chmod(P(b, "h1").c_str(), 04751); }), 0);
  EXPECT_EQ(t.Both("chmod dir", [&](auto& b) { return chmod(P(b, "a").c_str(), 01777); }), 0);
  if (root) {
    EXPECT_EQ(t.Both("chown", [&](auto& b) { return chown(P(b, "files/f1").c_str(), 1234, 5678); }), 0);
    EXPECT_EQ(t.Both("lchown", [&](auto& b) { return lchown(P(b, "a/sl").c_str(), 42, 43); }), 0);
  }
  {
    const timespec ts[2] = {{1000000000, 123456789}, {1600000000, 987654321}};
    EXPECT_EQ(t.Both("utimensat", [&](auto& b) { return utimensat(AT_FDCWD, P(b, "files/f0").c_str(), ts, 0); }), 0);
    struct stat st;
    ASSERT_EQ(stat(P(s.mnt, "files/f0").c_str(), &st), 0);
    EXPECT_EQ(st.st_mtim.tv_sec, 1600000000);
    EXPECT_EQ(st.st_mtim.tv_nsec, 987654321);
    EXPECT_EQ(st.st_atim.tv_sec, 1000000000);
    EXPECT_EQ(st.st_atim.tv_nsec, 123456789);
    // UTIME_OMIT keeps, UTIME_NOW stamps.
    const timespec omit_now[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
    const time_t before = time(nullptr);
    ASSERT_EQ(utimensat(AT_FDCWD, P(s.mnt, "files/f0").c_str(), omit_now, 0), 0);
    ASSERT_EQ(stat(P(s.mnt, "files/f0").c_str(), &st), 0);
    EXPECT_EQ(st.st_atim.tv_sec, 1000000000);
    EXPECT_EQ(st.st_atim.tv_nsec, 123456789);
    EXPECT_GE(st.st_mtim.tv_sec, before);
    EXPECT_EQ(t.Both("lutimes symlink", [&](auto& b) { return utimensat(AT_FDCWD, P(b, "a/sl").c_str(), ts, AT_SYMLINK_NOFOLLOW); }), 0);
  }

  // Xattrs, with the size-probe protocol.
  EXPECT_EQ(t.Both("setxattr", [&](auto& b) { return setxattr(P(b, "h1").c_str(), "user.one", "value1", 6, 0); }), 0);
  EXPECT_EQ(t.Both("setxattr 2", [&](auto& b) { return setxattr(P(b, "h1").c_str(), "user.two", "", 0, 0); }), 0);
  EXPECT_EQ(t.Both("setxattr dir", [&](auto& b) { return setxattr(P(b, "a").c_str(), "user.d", "dv", 2, 0); }), 0);
  EXPECT_EQ(t.Both("xattr create existing", [&](auto& b) { return setxattr(P(b, "h1").c_str(), "user.one", "x", 1, XATTR_CREATE); }), EEXIST);
  EXPECT_EQ(t.Both("xattr replace missing", [&](auto& b) { return setxattr(P(b, "h1").c_str(), "user.nope", "x", 1, XATTR_REPLACE); }), ENODATA);
  const std::string big(3000, 'v');
  EXPECT_EQ(t.Both("setxattr big", [&](auto& b) { return setxattr(P(b, "files/f0").c_str(), "user.big", big.data(), big.size(), 0); }), 0);
  {
    EXPECT_EQ(getxattr(P(s.mnt, "files/f0").c_str(), "user.big", nullptr, 0), 3000);
    char small[10];
    EXPECT_EQ(getxattr(P(s.mnt, "files/f0").c_str(), "user.big", small, sizeof small), -1);
    EXPECT_EQ(errno, ERANGE);
    std::string v(3000, '\0');
    EXPECT_EQ(getxattr(P(s.mnt, "files/f0").c_str(), "user.big", v.data(), v.size()), 3000);
    EXPECT_EQ(v, big);
    EXPECT_EQ(getxattr(P(s.mnt, "h1").c_str(), "user.none", nullptr, 0), -1);
    EXPECT_EQ(errno, ENODATA);
    const ssize_t n = listxattr(P(s.mnt, "h1").c_str(), nullptr, 0);
    ASSERT_EQ(n, static_cast<ssize_t>(sizeof("user.one") + sizeof("user.two")));
    std::string names(static_cast<size_t>(n), '\0');
    EXPECT_EQ(listxattr(P(s.mnt, "h1").c_str(), names.data(), 3), -1);
    EXPECT_EQ(errno, ERANGE);
    ASSERT_EQ(listxattr(P(s.mnt, "h1").c_str(), names.data(), names.size()), n);
    EXPECT_TRUE(names.find("user.one") != std::string::npos && names.find("user.two") != std::string::npos);
  }
  EXPECT_EQ(t.Both("removexattr", [&](auto& b) { return removexattr(P(b, "h1").c_str(), "user.two"); }), 0);
  EXPECT_EQ(t.Both("removexattr missing", [&](auto& b) { return removexattr(P(b, "h1").c_str(), "user.two"); }), ENODATA);

  // POSIX ACLs: the mode follows the access ACL and an ACL the mode can say
  // alone is not stored; chmod rewrites the ACL; default ACLs are inherited.
  // (umask 0: a kernel ignores the umask under a default ACL, while the mount
  // gets modes the VFS already masked.)
  {
    const mode_t old_umask = umask(0);
    auto acl = [](const std::vector<std::array<uint32_t, 3>>& entries) {
      std::string v;
      auto put = [&](uint32_t x, int bytes) {
        for (int i = 0; i < bytes; ++i) v += static_cast<char>((x >> (8 * i)) & 0xff);
      };
      put(2, 4);
      for (const auto& e : entries) {
        put(e[0], 2);
        put(e[1], 2);
        put(e[2], 4);
      }
      return v;
    };
    constexpr uint32_t N = ~0u;
    const char* kAccess = "system.posix_acl_access";
    const char* kDefault = "system.posix_acl_default";
    t.Both("create aclf", [&](auto& b) { return close(open(P(b, "aclf").c_str(), O_CREAT | O_WRONLY, 0600)); });
    const std::string eq = acl({{1, 7, N}, {4, 5, N}, {0x20, 4, N}});
    EXPECT_EQ(t.Both("equivalent acl", [&](auto& b) { return setxattr(P(b, "aclf").c_str(), kAccess, eq.data(), eq.size(), 0); }), 0);
    struct stat st;
    ASSERT_EQ(lstat(P(s.mnt, "aclf").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0754u);
    EXPECT_EQ(t.Both("no acl stored", [&](auto& b) { return static_cast<int>(getxattr(P(b, "aclf").c_str(), kAccess, nullptr, 0)); }), ENODATA);
    const std::string ext = acl({{1, 6, N}, {2, 4, 1000}, {4, 4, N}, {0x10, 6, N}, {0x20, 0, N}});
    EXPECT_EQ(t.Both("extended acl", [&](auto& b) { return setxattr(P(b, "aclf").c_str(), kAccess, ext.data(), ext.size(), 0); }), 0);
    ASSERT_EQ(lstat(P(s.mnt, "aclf").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0660u);
    EXPECT_EQ(t.Both("chmod with acl", [&](auto& b) { return chmod(P(b, "aclf").c_str(), 0604); }), 0);
    EXPECT_EQ(t.Both("mkdir acld", [&](auto& b) { return mkdir(P(b, "acld").c_str(), 0755); }), 0);
    const std::string def = acl({{1, 7, N}, {2, 5, 1000}, {4, 5, N}, {0x10, 7, N}, {0x20, 5, N}});
    EXPECT_EQ(t.Both("default acl", [&](auto& b) { return setxattr(P(b, "acld").c_str(), kDefault, def.data(), def.size(), 0); }), 0);
    EXPECT_EQ(t.Both("default acl on file", [&](auto& b) { return setxattr(P(b, "aclf").c_str(), kDefault, def.data(), def.size(), 0); }), EACCES);
    EXPECT_EQ(t.Both("create under default acl", [&](auto& b) { return close(open(P(b, "acld/f").c_str(), O_CREAT | O_WRONLY, 0666)); }), 0);
    EXPECT_EQ(t.Both("mkdir under default acl", [&](auto& b) { return mkdir(P(b, "acld/sub").c_str(), 0750); }), 0);
    EXPECT_EQ(t.Both("mkfifo under default acl", [&](auto& b) { return mkfifo(P(b, "acld/fifo").c_str(), 0644); }), 0);
    EXPECT_EQ(t.Both("symlink under default acl", [&](auto& b) { return symlink("f", P(b, "acld/sl").c_str()); }), 0);
    EXPECT_EQ(t.Both("remove default acl", [&](auto& b) { return removexattr(P(b, "acld/sub").c_str(), kDefault); }), 0);
    umask(old_umask);
  }

  // A directory listed in many readdir calls.
  ASSERT_EQ(t.Both("mkdir wide", [&](auto& b) { return mkdir(P(b, "wide").c_str(), 0755); }), 0);
  for (int i = 0; i < 400; ++i) {
    const std::string name = "wide/entry_with_a_longish_name_" + std::to_string(i * 7919 % 1000);
    t.Both("create " + name, [&](auto& b) { return close(open(P(b, name).c_str(), O_CREAT | O_WRONLY, 0644)); });
    if (i % 5 == 0) t.Both("unlink", [&](auto& b) { return unlink(P(b, name).c_str()); });
  }
  EXPECT_EQ(ListDir(P(s.mnt, "wide")), ListDir(P(model, "wide")));
  {
    // A listing resumed with seekdir on a new handle continues where
    // telldir left off (the offsets are DIR_INDEX + 1, stable across opens).
    std::set<std::string> seen;
    DIR* d = opendir(P(s.mnt, "wide").c_str());
    ASSERT_NE(d, nullptr);
    for (int i = 0; i < 150; ++i) {
      dirent* e = readdir(d);
      ASSERT_NE(e, nullptr);
      seen.insert(e->d_name);
    }
    const long pos = telldir(d);
    closedir(d);
    d = opendir(P(s.mnt, "wide").c_str());
    ASSERT_NE(d, nullptr);
    seekdir(d, pos);
    while (dirent* e = readdir(d)) EXPECT_TRUE(seen.insert(e->d_name).second) << e->d_name << " seen twice";
    closedir(d);
    EXPECT_EQ(seen, ListDir(P(model, "wide")));
  }
  EXPECT_EQ(ListDir(s.mnt), ListDir(model));

  // A file unlinked while open stays readable and writable until closed.
  {
    const std::string data = Pattern(20000, 5);
    t.WriteFile("open_unlinked", data, 0, O_CREAT | O_WRONLY, rng);
    int fd = open(P(s.mnt, "open_unlinked").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    t.Both("unlink open", [&](auto& b) { return unlink(P(b, "open_unlinked").c_str()); });
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(st.st_nlink, 0u);
    std::string back(data.size(), '\0');
    ASSERT_EQ(pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_EQ(back, data);
    ASSERT_EQ(pwrite(fd, "more", 4, 20000), 4);
    close(fd);
    std::set<std::string> names = ListDir(s.mnt);
    for (const auto& n : names) EXPECT_EQ(n.find("hidden"), std::string::npos) << n;
  }

  // fallocate: extend (mode 0) and punch a hole.
  t.WriteFile("falloc", Pattern(100000, 6), 0, O_CREAT | O_WRONLY, rng);
  EXPECT_EQ(t.Both("fallocate extend", [&](auto& b) {
    int fd = open(P(b, "falloc").c_str(), O_RDWR);
    int r = fallocate(fd, 0, 50000, 200000);
    close(fd);
    return r;
  }), 0);
  EXPECT_EQ(t.Both("punch hole", [&](auto& b) {
    int fd = open(P(b, "falloc").c_str(), O_RDWR);
    int r = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 10000, 30000);
    close(fd);
    return r;
  }), 0);
  t.CheckContent("falloc");

  // statfs.
  {
    struct statvfs v;
    ASSERT_EQ(statvfs(s.mnt.c_str(), &v), 0);
    EXPECT_EQ(v.f_bsize, 4096u);
    EXPECT_GT(v.f_blocks, 200000u);
    EXPECT_GT(v.f_bavail, 0u);
    EXPECT_EQ(v.f_namemax, 255u);
  }
  // fsync commits.
  {
    int fd = open(P(s.mnt, "h1").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(fsync(fd), 0);
    close(fd);
  }

  // Both trees agree, seen through the mount: mtimes included, as each call
  // left them (and the rules above armed them), never copied across.
  t.ArmPending();
  std::cout << "[ fuse     ] timestamp rules: " << t.times_checked() << " mtimes and " << t.ctimes_checked()
            << " ctimes compared with the host, call by call\n";
  EXPECT_GT(t.times_checked(), 100u);
  EXPECT_GT(t.ctimes_checked(), 20u);
  CompareOptions opts;
  auto mism = ubtrfs_test::CompareHostTrees(model, s.mnt, opts);
  EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);

  std::string err;
  EXPECT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
  EXPECT_FALSE(IsUbtrfsMount(s.mnt));
  std::cout << "[ fuse     ] " << t.ops() << " paired operations" << options << ": "
            << RequestSummary(mount, static_cast<size_t>(t.ops()), "operation") << "\n";
  EXPECT_EQ(BtrfsCheck(s.img), "");
  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  mism = ubtrfs_test::CompareTreeToImage(model, **fs, opts);
  EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
}

TEST(Fuse, PosixOperationsMatchAHostDirectory) {
  SKIP_IF_NO_FUSE();
  PosixOperations("");
}

// The same with the kernel caching writes (it then sends larger writes and
// keeps mtime itself).
TEST(Fuse, PosixOperationsWithWritebackCache) {
  SKIP_IF_NO_FUSE();
  PosixOperations(",writeback_cache");
}

TEST(Fuse, CopyTreeAndTarIntoTheMount) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string src = s.dir.Sub("src");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  auto gen = ubtrfs_test::GenerateTreeWithStats(src, 11, ubtrfs_test::ScaledTreeOptions(500));
  const size_t entries = gen.files + gen.dirs + gen.symlinks + gen.hard_links + gen.fifos + gen.devices;
  CompareOptions opts;
  std::string err;

  // cp -a in one mount session ...
  {
    MountProcess mount;
    START_MOUNT(mount, s, "-o", "stats");
    const auto t0 = std::chrono::steady_clock::now();
    auto r = RunCommand({"cp", "-a", src, s.mnt + "/copy"});
    ASSERT_TRUE(r.ok()) << r.Describe();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto mism = ubtrfs_test::CompareHostTrees(src, s.mnt + "/copy", opts);
    EXPECT_TRUE(mism.empty()) << "cp -a, through the mount: " << FormatMismatches(mism);
    EXPECT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
    std::cout << "[ fuse     ] cp -a of " << gen.Summary() << ": " << secs << " s; cp + compare: "
              << RequestSummary(mount, entries) << "\n";
  }
  EXPECT_EQ(BtrfsCheck(s.img), "");

  // ... then tar x in a second one. tar drops sockets and turns hard-linked
  // fifos into copies: the oracle is the same archive extracted on the host.
  const bool have_tar = !ubtrfs_test::FindProgram("tar").empty();
  const std::string hostx = s.dir.Sub("hostx");
  CompareOptions tar_opts;
  tar_opts.compare_top_attrs = false;
  if (have_tar) {
    MountProcess mount;
    START_MOUNT(mount, s, "-o", "stats");
    const std::string archive = s.dir.Sub("tree.tar");
    const std::vector<std::string> flags = {"--xattrs", "--xattrs-include=*", "--acls"};
    std::vector<std::string> argv = {"tar"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"-C", src, "-cf", archive, "."});
    auto r = RunCommand(argv);
    ASSERT_TRUE(r.ok()) << r.Describe();
    double secs = 0;
    for (const std::string& dest : {hostx, s.mnt + "/tarx"}) {
      ASSERT_EQ(mkdir(dest.c_str(), 0755), 0);
      argv = {"tar"};
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.insert(argv.end(), {"--same-owner", "-p", "-C", dest, "-xf", archive});
      const auto t0 = std::chrono::steady_clock::now();
      r = RunCommand(argv);
      ASSERT_TRUE(r.ok()) << dest << ": " << r.Describe();
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    auto mism = ubtrfs_test::CompareHostTrees(hostx, s.mnt + "/tarx", tar_opts);
    EXPECT_TRUE(mism.empty()) << "tar x, through the mount: " << FormatMismatches(mism);
    // The cp -a copy survived the remount.
    mism = ubtrfs_test::CompareHostTrees(src, s.mnt + "/copy", opts);
    EXPECT_TRUE(mism.empty()) << "cp -a, after a remount: " << FormatMismatches(mism);
    EXPECT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
    std::cout << "[ fuse     ] tar x: " << secs << " s; tar + compares: " << RequestSummary(mount, entries) << "\n";
    EXPECT_EQ(BtrfsCheck(s.img), "");
  }

  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto mism = ubtrfs_test::CompareTreeToImage(src, **fs, opts, "/copy");
  EXPECT_TRUE(mism.empty()) << "cp -a, in the image: " << FormatMismatches(mism);
  if (have_tar) {
    mism = ubtrfs_test::CompareTreeToImage(hostx, **fs, tar_opts, "/tarx");
    EXPECT_TRUE(mism.empty()) << "tar x, in the image: " << FormatMismatches(mism);
  }
}

// Several processes' worth of threads writing, renaming and removing at once
// (the library serializes them; the adapter's own state must hold up).
TEST(Fuse, ConcurrentWritersStayConsistent) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string model = s.dir.Sub("model");
  ASSERT_EQ(mkdir(model.c_str(), 0755), 0);
  MountProcess mount;
  START_MOUNT(mount, s, "-o", "commit=1,threads=8");
  constexpr int kThreads = 6, kFiles = 120;
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    const std::string sub = "/w" + std::to_string(t);
    for (const std::string& base : {model, s.mnt}) mkdir((base + sub).c_str(), 0755);
    for (int i = 0; i < kFiles; ++i) {
      const std::string name = sub + "/f" + std::to_string(i);
      const std::string data = Pattern(rng() % 3 == 0 ? rng() % 400000 : rng() % 5000, rng());
      for (const std::string& base : {model, s.mnt}) {
        int fd = open((base + name).c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0 || write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) ++failures;
        if (fd >= 0) close(fd);
      }
      if (ReadWhole(s.mnt + name) != data) ++failures;
      if (i % 7 == 3) {
        for (const std::string& base : {model, s.mnt}) {
          if (rename((base + name).c_str(), (base + sub + "/r" + std::to_string(i)).c_str()) != 0) ++failures;
        }
      } else if (i % 5 == 1) {
        for (const std::string& base : {model, s.mnt}) {
          if (unlink((base + name).c_str()) != 0) ++failures;
        }
      }
    }
  };
  std::thread lister([&] {
    while (!stop) {
      for (int t = 0; t < kThreads; ++t) ListDir(s.mnt + "/w" + std::to_string(t));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  stop = true;
  lister.join();
  EXPECT_EQ(failures.load(), 0);
  CompareOptions opts;
  opts.compare_mtime = false;
  opts.compare_dir_mtime = false;
  opts.compare_top_attrs = false;
  auto mism = ubtrfs_test::CompareHostTrees(model, s.mnt, opts);
  EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
  std::string err;
  EXPECT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
  EXPECT_EQ(BtrfsCheck(s.img), "");
  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  mism = ubtrfs_test::CompareTreeToImage(model, **fs, opts);
  EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
}

// Requests per small file created with open/write/close, from -o stats.
TEST(Fuse, RoundTripsPerCreatedFile) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  MountProcess mount;
  START_MOUNT(mount, s, "-o", "stats");
  ASSERT_EQ(mkdir((s.mnt + "/d").c_str(), 0755), 0);
  // Let the attribute caches of the directory settle, then count only the files.
  constexpr int kFiles = 500;
  const std::string data(3000, 'x'), big(100000, 'y');
  for (int i = 0; i < kFiles; ++i) {
    const std::string p = s.mnt + "/d/file" + std::to_string(i);
    int fd = open(p.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    ASSERT_GE(fd, 0) << strerror(errno);
    const std::string& d = i % 2 ? big : data;
    ASSERT_EQ(write(fd, d.data(), d.size()), static_cast<ssize_t>(d.size()));
    ASSERT_EQ(close(fd), 0);
  }
  std::string err;
  EXPECT_EQ(mount.Unmount(&err), 0) << err;
  const auto c = mount.Counters();
  uint64_t total = 0;
  std::string breakdown;
  for (const auto& [k, v] : c) {
    total += v;
    breakdown += " " + k + "=" + std::to_string(v);
  }
  std::cout << "[ fuse     ] " << kFiles << " files (3000 B and 100000 B alternating): " << total
            << " requests, " << static_cast<double>(total) / kFiles << " per file;" << breakdown << "\n";
  EXPECT_GE(c.count("create") ? c.at("create") : 0, static_cast<uint64_t>(kFiles));
  EXPECT_LT(static_cast<double>(total) / kFiles, 8.0);
  EXPECT_EQ(BtrfsCheck(s.img), "");
}

TEST(Fuse, SecondMountIsRefusedAndSigtermCommits) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  MountProcess mount;
  START_MOUNT(mount, s);
  {
    const std::string mnt2 = s.dir.Sub("mnt2");
    ASSERT_EQ(mkdir(mnt2.c_str(), 0755), 0);
    for (bool ro : {false, true}) {
      std::vector<std::string> argv = {UBTRFS_CLI_PATH, "mount", "-f", s.img, mnt2};
      if (ro) argv.insert(argv.end(), {"-o", "ro"});
      auto r = RunCommand(argv);
      EXPECT_NE(r.exit_code, 0) << (ro ? "ro: " : "rw: ") << r.Describe();
      EXPECT_NE(r.err.find("in use"), std::string::npos) << r.Describe();
      EXPECT_FALSE(IsUbtrfsMount(mnt2));
    }
  }
  const std::string data = Pattern(300000, 8);
  {
    std::ofstream out(s.mnt + "/kept", std::ios::binary);
    out << data;
  }
  ASSERT_EQ(mkdir((s.mnt + "/dir").c_str(), 0700), 0);
  // SIGTERM: the mount goes away, the changes are committed, exit 0.
  ASSERT_EQ(kill(mount.pid(), SIGTERM), 0);
  EXPECT_EQ(mount.Wait(60), 0) << mount.Log();
  EXPECT_FALSE(IsUbtrfsMount(s.mnt));
  EXPECT_EQ(BtrfsCheck(s.img), "");
  {
    auto fs = ubtrfs::Filesystem::Open(s.img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto id = (*fs)->Lookup("/kept");
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    std::string back(data.size() + 10, '\0');
    auto n = (*fs)->Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(back.data()), back.size()));
    ASSERT_TRUE(n.ok());
    back.resize(*n);
    EXPECT_TRUE(back == data);
    EXPECT_TRUE((*fs)->Lookup("/dir").ok());
  }
  // Released: a read-only mount works now, and refuses writes.
  MountProcess ro;
  {
    std::string skip, error;
    ASSERT_TRUE(ro.Start(s.img, s.mnt, s.log, {"-o", "ro"}, &skip, &error)) << skip << error;
  }
  EXPECT_EQ(ReadWhole(s.mnt + "/kept"), data);
  EXPECT_EQ(mkdir((s.mnt + "/nope").c_str(), 0755), -1);
  EXPECT_EQ(errno, EROFS);
  std::string err;
  EXPECT_EQ(ro.Unmount(&err), 0) << err << ro.Log();
}

}  // namespace

// Issue 15: with -o writeback_cache the kernel keeps a regular file's mtime
// and ctime (it never takes the daemon's again while the inode is cached)
// and sends its own with SETATTR, but only when they changed in its clock's
// coarse tick. A second change within the tick of the one just synced (a
// write, a punched hole, a copy_file_range, an O_TRUNC open) reached the
// daemon with no SETATTR after it, and the daemon's own stamp, a tick later
// than what stat showed, was what got stored. Each file here gets one such
// pair; every stored mtime and ctime must be what stat showed before the
// unmount.
TEST(Fuse, WritebackCacheStoresTheTimesStatShowed) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(256ull << 20), "");
  constexpr int kFiles = 800;
  const std::string data = Pattern(12000, 5);
  struct Seen {
    std::string name;
    struct timespec mtime, ctime;
  };
  std::vector<Seen> seen;
  {
    MountProcess mount;
    START_MOUNT(mount, s, "-o", "writeback_cache");
    const std::string src = s.mnt + "/src";
    {
      std::ofstream out(src, std::ios::binary);
      out << data;
    }
    const int src_fd = open(src.c_str(), O_RDONLY);
    ASSERT_GE(src_fd, 0);
    for (int i = 0; i < kFiles; ++i) {
      const std::string name = "f" + std::to_string(i), path = s.mnt + "/" + name;
      int fd = open(path.c_str(), O_RDWR | O_CREAT, 0644);
      ASSERT_GE(fd, 0) << strerror(errno);
      ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
      ASSERT_EQ(fsync(fd), 0) << strerror(errno);
      switch (i % 4) {
        case 0:
          ASSERT_EQ(pwrite(fd, data.data(), 100, 50), 100);
          break;
        case 1:
          ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0) << strerror(errno);
          break;
        case 2: {
          loff_t in = 0, out = 4096;
          ASSERT_EQ(copy_file_range(src_fd, &in, fd, &out, 4096, 0), 4096) << strerror(errno);
          break;
        }
        case 3: {
          const int t = open(path.c_str(), O_WRONLY | O_TRUNC);
          ASSERT_GE(t, 0) << strerror(errno);
          close(t);
          break;
        }
      }
      close(fd);
    }
    close(src_fd);
    for (int i = 0; i < kFiles; ++i) {
      const std::string name = "f" + std::to_string(i);
      struct stat st {};
      ASSERT_EQ(stat((s.mnt + "/" + name).c_str(), &st), 0);
      seen.push_back({name, st.st_mtim, st.st_ctim});
    }
    std::string err;
    ASSERT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
  }
  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  int mtime_diffs = 0, ctime_diffs = 0;
  std::string first;
  auto same = [](const struct timespec& a, const ubtrfs::Time& b) {
    return a.tv_sec == b.sec && a.tv_nsec == static_cast<long>(b.nsec);
  };
  for (const Seen& e : seen) {
    auto id = (*fs)->Lookup("/" + e.name);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    auto st = (*fs)->GetStat(*id);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    const bool m = same(e.mtime, st->mtime), c = same(e.ctime, st->ctime);
    mtime_diffs += !m;
    ctime_diffs += !c;
    if ((!m || !c) && first.empty()) {
      first = e.name + ": mtime stat " + std::to_string(e.mtime.tv_sec) + "." + std::to_string(e.mtime.tv_nsec) +
              " stored " + std::to_string(st->mtime.sec) + "." + std::to_string(st->mtime.nsec) + ", ctime stat " +
              std::to_string(e.ctime.tv_sec) + "." + std::to_string(e.ctime.tv_nsec) + " stored " +
              std::to_string(st->ctime.sec) + "." + std::to_string(st->ctime.nsec);
    }
  }
  EXPECT_EQ(mtime_diffs, 0) << "of " << kFiles << "; first: " << first;
  EXPECT_EQ(ctime_diffs, 0) << "of " << kFiles << "; first: " << first;
  fs->reset();
  EXPECT_EQ(BtrfsCheck(s.img), "");
}

// Issue 15 (fsstress with writeback_cache: 562 syncfs ENOENT): after the last
// name of a regular file goes, the kernel at once writes its cached times
// back (SETATTR of mtime and ctime on the removed inode). The daemon's
// ENOENT was recorded as a write-back error, so syncfs(2) of the mount, and
// of every descriptor opened before, failed with ENOENT.
TEST(Fuse, WritebackCacheUnlinkLeavesNoWritebackError) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(256ull << 20), "");
  MountProcess mount;
  START_MOUNT(mount, s, "-o", "writeback_cache");
  const int dfd = open(s.mnt.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dfd, 0);
  const std::string data = Pattern(5000, 3);
  for (int i = 0; i < 20; ++i) {
    const std::string a = s.mnt + "/a" + std::to_string(i), b = s.mnt + "/b" + std::to_string(i);
    for (const std::string& p : {a, b}) {
      int fd = open(p.c_str(), O_WRONLY | O_CREAT, 0644);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
      close(fd);
    }
    ASSERT_EQ(unlink(a.c_str()), 0);
    ASSERT_EQ(rename(b.c_str(), (s.mnt + "/kept").c_str()), 0);  // replaces the last one
  }
  errno = 0;
  EXPECT_EQ(syncfs(dfd), 0) << strerror(errno);
  close(dfd);
  std::string err;
  EXPECT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
  EXPECT_EQ(BtrfsCheck(s.img), "");
}
