#include "fuse/adapter.h"

#include "ubtrfs/stats.h"

#include "fuse/posix_acl.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>
#include <vector>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace ubtrfs::fuse {

struct Adapter::DirHandle {
  std::mutex mu;
  bool loaded = false;
  std::vector<DirEntry> entries;  // DIR_INDEX order, as of the last rewind
  InodeId parent;
};

namespace {

Adapter* Self(fuse_req_t req) { return static_cast<Adapter*>(fuse_req_userdata(req)); }

constexpr const char* kOpNames[] = {
    "init", "lookup", "forget", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink", "rmdir",
    "symlink", "rename", "link", "open", "read", "write", "flush", "release", "fsync", "opendir",
    "readdir", "readdirplus", "releasedir", "fsyncdir", "statfs", "setxattr", "getxattr", "listxattr",
    "removexattr", "create", "fallocate", "lseek", "copy_file_range", "syncfs"};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == static_cast<size_t>(Op::kCount));

Time FromTimespec(const timespec& ts) { return Time{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)}; }

Time Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return FromTimespec(ts);
}

timespec ToTimespec(const Time& t) { return timespec{static_cast<time_t>(t.sec), static_cast<long>(t.nsec)}; }

// Errors that say something about the image or the library rather than
// answer the caller's question.
bool WorthLogging(int code) {
  switch (code) {
    case ENOENT: case EEXIST: case ENOTDIR: case EISDIR: case ENOTEMPTY: case ENODATA: case ERANGE:
    case EROFS: case EXDEV: case EPERM: case EACCES: case ENAMETOOLONG: case EMLINK: case E2BIG:
    case ESTALE: case EINTR: case ENXIO:
      return false;
  }
  return true;
}

std::string_view Sv(const char* s) { return std::string_view(s); }

void Err(fuse_req_t req, int code) { fuse_reply_err(req, code); }

}  // namespace

Adapter::Adapter(Filesystem& fs, AdapterOptions options)
    : fs_(fs), opts_(std::move(options)), map_(fs.Root()), block_size_(fs.Info().sectorsize) {
  if (block_size_ == 0) block_size_ = 4096;
}

const fuse_lowlevel_ops& Adapter::Ops() {
  static const fuse_lowlevel_ops ops = [] {
    fuse_lowlevel_ops o{};
    o.init = [](void* userdata, fuse_conn_info* conn) { static_cast<Adapter*>(userdata)->Init(conn); };
    o.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { Self(r)->Lookup(r, p, n); };
    o.forget = [](fuse_req_t r, fuse_ino_t i, uint64_t n) {
      Self(r)->Forget(i, n);
      fuse_reply_none(r);
    };
    o.forget_multi = [](fuse_req_t r, size_t count, fuse_forget_data* f) {
      for (size_t i = 0; i < count; ++i) Self(r)->Forget(f[i].ino, f[i].nlookup);
      fuse_reply_none(r);
    };
    o.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info*) { Self(r)->GetAttr(r, i); };
    o.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info*) {
      Self(r)->SetAttr(r, i, a, s);
    };
    o.readlink = [](fuse_req_t r, fuse_ino_t i) { Self(r)->ReadLink(r, i); };
    o.mknod = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, dev_t d) { Self(r)->Mknod(r, p, n, m, d); };
    o.mkdir = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m) { Self(r)->Mkdir(r, p, n, m); };
    o.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { Self(r)->Unlink(r, p, n); };
    o.rmdir = [](fuse_req_t r, fuse_ino_t p, const char* n) { Self(r)->Rmdir(r, p, n); };
    o.symlink = [](fuse_req_t r, const char* t, fuse_ino_t p, const char* n) { Self(r)->Symlink(r, t, p, n); };
    o.rename = [](fuse_req_t r, fuse_ino_t p, const char* n, fuse_ino_t np, const char* nn, unsigned f) {
      Self(r)->Rename(r, p, n, np, nn, f);
    };
    o.link = [](fuse_req_t r, fuse_ino_t i, fuse_ino_t np, const char* nn) { Self(r)->Link(r, i, np, nn); };
    o.open = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { Self(r)->Open(r, i, fi); };
    o.read = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info*) { Self(r)->Read(r, i, s, off); };
    o.write = [](fuse_req_t r, fuse_ino_t i, const char* b, size_t s, off_t off, fuse_file_info*) {
      Self(r)->Write(r, i, b, s, off);
    };
    o.flush = [](fuse_req_t r, fuse_ino_t, fuse_file_info*) {
      Self(r)->Count(Op::kFlush);
      fuse_reply_err(r, 0);
    };
    o.release = [](fuse_req_t r, fuse_ino_t i, fuse_file_info*) { Self(r)->Release(r, i); };
    o.fsync = [](fuse_req_t r, fuse_ino_t i, int datasync, fuse_file_info*) {
      Self(r)->Count(Op::kFsync);
      Self(r)->Fsync(r, i, datasync != 0);
    };
    o.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { Self(r)->OpenDir(r, i, fi); };
    o.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info* fi) {
      Self(r)->ReadDir(r, i, s, off, fi, false);
    };
    o.readdirplus = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info* fi) {
      Self(r)->ReadDir(r, i, s, off, fi, true);
    };
    o.releasedir = [](fuse_req_t r, fuse_ino_t, fuse_file_info* fi) { Self(r)->ReleaseDir(r, fi); };
    o.fsyncdir = [](fuse_req_t r, fuse_ino_t i, int datasync, fuse_file_info*) {
      Self(r)->Count(Op::kFsyncdir);
      Self(r)->Fsync(r, i, datasync != 0);
    };
#ifdef UBTRFS_FUSE_HAS_SYNCFS
    o.syncfs = [](fuse_req_t r, fuse_ino_t) {
      Self(r)->Count(Op::kSyncfs);
      Self(r)->Fsync(r, 0, false);
    };
