// Import of a tar archive (ubtrfs/import.h ImportArchive): libarchive reads
// it (plain or compressed; the format and filter are detected from the
// content), and every entry goes in through the same public write calls as
// the directory importer's item-by-item path, with the owners, modes,
// times, xattrs and ACLs the archive records, not the importer's.
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "fs/archive_library.h"
#include "ubtrfs/import.h"

namespace ubtrfs {
namespace {

using fs::ArchiveLibrary;

struct ArchiveCloser {
  const ArchiveLibrary* ar;
  void operator()(archive* a) const { ar->archive_read_free(a); }
};

Status ArchiveError(const ArchiveLibrary& ar, archive* a, const std::string& what) {
  const int e = ar.archive_errno(a);
  const char* msg = ar.archive_error_string(a);
  if (e == EILSEQ) {  // libarchive's ARCHIVE_ERRNO_FILE_FORMAT: no format recognised
    return Status::Error(EINVAL, what + ": not a tar archive (plain or compressed): " +
                                     (msg ? msg : "unrecognized format"));
  }
  return Status::Error(e > 0 ? e : EIO, what + ": " + (msg ? msg : "unknown libarchive error"));
}

// "./a//b/" -> "a/b"; "" for the top; nullopt for a path with "..".
std::optional<std::string> CleanPath(std::string_view p) {
  std::string out;
  while (!p.empty()) {
    const size_t slash = p.find('/');
    const std::string_view c = p.substr(0, slash);
    p = slash == std::string_view::npos ? std::string_view() : p.substr(slash + 1);
    if (c.empty() || c == ".") continue;
    if (c == "..") return std::nullopt;
    if (!out.empty()) out += '/';
    out += c;
  }
  return out;
}

// A POSIX ACL of one kind (access or default) as the system.posix_acl_*
// xattr value the kernel stores: version 2, then (tag, perm, id) entries in
// tag and id order. The owner, group and other entries come from `mode` when
// the archive left them out. Empty when there is nothing beyond the mode.
std::string AclXattr(const ArchiveLibrary& ar, archive_entry* e, int type, uint32_t mode) {
  constexpr uint16_t kUserObj = 0x01, kUser = 0x02, kGroupObj = 0x04, kGroup = 0x08, kMask = 0x10, kOther = 0x20;
  constexpr uint32_t kUndefinedId = 0xffffffffu;
  std::vector<std::tuple<uint16_t, uint32_t, uint16_t>> entries;  // tag, id, perm
  if (ar.archive_entry_acl_reset(e, type) <= 0) return {};
  int etype, permset, tag, qual;
  const char* name;
  bool extended = false;
  while (ar.archive_entry_acl_next(e, type, &etype, &permset, &tag, &qual, &name) == ARCHIVE_OK) {
    uint16_t t = 0;
    uint32_t id = kUndefinedId;
    switch (tag) {
      case ARCHIVE_ENTRY_ACL_USER_OBJ: t = kUserObj; break;
      case ARCHIVE_ENTRY_ACL_USER: t = kUser, id = static_cast<uint32_t>(qual), extended = true; break;
      case ARCHIVE_ENTRY_ACL_GROUP_OBJ: t = kGroupObj; break;
      case ARCHIVE_ENTRY_ACL_GROUP: t = kGroup, id = static_cast<uint32_t>(qual), extended = true; break;
      case ARCHIVE_ENTRY_ACL_MASK: t = kMask, extended = true; break;
      case ARCHIVE_ENTRY_ACL_OTHER: t = kOther; break;
      default: continue;
    }
    const uint16_t perm = static_cast<uint16_t>(permset & 7);  // ACL_READ 4, ACL_WRITE 2, ACL_EXECUTE 1 as the kernel's
    entries.emplace_back(t, id, perm);
  }
  if (entries.empty() || (type == ARCHIVE_ENTRY_ACL_TYPE_ACCESS && !extended)) return {};
  auto has = [&](uint16_t t) {
    return std::any_of(entries.begin(), entries.end(), [&](const auto& x) { return std::get<0>(x) == t; });
  };
  if (!has(kUserObj)) entries.emplace_back(kUserObj, kUndefinedId, static_cast<uint16_t>((mode >> 6) & 7));
  if (!has(kGroupObj)) entries.emplace_back(kGroupObj, kUndefinedId, static_cast<uint16_t>((mode >> 3) & 7));
  if (!has(kOther)) entries.emplace_back(kOther, kUndefinedId, static_cast<uint16_t>(mode & 7));
  if (extended && !has(kMask)) entries.emplace_back(kMask, kUndefinedId, static_cast<uint16_t>((mode >> 3) & 7));
  std::sort(entries.begin(), entries.end());
  std::string v;
  auto put = [&](uint64_t x, int bytes) {
    for (int i = 0; i < bytes; ++i) v.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
  };
  put(2, 4);
  for (const auto& [t, id, perm] : entries) {
    put(t, 2);
    put(perm, 2);
    put(id, 4);
  }
  return v;
}

// The permissions of the access ACL's mask entry, if it has one: the
// group bits of the mode, as the kernel keeps them (libarchive hands the
// mode with the owning group's entry in those bits instead).
std::optional<uint32_t> AccessAclMask(const ArchiveLibrary& ar, archive_entry* e) {
  if (ar.archive_entry_acl_reset(e, ARCHIVE_ENTRY_ACL_TYPE_ACCESS) <= 0) return std::nullopt;
  int etype, permset, tag, qual;
  const char* name;
  while (ar.archive_entry_acl_next(e, ARCHIVE_ENTRY_ACL_TYPE_ACCESS, &etype, &permset, &tag, &qual, &name) ==
         ARCHIVE_OK) {
    if (tag == ARCHIVE_ENTRY_ACL_MASK) return static_cast<uint32_t>(permset & 7);
  }
  return std::nullopt;
}

class ArchiveImporter {
 public:
  ArchiveImporter(const ArchiveLibrary& ar, Filesystem& fs, const ImportOptions& options, ImportStats* stats)
      : ar_(ar), fs_(fs), options_(options), stats_(stats) {}

