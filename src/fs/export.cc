// Copy out of an image (the mirror of import.cc), through the public API
// only. Every host object is made relative to its parent directory's
// descriptor with a name the read path has validated, so that a hostile
// image can neither climb out of the destination ("..", '/') nor write
// through a symlink it planted (a symlink and a directory of one name).
#include "ubtrfs/export.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "fs/dir_names.h"

namespace ubtrfs {
namespace {

using fsimpl::PrintableName;

// Inodes of a subvolume are numbered from 256 (BTRFS_FIRST_FREE_OBJECTID);
// below that only the stand-in directory of a subvolume left out of a
// snapshot is ever handed out.
constexpr uint64_t kFirstInodeNumber = 256;

// An open descriptor, closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Opens the directory `rel` (components we created in this run) beneath
// `root`, following no symlink: openat2's RESOLVE_BENEATH where the kernel
// has it, one O_NOFOLLOW component at a time elsewhere.
Fd OpenBeneath(int root, const std::string& rel) {
  if (rel.empty()) return Fd(::fcntl(root, F_DUPFD_CLOEXEC, 0));
  struct open_how how {};
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const long fd = ::syscall(SYS_openat2, root, rel.c_str(), &how, sizeof how);
  if (fd >= 0) return Fd(static_cast<int>(fd));
  if (errno != ENOSYS && errno != EPERM) return Fd();
  Fd cur(::fcntl(root, F_DUPFD_CLOEXEC, 0));
  size_t pos = 0;
  while (cur.ok() && pos < rel.size()) {
    size_t slash = rel.find('/', pos);
    if (slash == std::string::npos) slash = rel.size();
    const std::string comp = rel.substr(pos, slash - pos);
    pos = slash + 1;
    if (comp.empty()) continue;
    if (comp == "..") return Fd();
    cur = Fd(::openat(cur.get(), comp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  }
  return cur;
}

bool IsZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i]) return false;
  }
  return true;
}

class Exporter {
 public:
  Exporter(Filesystem& fs, const ExportOptions& o, ExportReport* r)
      : fs_(fs), opts_(o), report_(r), buf_(1 << 20), privileged_(o.privileged.value_or(::geteuid() == 0)) {}

