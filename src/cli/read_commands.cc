// info, ls, cat, cp: the read-only subcommands.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <ctime>
#include <fmt/core.h>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "format/superblock.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {

void PrintError(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: {}: {}\n", what, st.ToString());
}

std::unique_ptr<Filesystem> OpenOrReport(const std::string& image) {
  OpenOptions o;
  SubvolOptionsInto(&o);
  auto fs = Filesystem::Open(image, o);
  if (!fs.ok()) {
    PrintError(image, fs.status());
    SetExitCode(1);
    return nullptr;
  }
  for (const auto& w : (*fs)->Warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", image, w);
  return std::move(*fs);
}

std::string ModeString(uint32_t mode) {
  std::string s = "?rwxrwxrwx";
  switch (mode & S_IFMT) {
    case S_IFREG: s[0] = '-'; break;
    case S_IFDIR: s[0] = 'd'; break;
    case S_IFLNK: s[0] = 'l'; break;
    case S_IFCHR: s[0] = 'c'; break;
    case S_IFBLK: s[0] = 'b'; break;
    case S_IFIFO: s[0] = 'p'; break;
    case S_IFSOCK: s[0] = 's'; break;
  }
  for (int i = 0; i < 9; ++i) {
    if (!(mode & (1u << (8 - i)))) s[1 + i] = '-';
  }
  if (mode & S_ISUID) s[3] = (mode & S_IXUSR) ? 's' : 'S';
  if (mode & S_ISGID) s[6] = (mode & S_IXGRP) ? 's' : 'S';
  if (mode & S_ISVTX) s[9] = (mode & S_IXOTH) ? 't' : 'T';
  return s;
}

std::string TimeString(const Time& t) {
  char buf[64];
  time_t secs = static_cast<time_t>(t.sec);
  struct tm tm;
  gmtime_r(&secs, &tm);
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// Shows names with control bytes escaped so a listing stays one line each.
std::string Printable(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f || c == '\\') out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

void CmdInfo(const std::string& image) {
  auto fs = OpenOrReport(image);
  if (!fs) return;
  FsInfo i = fs->Info();
  fmt::print("label:            {}\n", i.label);
  fmt::print("fsid:             {}\n", i.fsid);
  fmt::print("generation:       {}\n", i.generation);
  fmt::print("sectorsize:       {}\n", i.sectorsize);
  fmt::print("nodesize:         {}\n", i.nodesize);
  fmt::print("checksum:         {}\n", i.csum_type);
  fmt::print("total bytes:      {}\n", i.total_bytes);
  fmt::print("bytes used:       {}\n", i.bytes_used);
  fmt::print("devices:          {}\n", i.num_devices);
  fmt::print("incompat:         {}\n", format::IncompatNames(i.incompat_flags));
  fmt::print("compat_ro:        {}\n", format::CompatRoNames(i.compat_ro_flags));
  fmt::print("superblock copy:  {}\n", i.superblock_mirror);
}

void PrintLong(Filesystem& fs, const std::string& name, InodeId id) {
  auto st = fs.GetStat(id);
  if (!st.ok()) {
    PrintError(name, st.status());
    SetExitCode(1);
    return;
  }
  std::string line = fmt::format("{} {:>3} {:>5} {:>5} {:>10} {} {}", ModeString(st->mode), st->nlink, st->uid,
                                 st->gid, st->size, TimeString(st->mtime), Printable(name));
  if (S_ISLNK(st->mode)) {
    auto target = fs.ReadLink(id);
    line += " -> " + (target.ok() ? Printable(*target) : "?");
  }
  fmt::print("{}\n", line);
}

void CmdLs(const std::string& image, const std::string& path, bool long_format) {
  auto fs = OpenOrReport(image);
  if (!fs) return;
  auto id = fs->Lookup(path);
  if (!id.ok()) {
    PrintError(path, id.status());
    SetExitCode(1);
    return;
  }
  auto st = fs->GetStat(*id);
  if (!st.ok()) {
    PrintError(path, st.status());
    SetExitCode(1);
    return;
  }
  if (!S_ISDIR(st->mode)) {
    if (long_format) PrintLong(*fs, path, *id);
    else fmt::print("{}\n", Printable(path));
    return;
  }
  auto entries = fs->ReadDir(*id);
  if (!entries.ok()) {
    PrintError(path, entries.status());
    SetExitCode(1);
    return;
  }
  for (const auto& e : *entries) {
    if (long_format) PrintLong(*fs, e.name, e.id);
    else fmt::print("{}\n", Printable(e.name));
  }
}

void CmdCat(const std::string& image, const std::string& path) {
  auto fs = OpenOrReport(image);
  if (!fs) return;
  auto id = fs->Lookup(path);
  if (!id.ok()) {
    PrintError(path, id.status());
    SetExitCode(1);
    return;
  }
  std::vector<uint8_t> buf(1 << 20);
  uint64_t off = 0;
  for (;;) {
    auto n = fs->Read(*id, off, buf);
    if (!n.ok()) {
      PrintError(path, n.status());
      SetExitCode(1);
      return;
    }
    if (*n == 0) break;
    if (fwrite(buf.data(), 1, *n, stdout) != *n) {
      fmt::print(stderr, "ubtrfs: write to stdout failed\n");
      SetExitCode(1);
      return;
    }
    off += *n;
  }
}

// Recursive copy out of an image, keeping modes, owners (when root), times,
// symlinks, hard links, special files and xattrs.
class Copier {
 public:
  explicit Copier(Filesystem& fs) : fs_(fs), buf_(1 << 20), is_root_(geteuid() == 0) {}

  bool Copy(InodeId id, const std::string& src, const std::string& dst) {
    auto st = fs_.GetStat(id);
    if (!st.ok()) return Fail(src, st.status());
    if (!S_ISDIR(st->mode) && st->nlink > 1) {
      auto it = links_.find({id.root, id.ino});
      if (it != links_.end()) {
        if (::link(it->second.c_str(), dst.c_str()) != 0) return FailErrno(dst, "link");
        return true;
      }
      links_[{id.root, id.ino}] = dst;
    }
    bool ok = true;
    switch (st->mode & S_IFMT) {
      case S_IFDIR: {
        if (::mkdir(dst.c_str(), 0700) != 0 && errno != EEXIST) return FailErrno(dst, "mkdir");
        auto entries = fs_.ReadDir(id);
        if (!entries.ok()) return Fail(src, entries.status());
        for (const auto& e : *entries) {
          ok &= Copy(e.id, src + (src.ends_with('/') ? "" : "/") + e.name, dst + "/" + e.name);
        }
        break;
      }
      case S_IFREG:
        if (!CopyFile(id, *st, src, dst)) return false;
        break;
      case S_IFLNK: {
        auto target = fs_.ReadLink(id);
        if (!target.ok()) return Fail(src, target.status());
        if (::symlink(target->c_str(), dst.c_str()) != 0) return FailErrno(dst, "symlink");
        break;
      }
      default:
        if (::mknod(dst.c_str(), (st->mode & S_IFMT) | 0600, static_cast<dev_t>(st->rdev)) != 0) {
          return FailErrno(dst, "mknod");
        }
        break;
    }
    return Finish(id, *st, src, dst) && ok;
  }

 private:
  bool CopyFile(InodeId id, const Stat& st, const std::string& src, const std::string& dst) {
    int fd = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return FailErrno(dst, "open");
    uint64_t off = 0;
    bool ok = true;
    while (off < st.size) {
      auto n = fs_.Read(id, off, buf_);
      if (!n.ok()) {
        ok = Fail(src, n.status());
        break;
      }
      if (*n == 0) break;
      if (IsZero(buf_.data(), *n)) {  // keep holes as holes
        off += *n;
        continue;
      }
      if (::pwrite(fd, buf_.data(), *n, static_cast<off_t>(off)) != static_cast<ssize_t>(*n)) {
        ok = FailErrno(dst, "write");
        break;
      }
      off += *n;
    }
    if (ok && ::ftruncate(fd, static_cast<off_t>(st.size)) != 0) ok = FailErrno(dst, "ftruncate");
    ::close(fd);
    return ok;
  }

  static bool IsZero(const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i]) return false;
    }
    return true;
  }

  // Attributes go on last: ownership (chown clears set-id bits), xattrs
  // (before the mode, which may take away the owner's write permission that
  // setting user.* xattrs needs), the mode, then times (which every earlier
  // step would disturb).
  bool Finish(InodeId id, const Stat& st, const std::string& src, const std::string& dst) {
    bool ok = true;
    const bool link = S_ISLNK(st.mode);
    if (is_root_ && ::lchown(dst.c_str(), st.uid, st.gid) != 0) ok = FailErrno(dst, "chown");
    auto names = fs_.ListXattr(id);
    if (!names.ok()) return Fail(src, names.status());
    for (const auto& name : *names) {
      auto value = fs_.GetXattr(id, name);
      if (!value.ok()) {
        ok = Fail(src + " xattr " + name, value.status());
        continue;
      }
      if (::lsetxattr(dst.c_str(), name.c_str(), value->data(), value->size(), 0) != 0) {
        // As cp -a does, a destination that cannot hold a namespace (btrfs.*
        // properties on ext4, trusted.* without privilege) costs a warning.
        if (errno == ENOTSUP || errno == EPERM) {
          fmt::print(stderr, "ubtrfs: warning: {}: xattr {} not kept: {}\n", dst, name, strerror(errno));
        } else {
          ok = FailErrno(dst, "setxattr " + name);
        }
      }
    }
    if (!link && ::chmod(dst.c_str(), st.mode & 07777) != 0) ok = FailErrno(dst, "chmod");
    struct timespec times[2] = {{st.atime.sec, st.atime.nsec}, {st.mtime.sec, st.mtime.nsec}};
    if (::utimensat(AT_FDCWD, dst.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) ok = FailErrno(dst, "utimensat");
    return ok;
  }

  bool Fail(const std::string& what, const Status& st) {
    PrintError(what, st);
    return false;
  }
  bool FailErrno(const std::string& what, const std::string& op) {
    fmt::print(stderr, "ubtrfs: {}: {}: {}\n", what, op, strerror(errno));
    return false;
  }

  Filesystem& fs_;
  std::vector<uint8_t> buf_;
  bool is_root_;
  std::map<std::pair<uint64_t, uint64_t>, std::string> links_;
};