#endif
    o.statfs = [](fuse_req_t r, fuse_ino_t) { Self(r)->StatFs(r); };
    o.setxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, const char* v, size_t s, int f) {
      Self(r)->SetXattr(r, i, n, v, s, f);
    };
    o.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) { Self(r)->GetXattr(r, i, n, s); };
    o.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { Self(r)->ListXattr(r, i, s); };
    o.removexattr = [](fuse_req_t r, fuse_ino_t i, const char* n) { Self(r)->RemoveXattr(r, i, n); };
    o.create = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, fuse_file_info* fi) {
      Self(r)->Create(r, p, n, m, fi);
    };
    o.fallocate = [](fuse_req_t r, fuse_ino_t i, int m, off_t off, off_t len, fuse_file_info*) {
      Self(r)->Fallocate(r, i, m, off, len);
    };
    o.lseek = [](fuse_req_t r, fuse_ino_t i, off_t off, int whence, fuse_file_info*) {
      Self(r)->Lseek(r, i, off, whence);
    };
    o.copy_file_range = [](fuse_req_t r, fuse_ino_t in, off_t off_in, fuse_file_info*, fuse_ino_t out,
                           off_t off_out, fuse_file_info*, size_t len, int flags) {
      Self(r)->CopyFileRange(r, in, off_in, out, off_out, len, flags);
    };
    return o;
  }();
  return ops;
}

std::string Adapter::CountsReport() const {
  std::string out;
  for (int i = 0; i < static_cast<int>(Op::kCount); ++i) {
    const uint64_t n = counts_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    if (!out.empty()) out += ", ";
    out += std::string(kOpNames[i]) + " " + std::to_string(n);
  }
  return out.empty() ? "none" : out;
}

// ---- Helpers --------------------------------------------------------------------------------------

std::optional<InodeId> Adapter::Resolve(fuse_req_t req, fuse_ino_t node) {
  auto id = map_.ToInode(node);
  if (!id) fuse_reply_err(req, ESTALE);
  return id;
}

void Adapter::ReplyStatus(fuse_req_t req, const Status& st) {
  const int code = st.ok() ? 0 : (st.code() > 0 ? st.code() : EIO);
  if (code != 0 && opts_.log && WorthLogging(code)) LogError(code, st.ToString());
  fuse_reply_err(req, code);
}

void Adapter::LogError(int code, const std::string& msg) {
  if (code != ENOSPC) return opts_.log(msg);
  // A full device answers ENOSPC to every write until space comes back:
  // tens of thousands of lines a minute under fsstress, in syslog once
  // daemonized. One line per interval, with a count of the rest.
  const auto now = std::chrono::steady_clock::now();
  uint64_t suppressed;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    if (enospc_logged_ && now - enospc_last_ < kEnospcLogInterval) {
      ++enospc_suppressed_;
      return;
    }
    enospc_logged_ = true;
    enospc_last_ = now;
    suppressed = std::exchange(enospc_suppressed_, 0);
  }
  opts_.log(suppressed ? msg + " (and " + std::to_string(suppressed) + " more ENOSPC answers since the last one logged)"
                       : msg);
}

struct stat Adapter::ToStat(uint64_t node, const Stat& s) {
  struct stat st {};
  st.st_ino = map_.StIno(node, s.id);
  st.st_mode = s.mode;
  st.st_nlink = s.nlink;
  st.st_uid = s.uid;
  st.st_gid = s.gid;
  st.st_rdev = s.rdev;
  st.st_size = static_cast<off_t>(s.size);
  st.st_blksize = block_size_;
  // As the kernel reports it: allocated bytes rounded up to sectors.
  st.st_blocks = static_cast<blkcnt_t>((s.nbytes + block_size_ - 1) / block_size_ * block_size_ / 512);
  st.st_atim = ToTimespec(s.atime);
  st.st_mtim = ToTimespec(s.mtime);
  st.st_ctim = ToTimespec(s.ctime);
  return st;
}

void Adapter::ReplyEntry(fuse_req_t req, InodeId id, fuse_file_info* fi) {
  auto st = fs_.GetStat(id);
  if (!st.ok()) return ReplyStatus(req, st.status());
  fuse_entry_param e{};
  e.ino = map_.ToNode(id);
  e.generation = st->generation;
  e.attr = ToStat(e.ino, *st);
  e.attr_timeout = opts_.attr_timeout;
  e.entry_timeout = opts_.entry_timeout;
  map_.AddLookup(e.ino);
  if (fi) {
    Opened(e.ino, id);
    fi->keep_cache = 1;
    fi->noflush = 1;
    if (fuse_reply_create(req, &e, fi) != 0) {
      map_.Forget(e.ino, 1);
      (void)Closed(e.ino);
    }
    return;
  }
  if (fuse_reply_entry(req, &e) != 0) map_.Forget(e.ino, 1);
}

