// The FUSE low-level adapter: each request becomes calls on one
// ubtrfs::Filesystem, and each Status its errno. No file-system logic lives
// here beyond what the kernel expects of a FUSE server and the library does
// not (yet) do itself:
//   - node ids and lookup counts (InodeMap);
//   - setgid directories: new inodes take the directory's group, new
//     subdirectories its setgid bit;
//   - open files are pinned in the library (Filesystem::PinInode): one
//     unlinked (or renamed over) while open lives on with no name, as an
//     orphan inode, until its last release;
//   - readdir offsets: "." is 1, ".." is 2, an entry is its DIR_INDEX + 1,
//     so a resumed readdir continues after the last entry returned;
//   - POSIX ACL xattrs kept consistent with the mode as the kernel's VFS does
//     for native file systems (posix_acl.h); the kernel does not enforce
//     them (no FUSE_POSIX_ACL), permission checks use the mode bits
//     (default_permissions);
//   - open(O_TRUNC) truncates here (libfuse's default atomic O_TRUNC);
//   - copy_file_range shares the range's whole sectors (Filesystem::Clone,
//     a reflink) and copies the rest through the library;
//   - with the write-back cache the kernel owns regular files' mtime and
//     ctime (Filesystem::SetCallerKeepsFileTimes), and its time write-back
//     on a file whose last name went is answered, not refused.
#ifndef UBTRFS_FUSE_ADAPTER_H_
#define UBTRFS_FUSE_ADAPTER_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fuse/fuse_api.h"
#include "fuse/inode_map.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::fuse {

// getxattr of this name on the mount's root returns the live statistics
// (include/ubtrfs/stats.h) as JSON, of the second as text; `ubtrfs stats
// MOUNTPOINT` reads them. Neither is listed or stored in the image.
inline constexpr std::string_view kStatsXattr = "user.ubtrfs.stats";
inline constexpr std::string_view kStatsTextXattr = "user.ubtrfs.stats.text";

struct AdapterOptions {
  double attr_timeout = 1.0;      // seconds the kernel may cache attributes
  double entry_timeout = 1.0;     // ... names
  double negative_timeout = 1.0;  // ... "no such name"; 0 = not cached
  bool read_only = false;
  bool readdirplus = true;
  bool writeback_cache = false;   // kernel write-back caching of file data
  uint32_t max_readahead = 0;     // bytes the kernel may read ahead (readahead.h); 0 = its own
  // fsync and fsyncdir write a tree log (Filesystem::Fsync); false: a full
  // commit each, as the kernel's notreelog (and ubtrfs before the log).
  bool tree_log = true;
  // Where errors that point at the image or the library (EIO, EUCLEAN,
  // ENOSPC, EOPNOTSUPP, ...) are reported; ordinary errno answers (ENOENT,
  // EEXIST, ...) are not.
  std::function<void(const std::string&)> log;
};

// Request types, for the per-type counters.
enum class Op : int {
  kInit, kLookup, kForget, kGetattr, kSetattr, kReadlink, kMknod, kMkdir, kUnlink, kRmdir, kSymlink, kRename,
  kLink, kOpen, kRead, kWrite, kFlush, kRelease, kFsync, kOpendir, kReaddir, kReaddirplus, kReleasedir,
  kFsyncdir, kStatfs, kSetxattr, kGetxattr, kListxattr, kRemovexattr, kCreate, kFallocate, kLseek,
  kCopyFileRange, kSyncfs, kCount
};

class Adapter {
 public:
  Adapter(Filesystem& fs, AdapterOptions options);
  Adapter(const Adapter&) = delete;
  Adapter& operator=(const Adapter&) = delete;

  // The operation table; the session's userdata must be this Adapter.
  static const fuse_lowlevel_ops& Ops();
  // The session, for invalidating the kernel's cached attributes.
  void SetSession(fuse_session* se) { session_ = se; }

  // Commits if anything changed since the last commit (the periodic commit).
  Status CommitIfDirty();
  // At unmount: removes files still hidden because they were open.
  Status Shutdown();

  uint64_t Count(Op op) const { return counts_[static_cast<int>(op)].load(std::memory_order_relaxed); }
  // "lookup 12, getattr 40, ..." (non-zero counters only).
  std::string CountsReport() const;