  Status Run(const std::string& source, InodeId dest) {
    std::unique_ptr<archive, ArchiveCloser> a(ar_.archive_read_new(), ArchiveCloser{&ar_});
    if (!a) return Status::Error(ENOMEM, "libarchive: out of memory");
    ar_.archive_read_support_filter_all(a.get());
    ar_.archive_read_support_format_tar(a.get());
    ar_.archive_read_support_format_gnutar(a.get());
    const std::string name = source == "-" ? std::string("standard input") : source;
    const int r = source == "-" ? ar_.archive_read_open_fd(a.get(), 0, 1 << 16)
                                : ar_.archive_read_open_filename(a.get(), source.c_str(), 1 << 16);
    if (r != ARCHIVE_OK) return ArchiveError(ar_, a.get(), name);
    dirs_[""] = dest;
    for (;;) {
      archive_entry* e = nullptr;
      const int h = ar_.archive_read_next_header(a.get(), &e);
      if (h == ARCHIVE_EOF) break;
      if (h == ARCHIVE_FATAL || (h != ARCHIVE_OK && h != ARCHIVE_WARN)) {
        return ArchiveError(ar_, a.get(), name);
      }
      const char* p = ar_.archive_entry_pathname(e);
      UB_RETURN_IF_ERROR(Entry(a.get(), e).WithContext(name + ": " + (p ? p : "?")));
    }
    // Directory times last: entries made in a directory changed them.
    for (auto it = dir_attrs_.rbegin(); it != dir_attrs_.rend(); ++it) {
      UB_RETURN_IF_ERROR(fs_.SetAttr(it->first, it->second));
    }
    return Status::Ok();
  }

 private:
  Time Clamped(Time t) const {
    const auto& m = options_.max_time;
    return m && (t.sec > m->sec || (t.sec == m->sec && t.nsec > m->nsec)) ? *m : t;
  }

