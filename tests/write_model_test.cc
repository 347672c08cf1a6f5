// Random operation sequences run both on a host directory (the model) and
// through libubtrfs on an image made by mkfs.btrfs. After every commit the
// image must equal the model through ubtrfs's read path; at the end it must
// pass `btrfs check` and, where loop mounts work, the kernel must see the
// same tree.
#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <random>
#include <set>
#include <thread>

#include "check/checker.h"
#include "fs/open_device.h"
#include "io/block_device.h"
#include "support/mkfs_util.h"
#include "support/overlay_image.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "txn/mkfs.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/stats.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::CompareOptions;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

// Opens the image under test for writing.
using Opener = std::function<Result<std::unique_ptr<Filesystem>>()>;

Opener OpenPath(const std::string& image, bool queue_dir_items = false) {
  return [image, queue_dir_items] {
    OpenOptions o;
    o.writable = true;
    if (queue_dir_items) {  // every directory indexed at once, small DIR_ITEM batches
      o.dir_item_index_after = 1;
      o.dir_item_batch = 5;
    }
    return Filesystem::Open(image, o);
  };
}

class ModelRun {
 public:
  ModelRun(std::string host, Opener opener, uint64_t seed) : host_(std::move(host)), opener_(std::move(opener)), rng_(seed) {}

  void Open() {
    auto fs = opener_();
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(*fs);
  }
  void Close() { fs_.reset(); }
  Filesystem& fs() { return *fs_; }

  // One random operation on both sides; their outcomes must agree.
  void Step() {
    const int op = static_cast<int>(rng_() % 100);
    if (op < 14) return Create();
    if (op < 32) return WriteData();
    if (op < 38) return Truncate();
    if (op < 46) return MakeDir();
    if (op < 50) return RemoveDir();
    if (op < 58) return UnlinkFile();
    if (op < 68) return RenameEntry();
    if (op < 72) return LinkFile();
    if (op < 76) return MakeSymlink();
    if (op < 84) return Xattr();
    if (op < 88) return Chmod();
    if (op < 92) return MakeFifo();
    if (op < 97) return FallocateRange();
  }

  std::vector<std::string> Compare() {
    CompareOptions opts;
    return ubtrfs_test::CompareTreeToImage(host_, *fs_, opts);
  }

  int ops() const { return ops_; }

 private:
  std::string Name() {
    static const char* kNames[] = {"a", "b", "c", "d", "e", "f", "long_name_" , "x y", "n\xc3\xa9", "z"};
    return std::string(kNames[rng_() % 10]) + std::to_string(rng_() % 6);
  }
  // A random existing path (relative, "" = top) of the wanted kind, by walking the host model.
  std::string Pick(bool want_dir) {
    std::string cur;
    for (int depth = 0; depth < 6; ++depth) {
      std::vector<std::pair<std::string, bool>> entries;
      if (DIR* d = opendir((host_ + "/" + cur).c_str())) {
        while (dirent* e = readdir(d)) {
          std::string n = e->d_name;
          if (n == "." || n == "..") continue;
          struct stat st;
          if (lstat((host_ + "/" + cur + (cur.empty() ? "" : "/") + n).c_str(), &st) != 0) continue;
          entries.push_back({n, S_ISDIR(st.st_mode)});
        }
        closedir(d);
      }
      std::sort(entries.begin(), entries.end());
      std::vector<std::string> dirs, others;
      for (auto& [n, isdir] : entries) (isdir ? dirs : others).push_back(n);
      if (want_dir && (dirs.empty() || rng_() % 3 == 0)) return cur;
      if (!want_dir && !others.empty() && (dirs.empty() || rng_() % 2 == 0)) {
        return cur + (cur.empty() ? "" : "/") + others[rng_() % others.size()];
      }
      if (dirs.empty()) return want_dir ? cur : "";
      cur += (cur.empty() ? "" : "/") + dirs[rng_() % dirs.size()];
    }
    return want_dir ? cur : "";
  }
  std::string Host(const std::string& rel) { return rel.empty() ? host_ : host_ + "/" + rel; }
  static std::string Join(const std::string& dir, const std::string& name) { return dir.empty() ? name : dir + "/" + name; }
  InodeId Img(const std::string& rel) {
    auto id = fs_->Lookup("/" + rel);
    EXPECT_TRUE(id.ok()) << rel << ": " << id.status().ToString();
    return id.ok() ? *id : InodeId{};
  }
  // Both sides agree: host errno (0 = success) vs the image's status.
  void Agree(const char* what, const std::string& path, int host_errno, const Status& st) {
    ++ops_;
    static const bool trace = std::getenv("UBTRFS_MODEL_TRACE") != nullptr;
    if (trace) std::cout << "  " << what << " " << path << ": " << (host_errno ? strerror(host_errno) : "ok") << "\n";
    EXPECT_EQ(st.code(), host_errno) << what << " " << path << ": host " << strerror(host_errno) << ", image "
                                     << st.ToString();
  }
  // ---- Timestamp rules (the kernel's, per call), asserted on both sides ----
  //
  // Before an operation, Arm() gives each entry it may touch old, distinct
  // times on the image (atime, mtime and ctime) and on the host (atime and
  // mtime; the host's ctime cannot be set) and remembers the inode (the
  // image's id, an O_PATH descriptor on the host, so renames and unlinks do
  // not lose it). After it, Rules() says which of mtime and ctime must have
  // changed on each and checks the image exactly. The host kernel is the
  // oracle for the same table: its mtime answer is always definite (the old
  // value is in the past), its ctime answer when the coarse clock moved past
  // the armed ctime before the operation (waited for on a sample of the
  // operations, so the run stays fast) or when ctime changed.
  struct Armed {
    std::string rel;
    InodeId id{};
    int fd = -1;
    Stat img{};
    struct stat host {};
    bool host_ctime_definite = false;
  };
  struct Want {
    std::string rel;
    bool mtime = false, ctime = false;
  };
  // Where the host's file system (ext4, tmpfs) keeps another rule than
  // btrfs, the host is no oracle: the rule was checked against the kernel's
  // btrfs on a loop mount instead (see the call).
  struct HostDiffers {};
  static bool SameTime(const Time& a, const Time& b) { return a.sec == b.sec && a.nsec == b.nsec; }
  static bool SameTime(const timespec& a, const timespec& b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }

