#include "fs/import.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

namespace ubtrfs::fs {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  const int e = errno;
  return Status::Error(e, path + ": " + what + ": " + std::strerror(e));
}

Time ToTime(const timespec& ts) { return Time{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)}; }

class Importer {
 public:
  Importer(Filesystem& fs, const ImportOptions& options, ImportStats* stats)
      : fs_(fs), options_(options), stats_(stats ? stats : &own_stats_), buf_(1 << 20) {}

  Status Copy(const std::string& src, InodeId dir, const std::string& name) {
    if (options_.progress && (++progress_tick_ % 4096 == 0)) options_.progress(*stats_);
    struct stat st;
    if (::lstat(src.c_str(), &st) != 0) return Errno("lstat", src);
    if (S_ISDIR(st.st_mode)) {
      NewInode a = Attrs(st);
      UB_ASSIGN_OR_RETURN(InodeId id, fs_.Mkdir(dir, name, a));
      ++stats_->dirs;
      UB_RETURN_IF_ERROR(CopyEntries(src, id));
      return Finish(src, id, st);
    }
    if (st.st_nlink > 1) {
      auto it = links_.find({st.st_dev, st.st_ino});
      if (it != links_.end()) {
        ++stats_->hardlinks;
        return fs_.Link(it->second, dir, name);
      }
    }
    InodeId id;
    bool changed_after_create = false;  // data or xattrs moved mtime/ctime
    if (S_ISREG(st.st_mode)) {
      UB_ASSIGN_OR_RETURN(id, fs_.Create(dir, name, Attrs(st)));
      if (st.st_size > 0) {
        UB_RETURN_IF_ERROR(CopyData(src, id, st));
        changed_after_create = true;
      }
      ++stats_->files;
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t n = ::readlink(src.c_str(), target.data(), target.size());
      if (n < 0) return Errno("readlink", src);
      target.resize(static_cast<size_t>(n));
      UB_ASSIGN_OR_RETURN(id, fs_.Symlink(dir, name, target, Attrs(st)));
      ++stats_->symlinks;
    } else {
      NewInode a = Attrs(st);
      a.mode = st.st_mode;
      a.rdev = st.st_rdev;
      UB_ASSIGN_OR_RETURN(id, fs_.Mknod(dir, name, a));
      ++stats_->specials;
    }
    if (st.st_nlink > 1) links_[{st.st_dev, st.st_ino}] = id;
    UB_ASSIGN_OR_RETURN(bool had_xattrs, CopyXattrs(src, id));
    // Create set mode, owner and times already; only later changes need a setattr.
    if (changed_after_create || had_xattrs || S_ISLNK(st.st_mode)) return SetAttrs(id, st);
    return Status::Ok();
  }