Result<Adapter::NewSpec> Adapter::NewAttrs(fuse_req_t req, InodeId dir, uint32_t mode, bool is_dir, bool acls) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  NewSpec spec;
  NewInode& a = spec.attrs;
  a.mode = mode;
  a.uid = ctx->uid;
  a.gid = ctx->gid;
  UB_ASSIGN_OR_RETURN(Stat d, fs_.GetStat(dir));
  if (d.mode & S_ISGID) {
    // As the kernel does for setgid directories (inode_init_owner).
    a.gid = d.gid;
    if (is_dir) a.mode |= S_ISGID;
  }
  bool inherited = false;
  if (acls) {
    uint64_t changes = 0;
    Result<std::string> def = Status::Error(ENODATA, "no default ACL");
    if (!KnownWithoutDefaultAcl(dir, &changes)) {
      def = fs_.GetXattr(dir, acl::kDefaultName);
      if (!def.ok() && def.status().code() == ENODATA) NoteWithoutDefaultAcl(dir, changes);
    }
    if (def.ok()) {
      if (auto parsed = acl::Parse(*def)) {
        inherited = true;
        uint32_t m = a.mode & 07777;
        if (auto access = acl::CreateMasq(*parsed, &m)) spec.access_acl = acl::Serialize(*access);
        a.mode = (a.mode & ~07777u) | m;
        if (is_dir) spec.default_acl = *def;
      }
    } else if (def.status().code() != ENODATA) {
      return def.status();
    }
    // The caller's umask (FUSE_CAP_DONT_MASK: the kernel leaves it to us)
    // applies only where no default ACL decides the mode.
    if (!inherited) a.mode &= ~(static_cast<uint32_t>(ctx->umask) & 0777);
  }
  return spec;
}

bool Adapter::KnownWithoutDefaultAcl(InodeId dir, uint64_t* changes) {
  std::lock_guard lock(acl_mu_);
  *changes = default_acl_sets_;
  return without_default_acl_.count({dir.root, dir.ino}) != 0;
}

void Adapter::NoteWithoutDefaultAcl(InodeId dir, uint64_t changes_seen) {
  std::lock_guard lock(acl_mu_);
  if (default_acl_sets_ == changes_seen) without_default_acl_.insert({dir.root, dir.ino});
}

void Adapter::NoteDefaultAclSet(InodeId dir) {
  std::lock_guard lock(acl_mu_);
  ++default_acl_sets_;
  without_default_acl_.erase({dir.root, dir.ino});
}

Status Adapter::ApplyInherited(InodeId id, const NewSpec& spec) {
  if (spec.access_acl) UB_RETURN_IF_ERROR(fs_.SetXattr(id, acl::kAccessName, *spec.access_acl));
  if (spec.default_acl) UB_RETURN_IF_ERROR(fs_.SetXattr(id, acl::kDefaultName, *spec.default_acl));
  return Status::Ok();
}

bool Adapter::InGroupOrCapable(fuse_req_t req, uint32_t gid) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  if (ctx->uid == 0 || ctx->gid == gid) return true;
  gid_t groups[256];
  const int n = fuse_req_getgroups(req, 256, groups);
  for (int i = 0; i < std::min(n, 256); ++i) {
    if (groups[i] == gid) return true;
  }
  return false;
}

Status Adapter::SetAcl(fuse_req_t req, fuse_ino_t ino, InodeId id, std::string_view name, std::string_view value) {
  UB_ASSIGN_OR_RETURN(Stat st, fs_.GetStat(id));
  const fuse_ctx* ctx = fuse_req_ctx(req);
  if (ctx->uid != 0 && ctx->uid != st.uid) return Status::Error(EPERM, "only the owner may set an ACL");
  if (S_ISLNK(st.mode)) return Status::Error(EOPNOTSUPP, "no ACLs on symlinks");
  if (value.empty()) {
    // An empty value removes the ACL.
    Status s = fs_.RemoveXattr(id, name);
    return s.code() == ENODATA ? Status::Ok() : s;
  }
  auto parsed = acl::Parse(value);
  if (!parsed) return Status::Invalid("malformed POSIX ACL");
  if (name == acl::kDefaultName) {
    if (!S_ISDIR(st.mode)) return Status::Error(EACCES, "default ACLs are for directories");
    Status s = fs_.SetXattr(id, name, acl::Serialize(*parsed));
    NoteDefaultAclSet(id);
    return s;
  }
  // posix_acl_update_mode: the ACL sets the permission bits, and one the
  // bits say in full is not kept.
  bool equivalent = false;
  uint32_t mode = (st.mode & 07000) | acl::ModeBits(*parsed, &equivalent);
  if ((mode & S_ISGID) && !InGroupOrCapable(req, st.gid)) mode &= ~static_cast<uint32_t>(S_ISGID);
  if (equivalent) {
    Status s = fs_.RemoveXattr(id, name);
    if (!s.ok() && s.code() != ENODATA) return s;
  } else {
    UB_RETURN_IF_ERROR(fs_.SetXattr(id, name, acl::Serialize(*parsed)));
  }
  if (mode != (st.mode & 07777)) {
    AttrChange c;
    c.mode = mode;
    UB_RETURN_IF_ERROR(fs_.SetAttr(id, c));
    // The kernel does not refetch attributes after a setxattr.
    if (session_) fuse_lowlevel_notify_inval_inode(session_, ino, -1, 0);
  }
  return Status::Ok();
}

void Adapter::Opened(uint64_t node, InodeId id) {
  {
    std::lock_guard<std::mutex> lock(open_mu_);
    auto& o = open_[node];
    o.id = id;
    ++o.count;
  }
  fs_.PinInode(id);
}

Status Adapter::Closed(uint64_t node) {
  InodeId id;
  {
    std::lock_guard<std::mutex> lock(open_mu_);
    auto it = open_.find(node);
    if (it == open_.end()) return Status::Ok();
    id = it->second.id;
    if (--it->second.count == 0) open_.erase(it);
  }
  // The last close of a file whose last name went deletes it (library).
  Status s = fs_.UnpinInode(id);
  MarkDirty();
  return s;
}

Status Adapter::CommitIfDirty() {
  if (opts_.read_only) return Status::Ok();
  if (!dirty_.exchange(false, std::memory_order_acq_rel)) return Status::Ok();
  Status st = fs_.Commit();
  if (!st.ok()) MarkDirty();
  return st;
}