  // Request handlers (public for the operation table).
  void Init(fuse_conn_info* conn);
  void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
  void Forget(fuse_ino_t ino, uint64_t nlookup);
  void GetAttr(fuse_req_t req, fuse_ino_t ino);
  void SetAttr(fuse_req_t req, fuse_ino_t ino, const struct stat* attr, int to_set);
  void ReadLink(fuse_req_t req, fuse_ino_t ino);
  void Mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev);
  void Mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
  void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name);
  void Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name);
  void Symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name);
  void Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
              unsigned flags);
  void Link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname);
  void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off);
  void Write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off);
  void Release(fuse_req_t req, fuse_ino_t ino);
  void Fsync(fuse_req_t req, fuse_ino_t ino, bool datasync);  // ino 0: the whole file system (syncfs)
  void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi, bool plus);
  void ReleaseDir(fuse_req_t req, fuse_file_info* fi);
  void StatFs(fuse_req_t req);
  void SetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags);
  void GetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
  void ListXattr(fuse_req_t req, fuse_ino_t ino, size_t size);
  void RemoveXattr(fuse_req_t req, fuse_ino_t ino, const char* name);
  void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
  void Fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length);
  void Lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence);
  void CopyFileRange(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, fuse_ino_t ino_out, off_t off_out, size_t len,
                     int flags);

  void Count(Op op) { counts_[static_cast<int>(op)].fetch_add(1, std::memory_order_relaxed); }

 private:
  struct DirHandle;
  struct OpenHandles {
    InodeId id;
    uint64_t count = 0;  // file handles
  };

  // Fills buf with entries from offset `off` (h.mu held).
  Status FillDir(fuse_req_t req, fuse_ino_t ino, InodeId id, DirHandle& h, off_t off, bool plus,
                 std::vector<char>& buf, size_t* used);
  // The inode behind a node id; replies ESTALE and returns nullopt if unknown.
  std::optional<InodeId> Resolve(fuse_req_t req, fuse_ino_t node);
  void ReplyStatus(fuse_req_t req, const Status& st);
  // opts_.log, with ENOSPC at most once per kEnospcLogInterval.
  void LogError(int code, const std::string& msg);
  // Replies with the entry of `id` (stat'ed afresh) and counts the lookup;
  // with fi, as the reply to create (and counts the open).
  void ReplyEntry(fuse_req_t req, InodeId id, fuse_file_info* fi = nullptr);
  struct stat ToStat(uint64_t node, const Stat& s);
  // Owner, group and mode of a new inode in `dir` for the caller of req, and
  // the ACLs it inherits from the directory's default ACL.
  struct NewSpec {
    NewInode attrs;
    std::optional<std::string> access_acl, default_acl;
  };
  Result<NewSpec> NewAttrs(fuse_req_t req, InodeId dir, uint32_t mode, bool is_dir, bool acls = true);
  Status ApplyInherited(InodeId id, const NewSpec& spec);
  // setxattr of system.posix_acl_access / _default.
  Status SetAcl(fuse_req_t req, fuse_ino_t ino, InodeId id, std::string_view name, std::string_view value);
  // Whether the caller of req is in group `gid` (or is root).
  bool InGroupOrCapable(fuse_req_t req, uint32_t gid);
  void MarkDirty() { dirty_.store(true, std::memory_order_release); }

  // A file handle of `node` opened (the inode pinned) or released (the
  // last release of an inode with no name left deletes it).
  void Opened(uint64_t node, InodeId id);
  Status Closed(uint64_t node);

  Filesystem& fs_;
  const AdapterOptions opts_;
  fuse_session* session_ = nullptr;
  InodeMap map_;
  uint32_t block_size_;
  std::atomic<bool> dirty_{false};

  std::mutex open_mu_;
  std::unordered_map<uint64_t, OpenHandles> open_;  // node -> its open file handles

  std::array<std::atomic<uint64_t>, static_cast<int>(Op::kCount)> counts_{};

  static constexpr std::chrono::seconds kEnospcLogInterval{10};
  std::mutex log_mu_;
  bool enospc_logged_ = false;
  std::chrono::steady_clock::time_point enospc_last_;
  uint64_t enospc_suppressed_ = 0;

  // Directories seen without a default ACL. A create looks for one in its
  // directory every time (NewAttrs) and most directories have none; that
  // tree search was a tenth of the daemon's CPU on a create storm. Through
  // this mount only SetAcl gives a directory a default ACL, and it takes the
  // directory out and counts the change, so a search that raced with it
  // does not put it back.
  bool KnownWithoutDefaultAcl(InodeId dir, uint64_t* changes);
  void NoteWithoutDefaultAcl(InodeId dir, uint64_t changes_seen);
  void NoteDefaultAclSet(InodeId dir);
  std::mutex acl_mu_;
  std::set<std::pair<uint64_t, uint64_t>> without_default_acl_;
  uint64_t default_acl_sets_ = 0;  // guarded by acl_mu_

  // Directories whose invalid or duplicate entries were already reported:
  // a damaged directory is warned about once, not at every listing.
  void WarnSkipped(InodeId dir, const std::vector<SkippedEntry>& skipped);
  std::mutex warned_mu_;
  std::set<std::pair<uint64_t, uint64_t>> warned_dirs_;
};

}  // namespace ubtrfs::fuse

#endif  // UBTRFS_FUSE_ADAPTER_H_