  Status Run(InodeId src, std::string_view src_name, const std::string& dest) {
    std::string d = dest;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const size_t slash = d.find_last_of('/');
    std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : d.substr(0, slash));
    std::string base = slash == std::string::npos ? d : d.substr(slash + 1);
    if (base.empty() || base == "." || base == "..") {
      // "out/." or "/": the destination directory itself.
      parent = d;
      base.clear();
    }
    root_ = Fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root_.ok()) return Status::Error(errno, dest + ": cannot open " + parent + ": " + std::strerror(errno));
    if (base.empty()) {
      // Copy a directory's contents straight into the destination.
      auto st = fs_.GetStat(src);
      if (!st.ok()) return st.status().WithContext(std::string(src_name));
      if (!S_ISDIR(st->mode)) return Status::Error(EISDIR, dest + " is a directory; name the file to create");
      dirs_seen_.insert({src.root, src.ino});
      CopyDirInto(src, *st, root_.get(), std::string(src_name), d, "");
    } else {
      Copy(src, root_.get(), base, std::string(src_name), d, base);
    }
    if (report_ != nullptr) *report_ = counts_;
    if (counts_.errors != 0) {
      return Status::Error(EIO, std::to_string(counts_.errors) + " error(s) copying " + std::string(src_name) +
                                    " to " + dest);
    }
    return Status::Ok();
  }

 private:
  void Warn(const std::string& m) {
    ++counts_.warnings;
    if (opts_.on_message) opts_.on_message(false, m);
  }
  void Error(const std::string& m) {
    ++counts_.errors;
    if (opts_.on_message) opts_.on_message(true, m);
  }
  void Error(const std::string& what, const Status& st) { Error(what + ": " + st.message()); }
  void ErrorErrno(const std::string& what, const std::string& op) {
    Error(what + ": " + op + ": " + std::strerror(errno));
  }
  // A damaged-image finding: a warning, or an error when strict.
  void Finding(const std::string& m) {
    if (opts_.strict) {
      Error(m);
    } else {
      Warn(m + ", skipped");
    }
  }

  // Copies `id` as `name` inside the host directory `pfd`. `src`/`dst` name
  // both sides in messages; `rel` is the path from root_, for hard links.
  void Copy(InodeId id, int pfd, const std::string& name, const std::string& src, const std::string& dst,
            const std::string& rel) {
    auto st = fs_.GetStat(id);
    if (!st.ok()) return Error(src, st.status());
    if (S_ISDIR(st->mode)) {
      // The empty stand-in for a subvolume a snapshot does not hold is
      // inode 2 wherever it appears (each snapshot of its parent has one),
      // and it has no entries to loop through: never "already copied".
      const bool stand_in = id.ino < kFirstInodeNumber;
      if (!stand_in && !dirs_seen_.insert({id.root, id.ino}).second) {
        return Finding(src + ": a directory that was already copied (a directory loop or a hard-linked directory)");
      }
      // An existing directory is merged into.
      if (::mkdirat(pfd, name.c_str(), 0700) != 0 && errno != EEXIST) return ErrorErrno(dst, "mkdir");
      Fd fd(::openat(pfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.ok()) {
        if (errno == ELOOP || errno == ENOTDIR) {
          return Error(dst + ": exists and is not a directory (a symlink there is never followed); not copied into");
        }
        return ErrorErrno(dst, "open");
      }
      ++counts_.dirs;
      CopyDirInto(id, *st, fd.get(), src, dst, rel);
      return;
    }
    if (st->nlink > 1) {
      auto it = links_.find({id.root, id.ino});
      if (it != links_.end()) return HardLink(it->second, pfd, name, dst);
    }
    if (!MakeRoom(pfd, name, dst)) return;
    bool made = false;
    switch (st->mode & S_IFMT) {
      case S_IFREG:
        made = CopyFile(id, *st, pfd, name, src, dst);
        break;
      case S_IFLNK: {
        auto target = fs_.ReadLink(id);
        if (!target.ok()) return Error(src, target.status());
        if (target->find('\0') != std::string::npos) return Finding(src + ": symlink target holds a NUL byte");
        if (::symlinkat(target->c_str(), pfd, name.c_str()) != 0) return ErrorErrno(dst, "symlink");
        ++counts_.symlinks;
        made = FinishAt(id, *st, pfd, name, src, dst);
        break;
      }
      case S_IFCHR:
      case S_IFBLK:
        if (!opts_.devices || !privileged_) {
          return Warn(dst + ": device node not made (" +
                      (opts_.devices ? "only a privileged copy makes device nodes" : "--no-devices") + ")");
        }
        [[fallthrough]];
      case S_IFIFO:
      case S_IFSOCK:
        if (::mknodat(pfd, name.c_str(), (st->mode & S_IFMT) | 0600, static_cast<dev_t>(st->rdev)) != 0) {
          return ErrorErrno(dst, "mknod");
        }
        ++counts_.specials;
        made = FinishAt(id, *st, pfd, name, src, dst);
        break;
      default:
        return Finding(src + ": unknown file type " + std::to_string(st->mode >> 12));
    }
    if (made && st->nlink > 1) links_[{id.root, id.ino}] = rel;
  }

  void CopyDirInto(InodeId id, const Stat& st, int fd, const std::string& src, const std::string& dst,
                   const std::string& rel) {
    std::vector<SkippedEntry> skipped;
    auto entries = fs_.ReadDir(id, &skipped);
    if (!entries.ok()) return Error(src, entries.status());
    for (const auto& s : skipped) {
      if (s.lost) {
        Error(src, Status::Corrupt(s.reason));  // files not copied: not a mere finding
      } else if (s.name.empty()) {
        Finding(src + ": " + s.reason);
      } else {
        Finding(src + ": entry " + PrintableName(s.name) + " (index " + std::to_string(s.index) + "): " + s.reason);
      }
    }
    const std::string sep = src.ends_with('/') ? "" : "/";
    for (const auto& e : *entries) {
      Copy(e.id, fd, e.name, src + sep + e.name, dst + "/" + e.name, rel.empty() ? e.name : rel + "/" + e.name);
    }
    // Attributes last: the mode may take away write permission the
    // children needed, and every child changed the times.
    FinishFd(id, st, fd, src, dst);
  }

  // A hard link to a file this run extracted (never to anything else).
  void HardLink(const std::string& first_rel, int pfd, const std::string& name, const std::string& dst) {
    if (!MakeRoom(pfd, name, dst)) return;
    const size_t slash = first_rel.find_last_of('/');
    Fd dir = OpenBeneath(root_.get(), slash == std::string::npos ? "" : first_rel.substr(0, slash));
    if (!dir.ok()) return ErrorErrno(dst, "open the directory of the first link");
    const std::string base = slash == std::string::npos ? first_rel : first_rel.substr(slash + 1);
    if (::linkat(dir.get(), base.c_str(), pfd, name.c_str(), 0) != 0) return ErrorErrno(dst, "link");
    ++counts_.hardlinks;
  }

  // Clears the way for a non-directory: an existing non-directory there is
  // replaced (as tar does), never written through.
  bool MakeRoom(int pfd, const std::string& name, const std::string& dst) {
    struct stat s;
    if (::fstatat(pfd, name.c_str(), &s, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return true;
      ErrorErrno(dst, "stat");
      return false;
    }
    if (S_ISDIR(s.st_mode)) {
      Error(dst + ": exists and is a directory; not replaced");
      return false;
    }
    if (::unlinkat(pfd, name.c_str(), 0) != 0) {
      ErrorErrno(dst, "remove the existing file");
      return false;
    }
    return true;
  }

  bool CopyFile(InodeId id, const Stat& st, int pfd, const std::string& name, const std::string& src,
                const std::string& dst) {
    Fd fd(::openat(pfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.ok()) {
      ErrorErrno(dst, "open");
      return false;
    }
    uint64_t off = 0;
    while (off < st.size) {
      auto n = fs_.Read(id, off, buf_);
      if (!n.ok()) {
        Error(src, n.status());
        return false;
      }
      if (*n == 0) break;
      if (!IsZero(buf_.data(), *n)) {  // holes stay holes
        if (::pwrite(fd.get(), buf_.data(), *n, static_cast<off_t>(off)) != static_cast<ssize_t>(*n)) {
          ErrorErrno(dst, "write");
          return false;
        }
      }
      off += *n;
      counts_.bytes += *n;
    }
    if (::ftruncate(fd.get(), static_cast<off_t>(st.size)) != 0) {
      ErrorErrno(dst, "ftruncate");
      return false;
    }
    ++counts_.files;
    return FinishFd(id, st, fd.get(), src, dst);
  }

  uint32_t Mode(const Stat& st) const { return st.mode & (privileged_ ? 07777 : 01777); }

  // Which xattrs this copy may set: all when privileged, else the ones an
  // unprivileged process can (user.*, POSIX ACLs); the rest are reported
  // once per namespace.
  bool XattrAllowed(const std::string& name) {
    if (name.find('\0') != std::string::npos) return false;
    if (privileged_ || name.starts_with("user.") || name.starts_with("system.posix_acl_")) return true;
    const std::string ns = name.substr(0, name.find('.'));
    if (xattr_ns_warned_.insert(ns).second) {
      Warn("xattrs in " + ns + ".* not copied (an unprivileged copy cannot set them)");
    }
    return false;
  }

  // Ownership (chown clears set-id bits), xattrs (before the mode, which may
  // take away the write permission setting user.* needs), mode, then times.
  bool FinishFd(InodeId id, const Stat& st, int fd, const std::string& src, const std::string& dst) {
    bool ok = true;
    if (privileged_ && ::fchown(fd, st.uid, st.gid) != 0) ok = Failed(dst, "chown");
    ok &= CopyXattrs(id, src, dst, [&](const std::string& n, const std::string& v) {
      return ::fsetxattr(fd, n.c_str(), v.data(), v.size(), 0);
    });
    if (::fchmod(fd, Mode(st)) != 0) ok = Failed(dst, "chmod");
    const struct timespec times[2] = {{st.atime.sec, st.atime.nsec}, {st.mtime.sec, st.mtime.nsec}};
    if (::futimens(fd, times) != 0) ok = Failed(dst, "utimensat");
    return ok;
  }

  // The same for a symlink or special file, by name in its directory.
  bool FinishAt(InodeId id, const Stat& st, int pfd, const std::string& name, const std::string& src,
                const std::string& dst) {
    bool ok = true;
    const bool link = S_ISLNK(st.mode);
    if (privileged_ && ::fchownat(pfd, name.c_str(), st.uid, st.gid, AT_SYMLINK_NOFOLLOW) != 0) {
      ok = Failed(dst, "chown");
    }
    // The directory through its /proc link, the entry itself not followed.
    const std::string at = "/proc/self/fd/" + std::to_string(pfd) + "/" + name;
    ok &= CopyXattrs(id, src, dst, [&](const std::string& n, const std::string& v) {
      return ::lsetxattr(at.c_str(), n.c_str(), v.data(), v.size(), 0);
    });
    if (!link && ::fchmodat(pfd, name.c_str(), Mode(st), 0) != 0) ok = Failed(dst, "chmod");
    const struct timespec times[2] = {{st.atime.sec, st.atime.nsec}, {st.mtime.sec, st.mtime.nsec}};
    if (::utimensat(pfd, name.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) ok = Failed(dst, "utimensat");
    return ok;
  }

  template <typename Set>
  bool CopyXattrs(InodeId id, const std::string& src, const std::string& dst, Set set) {
    if (!opts_.xattrs) return true;
    auto names = fs_.ListXattr(id);
    if (!names.ok()) {
      Error(src, names.status());
      return false;
    }
    bool ok = true;
    for (const auto& name : *names) {
      if (!XattrAllowed(name)) continue;
      auto value = fs_.GetXattr(id, name);
      if (!value.ok()) {
        Error(src + " xattr " + PrintableName(name), value.status());
        ok = false;
        continue;
      }
      if (set(name, *value) != 0) {
        // As cp -a does, a destination that cannot hold a namespace (btrfs.*
        // properties on ext4, trusted.* without privilege) costs a warning.
        if (errno == ENOTSUP || errno == EPERM) {
          Warn(dst + ": xattr " + PrintableName(name) + " not kept: " + std::strerror(errno));
        } else {
          ok = Failed(dst, "setxattr " + PrintableName(name));
        }
      }
    }
    return ok;
  }

  bool Failed(const std::string& what, const std::string& op) {
    ErrorErrno(what, op);
    return false;
  }

  Filesystem& fs_;
  const ExportOptions& opts_;
  ExportReport* report_;
  ExportReport counts_;
  std::vector<uint8_t> buf_;
  const bool privileged_;
  Fd root_;
  std::map<std::pair<uint64_t, uint64_t>, std::string> links_;  // inode -> path from root_ of its first copy
  std::set<std::pair<uint64_t, uint64_t>> dirs_seen_;
  std::set<std::string> xattr_ns_warned_;
};

}  // namespace

Status ExportTree(Filesystem& fs, InodeId src, std::string_view src_name, const std::string& dest,
                  const ExportOptions& options, ExportReport* report) {
  Exporter e(fs, options, report);
  return e.Run(src, src_name, dest);
}

}  // namespace ubtrfs