Status Adapter::Shutdown() {
  std::unordered_map<uint64_t, OpenHandles> open;
  {
    std::lock_guard<std::mutex> lock(open_mu_);
    open.swap(open_);
  }
  Status first;
  for (const auto& [node, o] : open) {
    for (uint64_t i = 0; i < o.count; ++i) {
      Status s = fs_.UnpinInode(o.id);
      if (!s.ok() && first.ok()) first = s.WithContext("removing a file unlinked while open");
    }
  }
  if (!open.empty()) MarkDirty();
  return first;
}

// ---- Requests ---------------------------------------------------------------------------------------

void Adapter::Init(fuse_conn_info* conn) {
  Count(Op::kInit);
  if (conn->capable & FUSE_CAP_EXPORT_SUPPORT) conn->want |= FUSE_CAP_EXPORT_SUPPORT;
  if (!opts_.readdirplus) conn->want &= ~(FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO);
  if (opts_.writeback_cache && (conn->capable & FUSE_CAP_WRITEBACK_CACHE)) {
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    // The kernel then keeps regular files' mtime and ctime (it never takes
    // ours again while the inode is cached) and sends them with SETATTR;
    // stamps of our own at WRITE would outlive what stat showed.
    fs_.SetCallerKeepsFileTimes(true);
  }
  conn->want &= ~FUSE_CAP_POSIX_ACL;  // ACLs: see posix_acl.h (kept consistent, not enforced)
  // The umask comes with create/mkdir/mknod instead of being applied by the
  // kernel, so that a directory's default ACL can override it (NewAttrs).
  if (conn->capable & FUSE_CAP_DONT_MASK) conn->want |= FUSE_CAP_DONT_MASK;
  // libfuse asks by default to clear setuid/setgid itself on write, chown and
  // truncate (KILLPRIV v1); the kernel does that well enough (a setattr, only
  // when such a bit is set), so let it.
  conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
  conn->time_gran = 1;
  // Writes of up to 1 MiB per request (libfuse's buffer holds that much; the
  // kernel's default is 128 KiB): a large write costs an eighth of the round
  // trips, and the data reaches the image in extents as large.
  conn->max_write = 1u << 20;
  // The kernel keeps the smaller of this and what the mount's sysfs knob
  // says by now (SetMountReadahead, before the session loop runs).
  if (opts_.max_readahead) conn->max_readahead = opts_.max_readahead;
}

void Adapter::Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Count(Op::kLookup);
  auto dir = Resolve(req, parent);
  if (!dir) return;
  // The library answers EINVAL for an over-long name; POSIX says ENAMETOOLONG.
  if (std::strlen(name) > 255) return Err(req, ENAMETOOLONG);
  auto id = fs_.LookupChild(*dir, Sv(name));
  if (!id.ok()) {
    if (id.status().code() == ENOENT && opts_.negative_timeout > 0) {
      fuse_entry_param e{};
      e.entry_timeout = opts_.negative_timeout;
      fuse_reply_entry(req, &e);
      return;
    }
    return ReplyStatus(req, id.status());
  }
  ReplyEntry(req, *id);
}

void Adapter::Forget(fuse_ino_t ino, uint64_t nlookup) {
  Count(Op::kForget);
  map_.Forget(ino, nlookup);
}

void Adapter::GetAttr(fuse_req_t req, fuse_ino_t ino) {
  Count(Op::kGetattr);
  auto id = Resolve(req, ino);
  if (!id) return;
  auto st = fs_.GetStat(*id);
  if (!st.ok()) return ReplyStatus(req, st.status());
  struct stat s = ToStat(ino, *st);
  fuse_reply_attr(req, &s, opts_.attr_timeout);
}

void Adapter::SetAttr(fuse_req_t req, fuse_ino_t ino, const struct stat* attr, int to_set) {
  Count(Op::kSetattr);
  auto id = Resolve(req, ino);
  if (!id) return;
  AttrChange c;
  if (to_set & FUSE_SET_ATTR_MODE) c.mode = attr->st_mode & 07777;
  if (to_set & FUSE_SET_ATTR_UID) c.uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) c.gid = attr->st_gid;
  if (to_set & FUSE_SET_ATTR_SIZE) c.size = static_cast<uint64_t>(attr->st_size);
  const Time now = Now();
  // UTIME_NOW arrives as *_NOW; UTIME_OMIT as the flag not being set.
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
    c.atime = now;
  } else if (to_set & FUSE_SET_ATTR_ATIME) {
    c.atime = FromTimespec(attr->st_atim);
  }
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
    c.mtime = now;
  } else if (to_set & FUSE_SET_ATTR_MTIME) {
    c.mtime = FromTimespec(attr->st_mtim);
  }
  if (to_set & FUSE_SET_ATTR_CTIME) c.ctime = FromTimespec(attr->st_ctim);
  Status s = fs_.SetAttr(*id, c);
  constexpr int kFlushedTimes = FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_CTIME;  // what fuse_flush_times sends
  if (!s.ok() && s.code() == ENOENT && opts_.writeback_cache &&
      (to_set & (kFlushedTimes | FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID | FUSE_SET_ATTR_SIZE |
                 FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW)) == kFlushedTimes) {
    // With the write-back cache the kernel writes its cached times of a
    // regular file back itself, also right after the file's last name went
    // (and its last release deleted it). An error here
    // would be recorded as a write-back error, and syncfs(2) of the whole
    // mount would then fail with ENOENT. The kernel's btrfs keeps such an
    // inode until it is evicted; here it is gone, and so is what the times
    // were for.
    struct stat out {};
    out.st_ino = map_.StIno(ino, *id);
    out.st_mode = S_IFREG;
    out.st_nlink = 0;
    out.st_blksize = block_size_;
    out.st_mtim = attr->st_mtim;
    out.st_ctim = attr->st_ctim;
    fuse_reply_attr(req, &out, 0);
    return;
  }
  if (!s.ok()) return ReplyStatus(req, s);
  MarkDirty();
  if (c.mode) {
    // posix_acl_chmod: the access ACL follows the new permission bits.
    auto cur = fs_.GetXattr(*id, acl::kAccessName);
    if (cur.ok()) {
      if (auto parsed = acl::Parse(*cur)) s = fs_.SetXattr(*id, acl::kAccessName, acl::Serialize(acl::Chmod(*parsed, *c.mode)));
    } else if (cur.status().code() != ENODATA) {
      s = cur.status();
    }
    if (!s.ok()) return ReplyStatus(req, s);
  }
  auto st = fs_.GetStat(*id);
  if (!st.ok()) return ReplyStatus(req, st.status());
  struct stat out = ToStat(ino, *st);
  fuse_reply_attr(req, &out, opts_.attr_timeout);
}