  std::vector<Armed> Arm(std::vector<std::string> rels) {
    std::vector<Armed> out;
    const bool wait = sample_rng_() % 32 == 0;  // each wait costs up to a clock tick (4 ms)
    std::sort(rels.begin(), rels.end());
    rels.erase(std::unique(rels.begin(), rels.end()), rels.end());
    std::set<ino_t> inodes;  // two names of one inode are armed once
    for (const auto& rel : rels) {
      struct stat st;
      if (lstat(Host(rel).c_str(), &st) != 0 || !inodes.insert(st.st_ino).second) continue;
      auto id = fs_->Lookup("/" + rel);
      if (!id.ok()) continue;
      ++clock_;
      const Time t{1500000000 + clock_, static_cast<uint32_t>(clock_ * 104729 % 1000000000)};
      AttrChange c;
      c.atime = c.mtime = c.ctime = t;
      Status s = fs_->SetAttr(*id, c);
      EXPECT_TRUE(s.ok()) << rel << ": " << s.ToString();
      timespec ts[2] = {{t.sec, static_cast<long>(t.nsec)}, {t.sec, static_cast<long>(t.nsec)}};
      EXPECT_EQ(utimensat(AT_FDCWD, Host(rel).c_str(), ts, AT_SYMLINK_NOFOLLOW), 0) << rel;
      Armed a;
      a.rel = rel;
      a.id = *id;
      a.fd = open(Host(rel).c_str(), O_PATH | O_NOFOLLOW);
      EXPECT_GE(a.fd, 0) << rel << ": " << strerror(errno);
      auto is = fs_->GetStat(*id);
      EXPECT_TRUE(is.ok());
      if (is.ok()) a.img = *is;
      EXPECT_EQ(fstat(a.fd, &a.host), 0);
      out.push_back(std::move(a));
    }
    if (wait) {
      // Let the coarse clock (the kernel's current_time()) pass every armed
      // ctime, so a ctime the host leaves alone shows as unchanged.
      for (;;) {
        timespec now;
        clock_gettime(CLOCK_REALTIME_COARSE, &now);
        bool past = true;
        for (const auto& a : out) {
          past = past && (a.host.st_ctim.tv_sec < now.tv_sec ||
                          (a.host.st_ctim.tv_sec == now.tv_sec && a.host.st_ctim.tv_nsec < now.tv_nsec));
        }
        if (past) break;
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      for (auto& a : out) a.host_ctime_definite = true;
    }
    return out;
  }

  // `want` names what the operation changes (by the path it had before);
  // every armed entry not named must keep both times. A failed operation
  // (host errno e != 0) changes nothing.
  void Rules(const std::string& what, std::vector<Armed>& armed, int e, const std::vector<Want>& want) {
    Rules(what, armed, e, want, true);
  }
  void Rules(const std::string& what, std::vector<Armed>& armed, int e, const std::vector<Want>& want, HostDiffers) {
    Rules(what, armed, e, want, false);
  }
  void Rules(const std::string& what, std::vector<Armed>& armed, int e, const std::vector<Want>& want, bool ask_host) {
    for (auto& a : armed) {
      bool wm = false, wc = false;
      if (e == 0) {
        for (const auto& w : want) {
          if (w.rel == a.rel) {
            wm = wm || w.mtime;
            wc = wc || w.ctime;
          }
        }
      }
      struct stat hs;
      const bool host_ok = fstat(a.fd, &hs) == 0;
      close(a.fd);
      a.fd = -1;
      auto is = fs_->GetStat(a.id);
      if (!is.ok() || !host_ok || hs.st_nlink == 0) continue;  // the inode is gone (unlinked, replaced)
      ++rules_checked_;
      const std::string where = what + ": " + (a.rel.empty() ? "/" : a.rel);
      EXPECT_EQ(!SameTime(is->mtime, a.img.mtime), wm) << where << ": the image's mtime";
      EXPECT_EQ(!SameTime(is->ctime, a.img.ctime), wc) << where << ": the image's ctime";
      if (!ask_host) continue;
      // The host kernel agrees with the table.
      EXPECT_EQ(!SameTime(hs.st_mtim, a.host.st_mtim), wm) << where << ": the host's mtime (the rule table is wrong)";
      const bool host_c = !SameTime(hs.st_ctim, a.host.st_ctim);
      if (host_c || a.host_ctime_definite) {
        ++host_ctime_checked_;
        EXPECT_EQ(host_c, wc) << where << ": the host's ctime (the rule table is wrong)";
      }
    }
  }

  // Deterministic times on both sides for what an operation touched.
  void Stamp(const std::vector<std::string>& rels) {
    for (const auto& rel : rels) {
      struct stat st;
      if (lstat(Host(rel).c_str(), &st) != 0) continue;
      ++clock_;
      Time t{1700000000 + clock_, static_cast<uint32_t>(clock_ * 7919 % 1000000000)};
      timespec ts[2] = {{t.sec, static_cast<long>(t.nsec)}, {t.sec, static_cast<long>(t.nsec)}};
      ASSERT_EQ(utimensat(AT_FDCWD, Host(rel).c_str(), ts, AT_SYMLINK_NOFOLLOW), 0);
      AttrChange c;
      c.atime = t;
      c.mtime = t;
      Status s = fs_->SetAttr(Img(rel), c);
      ASSERT_TRUE(s.ok()) << rel << ": " << s.ToString();
    }
  }
  static std::string Parent(const std::string& rel) {
    auto p = rel.rfind('/');
    return p == std::string::npos ? "" : rel.substr(0, p);
  }
  static std::string Base(const std::string& rel) {
    auto p = rel.rfind('/');
    return p == std::string::npos ? rel : rel.substr(p + 1);
  }

  void Create() {
    const std::string dir = Pick(true), name = Name(), rel = Join(dir, name);
    const uint32_t mode = 0600 | (rng_() % 2 ? 044 : 0);
    auto armed = Arm({dir, rel});
    int fd = open(Host(rel).c_str(), O_CREAT | O_EXCL | O_WRONLY, mode);
    const int e = fd < 0 ? errno : 0;
    if (fd >= 0) {
      fchmod(fd, mode);
      close(fd);
    }
    NewInode a;
    a.mode = mode;
    Agree("create", rel, e, fs_->Create(Img(dir), name, a).status());
    Rules("create", armed, e, {{dir, true, true}});
    if (!e) Stamp({rel, dir});
  }
  void WriteData() {
    const std::string rel = Pick(false);
    struct stat st;
    if (rel.empty() || lstat(Host(rel).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    const uint64_t off = rng_() % 3 == 0 ? st.st_size : rng_() % 400000;
    const size_t len = 1 + rng_() % (rng_() % 4 == 0 ? 300000 : 5000);
    std::vector<uint8_t> data(len);
    const uint8_t fill = static_cast<uint8_t>(rng_());
    for (size_t i = 0; i < len; ++i) data[i] = rng_() % 5 == 0 ? static_cast<uint8_t>(rng_()) : fill;
    if (rng_() % 8 == 0) std::fill(data.begin(), data.end(), 0);  // zero runs become holes
    auto armed = Arm({rel});
    int fd = open(Host(rel).c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, data.data(), len, static_cast<off_t>(off)), static_cast<ssize_t>(len));
    close(fd);
    auto n = fs_->Write(Img(rel), off, data);
    Agree("write", rel, 0, n.status());
    Rules("write", armed, 0, {{rel, true, true}});
    Stamp({rel});
  }
  void Truncate() {
    const std::string rel = Pick(false);
    struct stat st;
    if (rel.empty() || lstat(Host(rel).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    uint64_t size = rng_() % 2 ? rng_() % (st.st_size + 1) : rng_() % 500000;
    if (sample_rng_() % 8 == 0) size = static_cast<uint64_t>(st.st_size);  // to the size it has
    auto armed = Arm({rel});
    ASSERT_EQ(truncate(Host(rel).c_str(), static_cast<off_t>(size)), 0);
    AttrChange c;
    c.size = size;
    Agree("truncate", rel, 0, fs_->SetAttr(Img(rel), c));
    // truncate(2) stamps mtime and ctime only when the size changes: so
    // btrfs (kernel 6.18 on a loop mount: truncate(2) to the size a file
    // has leaves both times alone), while ext4, the usual model, stamps
    // both; the host is not asked then.
    const bool resized = size != static_cast<uint64_t>(st.st_size);
    if (resized) {
      Rules("truncate", armed, 0, {{rel, true, true}});
    } else {
      Rules("truncate to the same size", armed, 0, {{rel, false, false}}, HostDiffers{});
    }
    Stamp({rel});
  }
  void MakeDir() {
    const std::string dir = Pick(true), name = Name(), rel = Join(dir, name);
    auto armed = Arm({dir, rel});
    const int e = mkdir(Host(rel).c_str(), 0755) ? errno : 0;
    NewInode a;
    a.mode = 0755;
    Agree("mkdir", rel, e, fs_->Mkdir(Img(dir), name, a).status());
    Rules("mkdir", armed, e, {{dir, true, true}});
    if (!e) Stamp({rel, dir});
  }
  void RemoveDir() {
    const std::string rel = Pick(true);
    if (rel.empty()) return;
    auto armed = Arm({Parent(rel), rel});
    const int e = rmdir(Host(rel).c_str()) ? errno : 0;
    Agree("rmdir", rel, e, fs_->Rmdir(Img(Parent(rel)), Base(rel)));
    Rules("rmdir", armed, e, {{Parent(rel), true, true}});
    if (!e) Stamp({Parent(rel)});
  }
  void UnlinkFile() {
    const std::string rel = Pick(false);
    if (rel.empty()) return;
    auto armed = Arm({Parent(rel), rel});
    const int e = unlink(Host(rel).c_str()) ? errno : 0;
    Agree("unlink", rel, e, fs_->Unlink(Img(Parent(rel)), Base(rel)));
    // The directory's mtime and ctime; the inode's ctime (seen when it has
    // another name left).
    Rules("unlink", armed, e, {{Parent(rel), true, true}, {rel, false, true}});
    if (!e) Stamp({Parent(rel)});
  }
  void RenameEntry() {
    const std::string src = rng_() % 3 == 0 ? Pick(true) : Pick(false);
    if (src.empty()) return;
    const std::string dir = Pick(true);
    const std::string name = rng_() % 4 == 0 ? Base(src) : Name();
    const std::string dst = Join(dir, name);
    const unsigned flags = rng_() % 6 == 0 ? RENAME_NOREPLACE : (rng_() % 8 == 0 ? RENAME_EXCHANGE : 0);
    // Renaming a name onto another name of the same inode (or onto itself)
    // succeeds and changes nothing.
    struct stat ss, ds;
    const bool same_inode = lstat(Host(src).c_str(), &ss) == 0 && lstat(Host(dst).c_str(), &ds) == 0 &&
                            ss.st_ino == ds.st_ino;
    auto armed = Arm({Parent(src), dir, src, dst});
    const int e = renameat2(AT_FDCWD, Host(src).c_str(), AT_FDCWD, Host(dst).c_str(), flags) ? errno : 0;
    const unsigned uflags = flags == RENAME_NOREPLACE ? kRenameNoReplace : flags == RENAME_EXCHANGE ? kRenameExchange : 0;
    auto old_dir = Img(Parent(src));
    auto new_dir = fs_->Lookup("/" + dir);
    ASSERT_TRUE(new_dir.ok());
    Agree("rename", src + " -> " + dst, e, fs_->Rename(old_dir, Base(src), *new_dir, name, uflags));
    // Both directories' mtime and ctime; the renamed inode's ctime, not its
    // mtime; the inode it replaces or is exchanged with: ctime.
    std::vector<Want> want;
    if (!same_inode) want = {{Parent(src), true, true}, {dir, true, true}, {src, false, true}, {dst, false, true}};
    Rules(flags == RENAME_EXCHANGE ? "rename exchange" : "rename", armed, e, want);
    if (!e) Stamp({Parent(src), dir, dst, flags == RENAME_EXCHANGE ? src : ""});
  }
  void LinkFile() {
    const std::string src = Pick(false);
    if (src.empty()) return;
    const std::string dir = Pick(true), name = Name(), dst = Join(dir, name);
    auto armed = Arm({src, dir});
    const int e = link(Host(src).c_str(), Host(dst).c_str()) ? errno : 0;
    Agree("link", src + " -> " + dst, e, fs_->Link(Img(src), Img(dir), name));
    Rules("link", armed, e, {{src, false, true}, {dir, true, true}});
    if (!e) Stamp({src, dir});
  }
  void MakeSymlink() {
    const std::string dir = Pick(true), name = Name(), rel = Join(dir, name);
    const std::string target = std::string(1 + rng_() % 300, 't') + "/" + Name();
    auto armed = Arm({dir, rel});
    const int e = symlink(target.c_str(), Host(rel).c_str()) ? errno : 0;
    Agree("symlink", rel, e, fs_->Symlink(Img(dir), name, target, NewInode{}).status());
    Rules("symlink", armed, e, {{dir, true, true}});
    if (!e) Stamp({rel, dir});
  }
  void MakeFifo() {
    const std::string dir = Pick(true), name = Name(), rel = Join(dir, name);
    auto armed = Arm({dir, rel});
    const int e = mkfifo(Host(rel).c_str(), 0640) ? errno : 0;
    NewInode a;
    a.mode = S_IFIFO | 0640;
    Agree("mkfifo", rel, e, fs_->Mknod(Img(dir), name, a).status());
    Rules("mkfifo", armed, e, {{dir, true, true}});
    if (!e) Stamp({rel, dir});
  }
  void FallocateRange() {
    const std::string rel = Pick(false);
    struct stat st;
    if (rel.empty() || lstat(Host(rel).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    static const int kModes[] = {0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                 FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE};
    const int mode = kModes[rng_() % 5];
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    const uint64_t off = rng_() % 2 ? rng_() % (size + 1) : rng_() % 400000;
    const uint64_t len = 1 + rng_() % (rng_() % 4 == 0 ? 300000 : 20000);
    int fd = open(Host(rel).c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << rel;
    int e = 0;
    if (mode & FALLOC_FL_ZERO_RANGE) {
      // tmpfs (a model directory) has no ZERO_RANGE: the same bytes by hand.
      const uint64_t end = (mode & FALLOC_FL_KEEP_SIZE) ? std::min(off + len, size) : off + len;
      if (off < end) {
        std::vector<uint8_t> zeros(end - off, 0);
        e = pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(off)) == static_cast<ssize_t>(zeros.size()) ? 0 : errno;
      }
    } else {
      e = fallocate(fd, mode, static_cast<off_t>(off), static_cast<off_t>(len)) ? errno : 0;
    }
    close(fd);
    Agree("fallocate", rel + " mode " + std::to_string(mode) + " [" + std::to_string(off) + ", +" + std::to_string(len) + ")",
          e, fs_->Fallocate(Img(rel), mode, off, len));
    Stamp({rel});
  }
  void Xattr() {
    const std::string rel = rng_() % 3 == 0 ? Pick(true) : Pick(false);
    struct stat st;
    if (lstat(Host(rel).c_str(), &st) != 0 || S_ISLNK(st.st_mode) || S_ISFIFO(st.st_mode)) return;
    const std::string name = "user.k" + std::to_string(rng_() % 8);
    auto armed = Arm({rel});
    // An xattr change stamps ctime only; a failed one (ENODATA) nothing.
    if (rng_() % 3 == 0) {
      const int e = lremovexattr(Host(rel).c_str(), name.c_str()) ? errno : 0;
      Agree("removexattr", rel, e, fs_->RemoveXattr(Img(rel), name));
      Rules("removexattr", armed, e, {{rel, false, true}});
    } else {
      const std::string value(rng_() % 300,  // ext4 (the model) holds about 4 KiB of xattrs per inode
                               static_cast<char>('a' + rng_() % 26));
      const int e = lsetxattr(Host(rel).c_str(), name.c_str(), value.data(), value.size(), 0) ? errno : 0;
      Agree("setxattr", rel, e, fs_->SetXattr(Img(rel), name, value, 0));
      Rules("setxattr", armed, e, {{rel, false, true}});
    }
    Stamp({rel});
  }
  void Chmod() {
    const std::string rel = Pick(rng_() % 3 == 0);
    struct stat st;
    if (lstat(Host(rel).c_str(), &st) != 0 || S_ISLNK(st.st_mode)) return;
    const uint32_t mode = (S_ISDIR(st.st_mode) ? 0700 : 0600) | (rng_() % 0100);
    auto armed = Arm({rel});
    ASSERT_EQ(chmod(Host(rel).c_str(), mode), 0);
    AttrChange c;
    c.mode = mode;
    Agree("chmod", rel, 0, fs_->SetAttr(Img(rel), c));
    Rules("chmod", armed, 0, {{rel, false, true}});
    Stamp({rel});
  }

  std::string host_;
  Opener opener_;
  std::mt19937_64 rng_;
  std::unique_ptr<Filesystem> fs_;
  int ops_ = 0;
  int64_t clock_ = 0;
  std::mt19937_64 sample_rng_{12345};  // apart from rng_: the operations stay those of the seed
  uint64_t rules_checked_ = 0, host_ctime_checked_ = 0;

 public:
  uint64_t rules_checked() const { return rules_checked_; }
  uint64_t host_ctime_checked() const { return host_ctime_checked_; }
};

using ubtrfs_test::BtrfsCheck;

void RunModel(uint64_t seed, int steps, uint32_t nodesize, bool kernel_round_trip = true, bool queue_dir_items = false) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-model");
  const std::string host = dir.Sub("host"), img = dir.Sub("img"), snap = dir.Sub("snap"), crash = dir.Sub("crash");
  int crash_checks = 0;
  ASSERT_EQ(mkdir(host.c_str(), 0755), 0);
  auto r = RunCommand({"truncate", "-s", "1G", img});
  ASSERT_TRUE(r.ok());
  // Plain mkfs (not --rootdir) leaves room in the data chunk.
  r = RunCommand({"mkfs.btrfs", "-q", "-f", "--nodesize", std::to_string(nodesize), img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  // The top directory's attributes come from mkfs; match them on the host.
  ASSERT_EQ(chmod(host.c_str(), 0755), 0);

  if (queue_dir_items) ResetStats();
  ModelRun run(host, OpenPath(img, queue_dir_items), seed);
  run.Open();
  {
    // Same top-directory times on both sides.
    AttrChange c;
    c.atime = c.mtime = Time{1600000000, 0};
    ASSERT_TRUE(run.fs().SetAttr(run.fs().Root(), c).ok());
    timespec ts[2] = {{1600000000, 0}, {1600000000, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, host.c_str(), ts, 0), 0);
  }
  for (int i = 0; i < steps; ++i) {
    run.Step();
    if (::testing::Test::HasFailure()) {
      dir.Keep();
      FAIL() << "seed " << seed << " step " << i;
    }
    if (i % 97 == 96) {
      ASSERT_TRUE(run.fs().Commit().ok());
      auto mism = run.Compare();
      if (!mism.empty()) dir.Keep();
      ASSERT_TRUE(mism.empty()) << "seed " << seed << " step " << i << "\n" << ubtrfs_test::FormatMismatches(mism);
      // Remember the committed state for the crash check below.
      ubtrfs_test::RemoveTree(snap);
      ASSERT_TRUE(RunCommand({"cp", "-a", host, snap}).ok());
    }
    if (i % 97 == 60 && i > 97) {
      // A power cut now, in the middle of a transaction: the image on disk
      // must be exactly the last committed state, check-clean. This is what
      // the clone bitmaps buy: nothing freed since the commit was reused.
      ASSERT_TRUE(RunCommand({"cp", "--sparse=always", img, crash}).ok());
      ASSERT_EQ(BtrfsCheck(crash), "") << "mid-transaction image, seed " << seed << " step " << i;
      auto cfs = Filesystem::Open(crash);
      ASSERT_TRUE(cfs.ok()) << cfs.status().ToString();
      auto mism = ubtrfs_test::CompareTreeToImage(snap, **cfs, CompareOptions{});
      if (!mism.empty()) dir.Keep();
      ASSERT_TRUE(mism.empty()) << "mid-transaction image differs from the last commit, seed " << seed << " step "
                                << i << "\n" << ubtrfs_test::FormatMismatches(mism);
      ++crash_checks;
    }
    if (i % 331 == 330) {  // close and reopen: everything must have been committed
      run.Close();
      ASSERT_EQ(BtrfsCheck(img), "") << "seed " << seed << " step " << i;
      ubtrfs_test::RemoveTree(snap);
      ASSERT_TRUE(RunCommand({"cp", "-a", host, snap}).ok());
      run.Open();
    }
  }
  EXPECT_GT(crash_checks, 0);
  EXPECT_GT(run.rules_checked(), 0u);
  std::cout << "[ times     ] seed " << seed << ": " << run.rules_checked()
            << " mtime/ctime rules checked on the image and the host (" << run.host_ctime_checked()
            << " host ctime answers)\n";
  run.Close();
  if (queue_dir_items) {  // the run went through the queue, its flushes, fallbacks and negative lookups
    const StatsSnapshot st = CollectStats();
    auto count = [&](const std::string& name) {
      for (const auto& c : st.counters) {
        if (c.name == name) return c.value;
      }
      return uint64_t{0};
    };
    EXPECT_GT(count("dir_items.queued"), 100u);
    EXPECT_EQ(count("dir_items.flushed"), count("dir_items.queued"));
    EXPECT_GT(count("dir_items.fallbacks"), 0u);
    EXPECT_GT(count("dir_items.negative"), 0u);
  }
  const std::string check = BtrfsCheck(img);
  if (!check.empty()) dir.Keep();
  ASSERT_EQ(check, "") << "seed " << seed;
  {
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    auto mism = ubtrfs_test::CompareTreeToImage(host, **fs, CompareOptions{});
    ASSERT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
  }
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    std::cout << "[  SKIPPED ] kernel comparison: " << why << "\n";
    return;
  }
  const std::string mnt = dir.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    auto mism = ubtrfs_test::CompareHostTrees(host, mnt, CompareOptions{});
    EXPECT_TRUE(mism.empty()) << "kernel view differs:\n" << ubtrfs_test::FormatMismatches(mism);
    ASSERT_EQ(m.Unmount(), "");
  }
  if (!kernel_round_trip) return;
  // The kernel changes what we wrote; we change what the kernel wrote.
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, ""), "");
    for (const std::string& root : {host, mnt}) {
      ASSERT_TRUE(RunCommand({"mkdir", "-p", root + "/kernel/sub"}).ok());
      ASSERT_TRUE(RunCommand({"cp", "-L", "/etc/os-release", root + "/kernel/sub/osr"}).ok());
      ASSERT_TRUE(RunCommand({"sh", "-c", "seq 1 100000 > '" + root + "/kernel/numbers'"}).ok());
      ASSERT_TRUE(RunCommand({"touch", "-h", "-d", "2020-01-02 03:04:05", root + "/kernel/sub/osr", root + "/kernel/numbers",
                              root + "/kernel/sub", root + "/kernel", root}).ok());
    }
    ASSERT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(BtrfsCheck(img), "") << "after the kernel's changes";
  run.Open();
  for (int i = 0; i < 300 && !::testing::Test::HasFailure(); ++i) run.Step();
  run.Close();
  ASSERT_EQ(BtrfsCheck(img), "") << "after our changes on top of the kernel's, seed " << seed;
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  auto mism = ubtrfs_test::CompareTreeToImage(host, **fs, CompareOptions{});
  EXPECT_TRUE(mism.empty()) << ubtrfs_test::FormatMismatches(mism);
}

TEST(WriteModel, RandomOpsSeed1Node16K) { RunModel(1, 1200, 16384); }
TEST(WriteModel, RandomOpsSeed2Node4K) { RunModel(2, 1200, 4096); }
// Every directory's DIR_ITEMs through the name-hash index and its queue:
// lookups, renames, unlinks and links meet queued entries all the time.
TEST(WriteModel, RandomOpsQueuedDirItems) { RunModel(3, 1200, 16384, /*kernel_round_trip=*/true, /*queue_dir_items=*/true); }
// Many short sequences, each from a fresh image.
TEST(WriteModel, ShortSequences) {
  for (uint64_t seed = 10; seed < 22 && !::testing::Test::HasFailure(); ++seed) {
    RunModel(seed, 250, seed % 2 ? 4096 : 16384, /*kernel_round_trip=*/false);
  }
}

// ---- Many short sequences ------------------------------------------------------------------------
//
// Thousands of short random sequences per run, each from a template image
// (mkfs.btrfs with 4 KiB and 16 KiB nodes, and ubtrfs's own mkfs) seen
// through a copy-on-write overlay in memory, against a model directory on
// tmpfs. Every sequence: the model compared through ubtrfs's read path after
// a mid-sequence commit and at the end, again after reopening read-only,
// and ubtrfs's checker (src/check) on the final image; every kBtrfsCheckEvery-th
// sequence also goes to btrfs check as a real image file.
// UBTRFS_MODEL_SEQUENCES=N changes the count (default 4000; 2500 under ASan).

// About a minute and a half on two busy cores either way: the ASan+UBSan
// build CI runs is some three times slower.
#if defined(__SANITIZE_ADDRESS__)
constexpr uint64_t kDefaultSequences = 2500;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr uint64_t kDefaultSequences = 2500;
#else
constexpr uint64_t kDefaultSequences = 4000;
#endif
#else
constexpr uint64_t kDefaultSequences = 4000;
#endif

struct SequenceTotals {
  std::atomic<uint64_t> sequences{0}, ops{0}, compares{0}, our_checks{0}, btrfs_checks{0};
};

std::string ScratchBase() {
  struct stat st;
  if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return "/tmp";
}

// One sequence; failures are reported through gtest (and stop the sequence).
void RunShortSequence(uint64_t seed, const std::string& base_image, const std::string& scratch, bool btrfs_check,
                      SequenceTotals* totals) {
  auto overlay = ubtrfs_test::OverlayImage::Open(base_image);
  ASSERT_TRUE(overlay.ok()) << overlay.status().ToString();
  std::shared_ptr<ubtrfs_test::OverlayImage> img = *overlay;
  const std::string host = scratch + "/host" + std::to_string(seed);
  ASSERT_EQ(mkdir(host.c_str(), 0755), 0) << host << ": " << strerror(errno);
  struct Cleanup {
    std::string path;
    ~Cleanup() { ubtrfs_test::RemoveTree(path); }
  } cleanup{host};
  auto open_writable = [img]() -> Result<std::unique_ptr<Filesystem>> {
    OpenOptions o;
    o.writable = true;
    o.node_cache_bytes = 4 << 20;
    return OpenOnDevice(img->Device(), o);
  };
  ModelRun run(host, open_writable, seed);
  run.Open();
  if (::testing::Test::HasFailure()) return;
  {
    // The top directory: the image's mode on the host, the same times on both.
    auto st = run.fs().GetStat(run.fs().Root());
    ASSERT_TRUE(st.ok());
    ASSERT_EQ(chmod(host.c_str(), st->mode & 07777), 0);
    AttrChange c;
    c.atime = c.mtime = Time{1600000000, 0};
    ASSERT_TRUE(run.fs().SetAttr(run.fs().Root(), c).ok());
    timespec ts[2] = {{1600000000, 0}, {1600000000, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, host.c_str(), ts, 0), 0);
  }
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull);
  const int steps = 10 + static_cast<int>(rng() % 50);
  const int mid = static_cast<int>(rng() % steps);
  for (int i = 0; i < steps; ++i) {
    run.Step();
    if (::testing::Test::HasFailure()) FAIL() << "seed " << seed << " step " << i;
    if (i == mid) {
      ASSERT_TRUE(run.fs().Commit().ok());
      auto mism = run.Compare();
      ++totals->compares;
      ASSERT_TRUE(mism.empty()) << "seed " << seed << " after step " << i << "\n" << ubtrfs_test::FormatMismatches(mism);
    }
  }
  ASSERT_TRUE(run.fs().Commit().ok());
  {
    auto mism = run.Compare();
    ++totals->compares;
    ASSERT_TRUE(mism.empty()) << "seed " << seed << " at the end\n" << ubtrfs_test::FormatMismatches(mism);
  }
  totals->ops += static_cast<uint64_t>(run.ops());
  run.Close();
  {
    auto vol = txn::Volume::Open(img->Device(), txn::VolumeOptions{});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    const check::CheckResult r = check::CheckVolume(**vol);
    ++totals->our_checks;
    std::string errors;
    for (const auto& e : r.errors) errors += "  " + e + "\n";
    ASSERT_TRUE(r.clean()) << "seed " << seed << ": ubtrfs check found " << r.error_count << " errors\n" << errors;
  }
  {
    auto fs = OpenOnDevice(img->Device(), OpenOptions{});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto mism = ubtrfs_test::CompareTreeToImage(host, **fs, CompareOptions{});
    ++totals->compares;
    ASSERT_TRUE(mism.empty()) << "seed " << seed << " reopened\n" << ubtrfs_test::FormatMismatches(mism);
  }
  if (btrfs_check) {
    const std::string file = scratch + "/img" + std::to_string(seed);
    ASSERT_TRUE(img->WriteTo(file).ok());
    const std::string out = BtrfsCheck(file);
    unlink(file.c_str());
    ++totals->btrfs_checks;
    ASSERT_EQ(out, "") << "seed " << seed;
  }
  ++totals->sequences;
}

TEST(WriteModel, ManyShortSequences) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  const char* env = std::getenv("UBTRFS_MODEL_SEQUENCES");
  uint64_t count = env ? std::strtoull(env, nullptr, 10) : kDefaultSequences;
  // UBTRFS_MODEL_SEED=S reruns the one sequence with seed S (as a failure names it).
  const char* only = std::getenv("UBTRFS_MODEL_SEED");
  uint64_t first = 1000;
  if (only) {
    first = std::strtoull(only, nullptr, 10);
    count = 1;
  }
  constexpr uint64_t kBtrfsCheckEvery = 8;
  TempDir dir("ubtrfs-many");
  // The templates: small images, made once.
  std::vector<std::string> templates;
  for (const char* nodesize : {"4096", "16384"}) {
    const std::string img = dir.Sub(std::string("mkfs-btrfs-") + nodesize);
    ASSERT_TRUE(RunCommand({"truncate", "-s", "160M", img}).ok());
    auto r = RunCommand({"mkfs.btrfs", "-q", "-f", "--nodesize", nodesize, img});
    ASSERT_TRUE(r.ok()) << r.Describe();
    templates.push_back(img);
  }
  {
    const std::string img = dir.Sub("ubtrfs-mkfs");
    ASSERT_TRUE(RunCommand({"truncate", "-s", "160M", img}).ok());
    auto dev = io::OpenFileDevice(img, io::OpenFlags{true});
    ASSERT_TRUE(dev.ok());
    txn::MkfsOptions opts;
    opts.nodesize = 4096;
    ASSERT_TRUE(txn::MakeFilesystem(dev->get(), opts).ok());
    templates.push_back(img);
  }
  std::string scratch = ScratchBase() + "/ubtrfs-many-XXXXXX";
  ASSERT_NE(mkdtemp(scratch.data()), nullptr) << strerror(errno);
  SequenceTotals totals;
  const auto t0 = std::chrono::steady_clock::now();
  // Two workers (the CI machine has two cores); sequence i uses template i % 3.
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (;;) {
      const uint64_t i = next++;
      if (i >= count || failed) return;
      const uint64_t seed = first + i;
      RunShortSequence(seed, templates[(seed - 1000) % templates.size()], scratch,
                       only || (seed - 1000) % kBtrfsCheckEvery == 0, &totals);
      if (::testing::Test::HasFailure() && !failed.exchange(true)) {
        std::cout << "[ failed    ] first failing sequence: rerun with UBTRFS_MODEL_SEED=" << seed << "\n";
      }
    }
  };
  std::thread other(worker);
  worker();
  other.join();
  ubtrfs_test::RemoveTree(scratch);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ sequences ] " << totals.sequences << " sequences, " << totals.ops << " operations, "
            << totals.compares << " model comparisons, " << totals.our_checks << " ubtrfs checks, "
            << totals.btrfs_checks << " btrfs checks in " << secs << " s\n";
  EXPECT_EQ(totals.sequences, count);
}

// UBTRFS_SOAK_SEEDS=N runs N more seeds, longer.
TEST(WriteModel, Soak) {
  const char* env = std::getenv("UBTRFS_SOAK_SEEDS");
  const int seeds = env ? std::atoi(env) : 0;
  if (seeds == 0) GTEST_SKIP() << "set UBTRFS_SOAK_SEEDS=N for the long run";
  for (int s = 0; s < seeds && !::testing::Test::HasFailure(); ++s) RunModel(100 + s, 3000, s % 2 ? 4096 : 16384);
}

}  // namespace