  Status Entry(archive* a, archive_entry* e) {
    const char* raw = ar_.archive_entry_pathname(e);
    if (!raw) return Status::Error(EINVAL, "entry without a name");
    auto path = CleanPath(raw);
    if (!path) return Status::Error(EINVAL, "a path with '..' is refused");
    if (options_.progress && (++progress_tick_ % 4096 == 0)) options_.progress(*stats_);
    uint32_t mode = ar_.archive_entry_mode(e);
    const uint32_t mode_as_read = mode;  // for the ACL's owner/group/other entries
    if (auto mask = AccessAclMask(ar_, e)) mode = (mode & ~uint32_t{070}) | (*mask << 3);
    uint32_t uid = static_cast<uint32_t>(ar_.archive_entry_uid(e)), gid = static_cast<uint32_t>(ar_.archive_entry_gid(e));
    if (options_.owner) uid = options_.owner->first, gid = options_.owner->second;
    AttrChange c;
    c.mode = mode & 07777;
    c.uid = uid;
    c.gid = gid;
    const Time mtime = Clamped({ar_.archive_entry_mtime(e), static_cast<uint32_t>(ar_.archive_entry_mtime_nsec(e))});
    c.mtime = mtime;
    c.atime = ar_.archive_entry_atime_is_set(e)
                  ? Clamped({ar_.archive_entry_atime(e), static_cast<uint32_t>(ar_.archive_entry_atime_nsec(e))})
                  : mtime;
    c.ctime = ar_.archive_entry_ctime_is_set(e)
                  ? Clamped({ar_.archive_entry_ctime(e), static_cast<uint32_t>(ar_.archive_entry_ctime_nsec(e))})
                  : mtime;

    if (path->empty()) {  // "./": the destination directory itself
      if (!S_ISDIR(mode)) return Status::Error(EINVAL, "the top entry is not a directory");
      UB_RETURN_IF_ERROR(Xattrs(e, dirs_[""], mode_as_read));
      dir_attrs_.emplace_back(dirs_[""], c);
      return Status::Ok();
    }
    const size_t slash = path->rfind('/');
    const std::string parent = slash == std::string::npos ? "" : path->substr(0, slash);
    const std::string base = slash == std::string::npos ? *path : path->substr(slash + 1);
    if (base.size() > 255) return Status::Error(ENAMETOOLONG, "name longer than 255 bytes");
    UB_ASSIGN_OR_RETURN(InodeId dir, Dir(parent));

    if (const char* target = ar_.archive_entry_hardlink(e)) {
      auto t = CleanPath(target);
      if (!t) return Status::Error(EINVAL, "a hard link target with '..' is refused");
      auto it = files_.find(*t);
      if (it == files_.end()) return Status::Error(ENOENT, "hard link to " + *t + ", which is not in the archive before it");
      UB_RETURN_IF_ERROR(Replace(dir, base, *path));
      UB_RETURN_IF_ERROR(fs_.Link(it->second, dir, base));
      ++stats_->hardlinks;
      return Status::Ok();
    }

    NewInode attrs;
    attrs.mode = mode & 07777;
    attrs.uid = uid;
    attrs.gid = gid;
    attrs.atime = c.atime;
    attrs.mtime = c.mtime;
    attrs.ctime = c.ctime;
    InodeId id;
    switch (mode & S_IFMT) {
      case S_IFDIR: {
        if (auto known = dirs_.find(*path); known != dirs_.end()) {
          id = known->second;  // made for an entry below it, or listed twice
        } else {
          UB_RETURN_IF_ERROR(Replace(dir, base, *path));
          UB_ASSIGN_OR_RETURN(id, fs_.Mkdir(dir, base, attrs));
          dirs_[*path] = id;
          ++stats_->dirs;
        }
        UB_RETURN_IF_ERROR(Xattrs(e, id, mode_as_read));
        dir_attrs_.emplace_back(id, c);
        return Status::Ok();
      }
      case S_IFREG: {
        UB_RETURN_IF_ERROR(Replace(dir, base, *path));
        UB_ASSIGN_OR_RETURN(id, fs_.Create(dir, base, attrs));
        ++stats_->files;
        files_[*path] = id;
        UB_RETURN_IF_ERROR(Data(a, e, id));
        break;
      }
      case S_IFLNK: {
        const char* target = ar_.archive_entry_symlink(e);
        if (!target || !*target) return Status::Error(EINVAL, "symlink without a target");
        UB_RETURN_IF_ERROR(Replace(dir, base, *path));
        UB_ASSIGN_OR_RETURN(id, fs_.Symlink(dir, base, target, attrs));
        ++stats_->symlinks;
        files_[*path] = id;
        c.mode.reset();
        break;
      }
      case S_IFCHR: case S_IFBLK: case S_IFIFO: case S_IFSOCK: {
        attrs.mode = mode & (S_IFMT | 07777);
        if (S_ISCHR(mode) || S_ISBLK(mode)) {
          attrs.rdev = makedev(ar_.archive_entry_rdevmajor(e), ar_.archive_entry_rdevminor(e));
        }
        UB_RETURN_IF_ERROR(Replace(dir, base, *path));
        UB_ASSIGN_OR_RETURN(id, fs_.Mknod(dir, base, attrs));
        ++stats_->specials;
        files_[*path] = id;
        break;
      }
      default:
        return Status::Error(EINVAL, "entry of unknown type 0" + std::to_string((mode & S_IFMT) >> 12));
    }
    UB_RETURN_IF_ERROR(Xattrs(e, id, mode_as_read));
    return fs_.SetAttr(id, c);  // data and xattrs moved the times
  }

  // The image directory for `path` (relative to the top), made (0755, owned
  // as the top) when the archive has no entry for it before its contents.
  Result<InodeId> Dir(const std::string& path) {
    if (auto it = dirs_.find(path); it != dirs_.end()) return it->second;
    const size_t slash = path.rfind('/');
    UB_ASSIGN_OR_RETURN(InodeId parent, Dir(slash == std::string::npos ? "" : path.substr(0, slash)));
    const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    if (files_.count(path)) return Status::Error(ENOTDIR, path + " is not a directory in the archive");
    NewInode a;
    a.mode = 0755;
    if (options_.owner) a.uid = options_.owner->first, a.gid = options_.owner->second;
    UB_ASSIGN_OR_RETURN(InodeId id, fs_.Mkdir(parent, base, a));
    ++stats_->dirs;
    dirs_[path] = id;
    return id;
  }