void Adapter::ReadLink(fuse_req_t req, fuse_ino_t ino) {
  Count(Op::kReadlink);
  auto id = Resolve(req, ino);
  if (!id) return;
  auto target = fs_.ReadLink(*id);
  if (!target.ok()) return ReplyStatus(req, target.status());
  fuse_reply_readlink(req, target->c_str());
}

void Adapter::Mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  Count(Op::kMknod);
  auto dir = Resolve(req, parent);
  if (!dir) return;
  auto a = NewAttrs(req, *dir, mode, false);
  if (!a.ok()) return ReplyStatus(req, a.status());
  a->attrs.rdev = rdev;
  auto id = fs_.Mknod(*dir, Sv(name), a->attrs);
  if (!id.ok()) return ReplyStatus(req, id.status());
  MarkDirty();
  if (Status s = ApplyInherited(*id, *a); !s.ok()) return ReplyStatus(req, s);
  ReplyEntry(req, *id);
}

void Adapter::Mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Count(Op::kMkdir);
  auto dir = Resolve(req, parent);
  if (!dir) return;
  auto a = NewAttrs(req, *dir, mode & 07777, true);
  if (!a.ok()) return ReplyStatus(req, a.status());
  auto id = fs_.Mkdir(*dir, Sv(name), a->attrs);
  if (!id.ok()) return ReplyStatus(req, id.status());
  MarkDirty();
  if (Status s = ApplyInherited(*id, *a); !s.ok()) return ReplyStatus(req, s);
  ReplyEntry(req, *id);
}

void Adapter::Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Count(Op::kUnlink);
  auto dir = Resolve(req, parent);
  if (!dir) return;
  Status s = fs_.Unlink(*dir, Sv(name));
  if (s.ok()) MarkDirty();
  ReplyStatus(req, s);
}

void Adapter::Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Count(Op::kRmdir);
  auto dir = Resolve(req, parent);
  if (!dir) return;
  Status s = fs_.Rmdir(*dir, Sv(name));
  if (s.ok()) MarkDirty();
  ReplyStatus(req, s);
}

void Adapter::Symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  Count(Op::kSymlink);
  auto dir = Resolve(req, parent);
  if (!dir) return;
  auto a = NewAttrs(req, *dir, 0777, false, /*acls=*/false);
  if (!a.ok()) return ReplyStatus(req, a.status());
  auto id = fs_.Symlink(*dir, Sv(name), Sv(target), a->attrs);
  if (!id.ok()) return ReplyStatus(req, id.status());
  MarkDirty();
  ReplyEntry(req, *id);
}

void Adapter::Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                     const char* newname, unsigned flags) {
  Count(Op::kRename);
  if (flags & ~static_cast<unsigned>(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
    return Err(req, EINVAL);  // RENAME_WHITEOUT: overlayfs only
  }
  auto from = Resolve(req, parent);
  if (!from) return;
  auto to = Resolve(req, newparent);
  if (!to) return;
  unsigned f = 0;
  if (flags & RENAME_NOREPLACE) f |= kRenameNoReplace;
  if (flags & RENAME_EXCHANGE) f |= kRenameExchange;
  Status s = fs_.Rename(*from, Sv(name), *to, Sv(newname), f);
  if (s.ok()) MarkDirty();
  ReplyStatus(req, s);
}

void Adapter::Link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Count(Op::kLink);
  auto id = Resolve(req, ino);
  if (!id) return;
  auto dir = Resolve(req, newparent);
  if (!dir) return;
  Status s = fs_.Link(*id, *dir, Sv(newname));
  if (!s.ok()) return ReplyStatus(req, s);
  MarkDirty();
  ReplyEntry(req, *id);
}

void Adapter::Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Count(Op::kOpen);
  auto id = Resolve(req, ino);
  if (!id) return;
  if (opts_.read_only && (fi->flags & O_ACCMODE) != O_RDONLY) return Err(req, EROFS);
  if ((fi->flags & O_ACCMODE) != O_RDONLY) {
    // A read-only subvolume refuses the open, as the kernel's permission
    // check does, not only the first write.
    auto ro = fs_.SubvolumeReadOnly(InodeId{id->root, kSubvolTopIno});
    if (ro.ok() && *ro) return Err(req, EROFS);
    // A file with fs-verity is never opened for writing (fsverity_file_open).
    auto st = fs_.GetStat(*id);
    if (st.ok() && (st->flags & kStatFlagVerity)) return Err(req, EPERM);
  }
  if ((fi->flags & O_TRUNC) && (fi->flags & O_ACCMODE) != O_RDONLY) {
    // With atomic O_TRUNC (libfuse's default) the truncation is ours, and so
    // is the setuid/setgid clearing the kernel skips on this path.
    auto st = fs_.GetStat(*id);
    if (!st.ok()) return ReplyStatus(req, st.status());
    if (S_ISREG(st->mode)) {
      AttrChange c;
      c.size = 0;
      const bool sgid_exec = (st->mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP);
      if (fuse_req_ctx(req)->uid != 0 && ((st->mode & S_ISUID) || sgid_exec)) {
        c.mode = st->mode & 07777 & ~static_cast<uint32_t>(S_ISUID | (sgid_exec ? S_ISGID : 0));
      }
      Status s = fs_.SetAttr(*id, c);
      if (!s.ok()) return ReplyStatus(req, s);
      MarkDirty();
    }
  }
  Opened(ino, *id);
  // Every change goes through this mount, so cached pages stay valid.
  fi->keep_cache = 1;
  fi->noflush = 1;
  if (fuse_reply_open(req, fi) != 0) (void)Closed(ino);
}