void CmdCp(const std::string& source, const std::string& dest) {
  std::string image, path;
  if (!SplitImagePath(source, &image, &path)) {
    if (SplitImagePath(dest, &image, &path)) return CopyIn(source, image, path);
    fmt::print(stderr, "ubtrfs: cp: one side must be IMAGE:PATH with IMAGE an existing image, got '{}' and '{}'\n",
               source, dest);
    SetExitCode(2);
    return;
  }
  auto fs = OpenOrReport(image);
  if (!fs) return;
  auto id = fs->Lookup(path);
  if (!id.ok()) {
    PrintError(path, id.status());
    SetExitCode(1);
    return;
  }
  std::string target = dest;
  struct stat st;
  const bool is_root_path = path.find_first_not_of('/') == std::string::npos;
  if (!is_root_path && ::stat(dest.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::string base = path.substr(0, path.find_last_not_of('/') + 1);
    base = base.substr(base.find_last_of('/') + 1);
    target = dest + "/" + base;
  }
  Copier copier(*fs);
  if (!copier.Copy(*id, path, target)) SetExitCode(1);
}

}  // namespace

void RegisterReadCommands(CLI::App& app) {
  static std::string image, path, source, dest;
  static bool long_format = false;

  auto* info = app.add_subcommand("info", "Show the superblock summary of an image");
  info->add_option("image", image, "Image file or block device")->required();
  info->callback([] { CmdInfo(image); });

  auto* ls = app.add_subcommand("ls", "List a directory in an image");
  ls->add_flag("-l", long_format, "Long listing (mode, links, owner, size, mtime)");
  ls->add_option("image", image, "Image file or block device")->required();
  ls->add_option("path", path, "Path inside the image")->default_val("/");
  ls->callback([] { CmdLs(image, path, long_format); });

  auto* cat = app.add_subcommand("cat", "Write a file from an image to stdout");
  cat->add_option("image", image, "Image file or block device")->required();
  cat->add_option("path", path, "Path inside the image")->required();
  cat->callback([] { CmdCat(image, path); });

  auto* cp = app.add_subcommand("cp", "Copy a file or tree out of an image (IMAGE:PATH DEST) or into it (SRC IMAGE:PATH)");
  cp->add_option("source", source, "IMAGE:PATH, or a host path")->required();
  cp->add_option("dest", dest, "a host path, or IMAGE:PATH")->required();
  cp->callback([] { CmdCp(source, dest); });
}

}  // namespace ubtrfs::cli