  // A later entry of the same name replaces an earlier non-directory, as tar
  // extracting does.
  Status Replace(InodeId dir, const std::string& base, const std::string& path) {
    auto it = files_.find(path);
    if (it != files_.end()) {
      files_.erase(it);
      return fs_.Unlink(dir, base);
    }
    if (dirs_.count(path)) return Status::Error(EEXIST, "a directory of this name came earlier in the archive");
    return Status::Ok();
  }

  Status Data(archive* a, archive_entry* e, InodeId id) {
    uint64_t end = 0;
    for (;;) {
      const void* block = nullptr;
      size_t len = 0;
      la_int64_t offset = 0;
      const int r = ar_.archive_read_data_block(a, &block, &len, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return ArchiveError(ar_, a, "reading the data");
      if (len == 0) continue;
      // Sparse entries come as blocks at their offsets: the gaps stay holes.
      UB_RETURN_IF_ERROR(
          fs_.Write(id, static_cast<uint64_t>(offset), std::span(static_cast<const uint8_t*>(block), len)).status());
      end = std::max(end, static_cast<uint64_t>(offset) + len);
      stats_->bytes += len;
      if (options_.progress && stats_->bytes - progress_bytes_ >= (16u << 20)) {
        progress_bytes_ = stats_->bytes;
        options_.progress(*stats_);
      }
      since_commit_ += len;
      if (since_commit_ >= options_.commit_every_bytes) {
        since_commit_ = 0;
        UB_RETURN_IF_ERROR(fs_.Commit());
      }
    }
    const uint64_t size = ar_.archive_entry_size_is_set(e) ? static_cast<uint64_t>(ar_.archive_entry_size(e)) : end;
    if (size > end) {
      AttrChange c;
      c.size = size;  // a trailing hole
      UB_RETURN_IF_ERROR(fs_.SetAttr(id, c));
    }
    return Status::Ok();
  }

  Status Xattrs(archive_entry* e, InodeId id, uint32_t mode) {
    bool have_access = false, have_default = false;
    ar_.archive_entry_xattr_reset(e);
    const char* name;
    const void* value;
    size_t size;
    while (ar_.archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK) {
      if (!name || !*name) continue;
      const std::string n = name;
      have_access |= n == "system.posix_acl_access";
      have_default |= n == "system.posix_acl_default";
      UB_RETURN_IF_ERROR(
          fs_.SetXattr(id, n, std::string_view(static_cast<const char*>(value), size), 0).WithContext("xattr " + n));
      ++stats_->xattrs;
    }
    // ACLs the archive records as ACLs (tar --acls: SCHILY.acl.*), stored
    // as the kernel stores them.
    if (!have_access) {
      if (std::string v = AclXattr(ar_, e, ARCHIVE_ENTRY_ACL_TYPE_ACCESS, mode); !v.empty()) {
        UB_RETURN_IF_ERROR(fs_.SetXattr(id, "system.posix_acl_access", v, 0));
        ++stats_->xattrs;
      }
    }
    if (!have_default && S_ISDIR(mode)) {
      if (std::string v = AclXattr(ar_, e, ARCHIVE_ENTRY_ACL_TYPE_DEFAULT, mode); !v.empty()) {
        UB_RETURN_IF_ERROR(fs_.SetXattr(id, "system.posix_acl_default", v, 0));
        ++stats_->xattrs;
      }
    }
    return Status::Ok();
  }

  const ArchiveLibrary& ar_;
  Filesystem& fs_;
  const ImportOptions& options_;
  ImportStats* stats_;
  std::map<std::string, InodeId> dirs_;   // archive path -> directory
  std::map<std::string, InodeId> files_;  // archive path -> non-directory (hard link targets)
  std::vector<std::pair<InodeId, AttrChange>> dir_attrs_;
  uint64_t since_commit_ = 0;
  uint64_t progress_tick_ = 0;
  uint64_t progress_bytes_ = 0;
};

}  // namespace

Status ImportArchive(Filesystem& fs, const std::string& archive, InodeId dest_dir, const ImportOptions& options,
                     ImportStats* stats) {
  if (!options.skip.empty() || !options.inode_flags.empty()) {
    return Status::Error(EINVAL, "skipped entries and inode flags apply to a directory import, not an archive");
  }
  auto lib = fs::LoadArchiveLibrary();
  if (!lib.ok()) return lib.status();
  ImportStats own;
  ArchiveImporter imp(**lib, fs, options, stats ? stats : &own);
  return imp.Run(archive, dest_dir);
}

}  // namespace ubtrfs