void Adapter::Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off) {
  Count(Op::kRead);
  auto id = Resolve(req, ino);
  if (!id) return;
  if (off < 0) return Err(req, EINVAL);
  thread_local std::vector<uint8_t> buf;
  thread_local std::vector<iovec> iov;
  if (buf.size() < size) buf.resize(size);
  // The reply is written from the pieces in place (a map of the image where
  // the data is plain on disk), not from a copy in buf.
  auto n = fs_.ReadPieces(*id, static_cast<uint64_t>(off), std::span(buf.data(), size),
                          [&](std::span<const Filesystem::ReadPiece> pieces) {
                            iov.clear();
                            for (const auto& p : pieces) iov.push_back(iovec{const_cast<uint8_t*>(p.data), p.size});
                            fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size()));
                          });
  if (!n.ok()) return ReplyStatus(req, n.status());
}

void Adapter::Write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off) {
  Count(Op::kWrite);
  auto id = Resolve(req, ino);
  if (!id) return;
  if (off < 0) return Err(req, EINVAL);
  auto n = fs_.Write(*id, static_cast<uint64_t>(off), std::span(reinterpret_cast<const uint8_t*>(buf), size));
  if (!n.ok()) return ReplyStatus(req, n.status());
  MarkDirty();
  fuse_reply_write(req, *n);
}

void Adapter::Release(fuse_req_t req, fuse_ino_t ino) {
  Count(Op::kRelease);
  Status s = Closed(ino);
  if (!s.ok() && opts_.log) opts_.log("removing a file unlinked while open: " + s.ToString());
  fuse_reply_err(req, 0);
}

void Adapter::Fsync(fuse_req_t req, fuse_ino_t ino, bool datasync) {
  if (opts_.read_only) return Err(req, 0);
  // fsync of the mount's top directory (`sync MOUNTPOINT`) commits
  // everything: with no syncfs from the kernel (FUSE does not pass it on),
  // it is the one way a shell has to make the whole mount durable.
  if (ino != 0 && ino != FUSE_ROOT_ID && opts_.tree_log) {
    // The inode's changes go to the tree log; the periodic commit still
    // has the rest (the mount stays dirty).
    auto id = Resolve(req, ino);
    if (!id) return;
    return ReplyStatus(req, fs_.Fsync(*id, datasync));
  }
  dirty_.store(false, std::memory_order_release);
  Status s = fs_.Commit();
  if (!s.ok()) MarkDirty();
  ReplyStatus(req, s);
}

void Adapter::OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Count(Op::kOpendir);
  auto id = Resolve(req, ino);
  if (!id) return;
  auto st = fs_.GetStat(*id);
  if (!st.ok()) return ReplyStatus(req, st.status());
  if (!S_ISDIR(st->mode)) return Err(req, ENOTDIR);
  auto* h = new DirHandle;
  fi->fh = reinterpret_cast<uint64_t>(h);
  if (fuse_reply_open(req, fi) != 0) delete h;
}

void Adapter::ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  Count(plus ? Op::kReaddirplus : Op::kReaddir);
  auto id = Resolve(req, ino);
  if (!id) return;
  auto* h = reinterpret_cast<DirHandle*>(fi->fh);
  std::vector<char> buf(size);
  size_t pos = 0;
  Status status;
  {
    // The reply goes out after the handle's lock is dropped: once the kernel
    // has it, a RELEASEDIR may free the handle.
    std::lock_guard<std::mutex> lock(h->mu);
    status = FillDir(req, ino, *id, *h, off, plus, buf, &pos);
  }
  if (!status.ok()) return ReplyStatus(req, status);
  fuse_reply_buf(req, buf.data(), pos);
}

Status Adapter::FillDir(fuse_req_t req, fuse_ino_t ino, InodeId id, DirHandle& h, off_t off, bool plus,
                        std::vector<char>& buf, size_t* used) {
  if (off == 0 || !h.loaded) {
    // A listing per opendir/rewind: a resumed readdir walks the same
    // snapshot (POSIX leaves entries added or removed meanwhile open).
    std::vector<SkippedEntry> skipped;
    UB_ASSIGN_OR_RETURN(h.entries, fs_.ReadDir(id, &skipped));
    if (!skipped.empty()) WarnSkipped(id, skipped);
    UB_ASSIGN_OR_RETURN(h.parent, fs_.LookupChild(id, ".."));
    h.loaded = true;
  }
  const size_t size = buf.size();
  size_t& pos = *used;
  // Adds one entry; false when the buffer is full.
  auto add = [&](const char* name, uint64_t node, InodeId inode, uint32_t mode, const Stat* st, off_t next) {
    struct stat s {};
    s.st_ino = map_.StIno(node, inode);
    s.st_mode = mode;
    size_t len;
    if (plus) {
      fuse_entry_param e{};
      e.attr = st ? ToStat(node, *st) : s;
      if (st) {
        e.ino = node;
        e.generation = st->generation;
        e.attr_timeout = opts_.attr_timeout;
        e.entry_timeout = opts_.entry_timeout;
      }
      len = fuse_add_direntry_plus(req, buf.data() + pos, size - pos, name, &e, next);
      if (len > size - pos) return false;
      if (st) map_.AddLookup(node);
    } else {
      len = fuse_add_direntry(req, buf.data() + pos, size - pos, name, &s, next);
      if (len > size - pos) return false;
    }
    pos += len;
    return true;
  };
  // "." and ".." carry no attributes in readdirplus (the kernel ignores them).
  if (off < 1 && !add(".", ino, id, S_IFDIR, nullptr, 1)) return Status::Ok();
  if (off < 2 && !add("..", map_.ToNode(h.parent), h.parent, S_IFDIR, nullptr, 2)) return Status::Ok();
  auto it = std::lower_bound(h.entries.begin(), h.entries.end(), static_cast<uint64_t>(std::max<off_t>(off, 0)),
                             [](const DirEntry& e, uint64_t v) { return e.index < v; });
  for (; it != h.entries.end(); ++it) {
    const uint64_t node = map_.ToNode(it->id);
    const uint32_t mode = static_cast<uint32_t>(it->type) << 12;  // DTTOIF
    const off_t next = static_cast<off_t>(it->index + 1);
    if (plus) {
      auto st = fs_.GetStat(it->id);
      // Gone since the listing: still an entry, just without attributes.
      if (!add(it->name.c_str(), node, it->id, mode, st.ok() ? &*st : nullptr, next)) break;
    } else if (!add(it->name.c_str(), node, it->id, mode, nullptr, next)) {
      break;
    }
  }
  return Status::Ok();
}