  Status CopyEntries(const std::string& src, InodeId dir) {
    DIR* d = ::opendir(src.c_str());
    if (!d) return Errno("opendir", src);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(std::move(n));
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());  // a reproducible image for a given tree
    for (const auto& n : names) UB_RETURN_IF_ERROR(Copy(src + "/" + n, dir, n).WithContext(src + "/" + n));
    return Status::Ok();
  }

  // Mode, owner, xattrs and times of an existing image inode from host `src`.
  Status Finish(const std::string& src, InodeId id, const struct stat& st) {
    UB_RETURN_IF_ERROR(CopyXattrs(src, id).status());
    return SetAttrs(id, st);
  }

  Status SetAttrs(InodeId id, const struct stat& st) {
    AttrChange c;
    if (!S_ISLNK(st.st_mode)) c.mode = st.st_mode & 07777;
    c.uid = st.st_uid;
    c.gid = st.st_gid;
    c.atime = ToTime(st.st_atim);
    c.mtime = ToTime(st.st_mtim);
    c.ctime = ToTime(st.st_ctim);
    return fs_.SetAttr(id, c);
  }

 private:
  NewInode Attrs(const struct stat& st) {
    NewInode a;
    a.mode = st.st_mode & 07777;
    a.uid = st.st_uid;
    a.gid = st.st_gid;
    a.atime = ToTime(st.st_atim);
    a.mtime = ToTime(st.st_mtim);
    a.ctime = ToTime(st.st_ctim);
    return a;
  }

  Status CopyData(const std::string& src, InodeId id, const struct stat& st) {
    int fd = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", src);
    Status result;
    uint64_t off = 0;
    while (off < static_cast<uint64_t>(st.st_size)) {
      // Skip holes the host knows about; zero runs become holes anyway.
      off_t data = ::lseek(fd, static_cast<off_t>(off), SEEK_DATA);
      if (data < 0) break;  // only a hole up to the end
      off = static_cast<uint64_t>(data);
      ssize_t n = ::pread(fd, buf_.data(), buf_.size(), data);
      if (n < 0) {
        result = Errno("read", src);
        break;
      }
      if (n == 0) break;
      auto w = fs_.Write(id, off, std::span(buf_.data(), static_cast<size_t>(n)));
      if (!w.ok()) {
        result = w.status();
        break;
      }
      off += static_cast<uint64_t>(n);
      stats_->bytes += static_cast<uint64_t>(n);
      since_commit_ += static_cast<uint64_t>(n);
      if (since_commit_ >= options_.commit_every_bytes) {
        since_commit_ = 0;
        result = fs_.Commit();
        if (!result.ok()) break;
      }
    }
    ::close(fd);
    UB_RETURN_IF_ERROR(result);
    if (off < static_cast<uint64_t>(st.st_size) || st.st_size == 0) {
      AttrChange c;
      c.size = static_cast<uint64_t>(st.st_size);  // a trailing hole
      UB_RETURN_IF_ERROR(fs_.SetAttr(id, c));
    }
    return Status::Ok();
  }

  // Returns whether there were any.
  Result<bool> CopyXattrs(const std::string& src, InodeId id) {
    ssize_t len = ::llistxattr(src.c_str(), nullptr, 0);
    if (len < 0) {
      if (errno == ENOTSUP) return false;
      return Errno("listxattr", src);
    }
    if (len == 0) return false;
    std::string names(static_cast<size_t>(len), '\0');
    len = ::llistxattr(src.c_str(), names.data(), names.size());
    if (len < 0) return Errno("listxattr", src);
    names.resize(static_cast<size_t>(len));
    for (size_t pos = 0; pos < names.size();) {
      const std::string name = names.c_str() + pos;
      pos += name.size() + 1;
      if (name.empty()) continue;
      ssize_t vlen = ::lgetxattr(src.c_str(), name.c_str(), nullptr, 0);
      if (vlen < 0) return Errno("getxattr " + name, src);
      std::string value(static_cast<size_t>(vlen), '\0');
      vlen = ::lgetxattr(src.c_str(), name.c_str(), value.data(), value.size());
      if (vlen < 0) return Errno("getxattr " + name, src);
      value.resize(static_cast<size_t>(vlen));
      UB_RETURN_IF_ERROR(fs_.SetXattr(id, name, value, 0).WithContext("xattr " + name));
      ++stats_->xattrs;
    }
    return true;
  }

  Filesystem& fs_;
  ImportOptions options_;
  ImportStats own_stats_;
  ImportStats* stats_;
  std::vector<uint8_t> buf_;
  std::map<std::pair<dev_t, ino_t>, InodeId> links_;
  uint64_t since_commit_ = 0;
  uint64_t progress_tick_ = 0;
};

}  // namespace

Status ImportTree(Filesystem& fs, const std::string& src, InodeId dest_dir, const std::string& name,
                  const ImportOptions& options, ImportStats* stats) {
  Importer imp(fs, options, stats);
  return imp.Copy(src, dest_dir, name);
}

Status ImportContents(Filesystem& fs, const std::string& src, InodeId dest_dir, const ImportOptions& options,
                      ImportStats* stats) {
  struct stat st;
  if (::lstat(src.c_str(), &st) != 0) return Errno("lstat", src);
  if (!S_ISDIR(st.st_mode)) return Status::Error(ENOTDIR, src + " is not a directory");
  Importer imp(fs, options, stats);
  UB_RETURN_IF_ERROR(imp.CopyEntries(src, dest_dir));
  return imp.Finish(src, dest_dir, st);
}

}  // namespace ubtrfs::fs