void Adapter::WarnSkipped(InodeId dir, const std::vector<SkippedEntry>& skipped) {
  {
    std::lock_guard<std::mutex> lock(warned_mu_);
    if (!warned_dirs_.insert({dir.root, dir.ino}).second) return;
  }
  std::fprintf(stderr, "ubtrfs: mount: warning: directory inode %llu in tree %llu: %zu damaged entries not shown\n",
               static_cast<unsigned long long>(dir.ino), static_cast<unsigned long long>(dir.root), skipped.size());
  constexpr size_t kShown = 10;
  for (size_t i = 0; i < skipped.size() && i < kShown; ++i) {
    if (skipped[i].name.empty()) {  // a lost range (RescueOptions::salvage), not one entry
      std::fprintf(stderr, "ubtrfs: mount: warning:   %s\n", skipped[i].reason.c_str());
      continue;
    }
    std::string name;
    for (unsigned char c : skipped[i].name) {
      char b[8];
      if (c < 0x20 || c >= 0x7f || c == '\\') {
        std::snprintf(b, sizeof b, "\\x%02x", c);
        name += b;
      } else {
        name.push_back(static_cast<char>(c));
      }
    }
    std::fprintf(stderr, "ubtrfs: mount: warning:   '%s' (index %llu): %s\n", name.c_str(),
                 static_cast<unsigned long long>(skipped[i].index), skipped[i].reason.c_str());
  }
}

void Adapter::ReleaseDir(fuse_req_t req, fuse_file_info* fi) {
  Count(Op::kReleasedir);
  delete reinterpret_cast<DirHandle*>(fi->fh);
  fuse_reply_err(req, 0);
}

void Adapter::StatFs(fuse_req_t req) {
  Count(Op::kStatfs);
  auto s = fs_.StatFs();
  if (!s.ok()) return ReplyStatus(req, s.status());
  struct statvfs v {};
  const uint64_t bs = s->block_size ? s->block_size : block_size_;
  v.f_bsize = bs;
  v.f_frsize = bs;
  v.f_blocks = s->total_bytes / bs;
  v.f_bfree = s->free_bytes / bs;
  v.f_bavail = s->avail_bytes / bs;
  v.f_files = 0;  // btrfs has no fixed inode table; the kernel reports 0 too
  v.f_ffree = 0;
  v.f_namemax = s->name_max;
  fuse_reply_statfs(req, &v);
}

void Adapter::SetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                       int flags) {
  Count(Op::kSetxattr);
  auto id = Resolve(req, ino);
  if (!id) return;
  const std::string_view n = Sv(name), v(value, size);
  Status s = n == acl::kAccessName || n == acl::kDefaultName ? SetAcl(req, ino, *id, n, v)
                                                             : fs_.SetXattr(*id, n, v, flags);
  MarkDirty();
  ReplyStatus(req, s);
}

void Adapter::GetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  Count(Op::kGetxattr);
  if (ino == FUSE_ROOT_ID && (Sv(name) == kStatsXattr || Sv(name) == kStatsTextXattr)) {
    const std::string j = Sv(name) == kStatsXattr ? CollectStats().ToJson() : CollectStats().ToText();
    if (size == 0) return (void)fuse_reply_xattr(req, j.size());
    if (j.size() > size) return Err(req, ERANGE);
    return (void)fuse_reply_buf(req, j.data(), j.size());
  }
  auto id = Resolve(req, ino);
  if (!id) return;
  auto v = fs_.GetXattr(*id, Sv(name));
  if (!v.ok()) return ReplyStatus(req, v.status());
  if (size == 0) return (void)fuse_reply_xattr(req, v->size());
  if (v->size() > size) return Err(req, ERANGE);
  fuse_reply_buf(req, v->data(), v->size());
}

void Adapter::ListXattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  Count(Op::kListxattr);
  auto id = Resolve(req, ino);
  if (!id) return;
  auto names = fs_.ListXattr(*id);
  if (!names.ok()) return ReplyStatus(req, names.status());
  std::string out;
  for (const auto& n : *names) {
    out += n;
    out.push_back('\0');
  }
  if (size == 0) return (void)fuse_reply_xattr(req, out.size());
  if (out.size() > size) return Err(req, ERANGE);
  fuse_reply_buf(req, out.data(), out.size());
}

void Adapter::RemoveXattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  Count(Op::kRemovexattr);
  auto id = Resolve(req, ino);
  if (!id) return;
  Status s = fs_.RemoveXattr(*id, Sv(name));
  if (s.ok()) MarkDirty();
  ReplyStatus(req, s);
}

void Adapter::Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Count(Op::kCreate);
  auto dir = Resolve(req, parent);
  if (!dir) return;
  auto a = NewAttrs(req, *dir, mode & 07777, false);
  if (!a.ok()) return ReplyStatus(req, a.status());
  auto id = fs_.Create(*dir, Sv(name), a->attrs);
  if (id.ok()) {
    MarkDirty();
    if (Status s = ApplyInherited(*id, *a); !s.ok()) return ReplyStatus(req, s);
  } else if (id.status().code() == EEXIST && !(fi->flags & O_EXCL)) {
    // Created by someone else since the kernel's lookup: open that one.
    id = fs_.LookupChild(*dir, Sv(name));
    if (id.ok()) {
      auto st = fs_.GetStat(*id);
      if (!st.ok()) return ReplyStatus(req, st.status());
      if (S_ISDIR(st->mode)) return Err(req, EISDIR);
      if (fi->flags & O_TRUNC) {
        AttrChange c;
        c.size = 0;
        Status s = fs_.SetAttr(*id, c);
        if (!s.ok()) return ReplyStatus(req, s);
      }
    }
  }
  if (!id.ok()) return ReplyStatus(req, id.status());
  MarkDirty();
  ReplyEntry(req, *id, fi);
}

void Adapter::Fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length) {
  Count(Op::kFallocate);
  auto id = Resolve(req, ino);
  if (!id) return;
  if (offset < 0 || length <= 0) return Err(req, EINVAL);
  // The library does it all: PREALLOC extents, KEEP_SIZE, punched holes,
  // zeroed ranges; EOPNOTSUPP for other modes.
  Status s = fs_.Fallocate(*id, mode, static_cast<uint64_t>(offset), static_cast<uint64_t>(length));
  if (s.ok()) MarkDirty();
  ReplyStatus(req, s);
}

void Adapter::Lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence) {
  Count(Op::kLseek);
  auto id = Resolve(req, ino);
  if (!id) return;
  // The kernel answers SEEK_SET/CUR/END itself and sends only these.
  if ((whence != SEEK_DATA && whence != SEEK_HOLE) || off < 0) return Err(req, EINVAL);
  // With the write-back cache, data may still sit in the kernel's pages
  // (it does not flush them before FUSE_LSEEK): ENOSYS makes it answer from
  // its own size, everything data, for the rest of the mount.
  if (opts_.writeback_cache) return Err(req, ENOSYS);
  auto pos = fs_.SeekHole(*id, static_cast<uint64_t>(off), whence == SEEK_HOLE);
  if (!pos.ok()) return ReplyStatus(req, pos.status());
  fuse_reply_lseek(req, static_cast<off_t>(*pos));
}

void Adapter::CopyFileRange(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, fuse_ino_t ino_out, off_t off_out,
                            size_t len, int flags) {
  Count(Op::kCopyFileRange);
  auto in = Resolve(req, ino_in);
  if (!in) return;
  auto out = Resolve(req, ino_out);
  if (!out) return;
  if (flags != 0 || off_in < 0 || off_out < 0) return Err(req, EINVAL);
  if (opts_.read_only) return Err(req, EROFS);
  // The kernel has checked the descriptors, the file types and that the
  // ranges of one file do not overlap. A short copy is a valid answer; the
  // reply's count is 32 bits, and one request should not hold a thread for
  // long: at most 1 GiB per call.
  len = std::min<size_t>(len, size_t{1} << 30);
  size_t done = 0;
  Status s;
  // A reflink for the whole sectors of the range (and the source's partial
  // last sector where it may land: at or past the destination's end); the
  // rest, and any range the library refuses to share, is copied.
  auto src_st = fs_.GetStat(*in);
  if (!src_st.ok()) return ReplyStatus(req, src_st.status());
  auto dst_st = fs_.GetStat(*out);
  if (!dst_st.ok()) return ReplyStatus(req, dst_st.status());
  const uint64_t bs = fs_.Info().sectorsize, uin = static_cast<uint64_t>(off_in), uout = static_cast<uint64_t>(off_out);
  if (uin >= src_st->size) {
    fuse_reply_write(req, 0);
    return;
  }
  len = static_cast<size_t>(std::min<uint64_t>(len, src_st->size - uin));
  if (bs != 0 && uin % bs == 0 && uout % bs == 0) {
    uint64_t share = len;
    if (uin + len != src_st->size || uout + len < dst_st->size) share = share / bs * bs;
    if (share > 0) {
      Status c = fs_.Clone(*in, uin, *out, uout, share);
      if (c.ok()) {
        MarkDirty();
        done = static_cast<size_t>(share);
      } else if (c.code() != EINVAL && c.code() != EOPNOTSUPP) {
        return ReplyStatus(req, c);
      }
    }
  }
  constexpr size_t kChunk = 1 << 20;
  thread_local std::vector<uint8_t> buf;
  if (done < len && buf.size() < kChunk) buf.resize(kChunk);
  while (done < len) {
    const size_t want = std::min(len - done, kChunk);
    auto n = fs_.Read(*in, static_cast<uint64_t>(off_in) + done, std::span(buf.data(), want));
    if (!n.ok()) {
      s = n.status();
      break;
    }
    if (*n == 0) break;  // end of the source
    auto w = fs_.Write(*out, static_cast<uint64_t>(off_out) + done, std::span<const uint8_t>(buf.data(), *n));
    if (!w.ok()) {
      s = w.status();
      break;
    }
    if (*w > 0) MarkDirty();
    done += *w;
    if (*w < *n) break;
  }
  if (done == 0 && !s.ok()) return ReplyStatus(req, s);
  fuse_reply_write(req, done);
}

}  // namespace ubtrfs::fuse
