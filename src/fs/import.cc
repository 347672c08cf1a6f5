#include "fs/import.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "format/checksum.h"
#include "fs/compress_ahead.h"
#include "fs/fs_impl.h"
#include "fs/source_open.h"
#include "io/block_device.h"
#include "mem/huge_pages.h"
#include "txn/clock.h"
#include "txn/transaction.h"

namespace ubtrfs::fs {
namespace {

static_assert(kImportNodatasum == format::kInodeNodatasum && kImportNodatacow == format::kInodeNodatacow);

Status Errno(const std::string& what, const std::string& path) {
  const int e = errno;
  return Status::Error(e, path + ": " + what + ": " + std::strerror(e));
}

Time ToTime(const timespec& ts) { return Time{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)}; }

// `ts`, or `max` when later (ImportOptions::max_time).
timespec Clamp(const timespec& ts, const std::optional<Time>& max) {
  if (!max || ts.tv_sec < max->sec || (ts.tv_sec == max->sec && static_cast<uint32_t>(ts.tv_nsec) <= max->nsec)) {
    return ts;
  }
  timespec out{};
  out.tv_sec = static_cast<time_t>(max->sec);
  out.tv_nsec = static_cast<long>(max->nsec);
  return out;
}

// listxattrat(2) (Linux 6.13+; the number is the same on every architecture
// that uses the common syscall table): lists xattrs relative to a directory
// descriptor, sparing the walk of the whole path. llistxattr where missing.
#if defined(__x86_64__) || defined(__aarch64__) || defined(__riscv)
constexpr long kSysListxattrat = 465;
#else
constexpr long kSysListxattrat = -1;
#endif
std::atomic<bool> have_listxattrat{kSysListxattrat > 0};

ssize_t ListXattrsAt(int dfd, const char* name, const std::string& path) {
  if (dfd >= 0 && have_listxattrat.load(std::memory_order_relaxed)) {
    const long r = ::syscall(kSysListxattrat, dfd, name, AT_SYMLINK_NOFOLLOW, nullptr, size_t{0});
    if (r >= 0 || errno != ENOSYS) return r;
    have_listxattrat = false;
  }
  return ::llistxattr(path.c_str(), nullptr, 0);
}

// Xattrs of host `path` as (name, value) pairs, in listing order; with a
// directory descriptor and the name in it, the common case of no xattrs
// costs one short lookup.
Result<std::vector<std::pair<std::string, std::string>>> HostXattrs(const std::string& path, int dfd = -1,
                                                                    const char* name_in_dir = nullptr) {
  std::vector<std::pair<std::string, std::string>> out;
  ssize_t len = ListXattrsAt(dfd, name_in_dir, path);
  if (len < 0) {
    if (errno == ENOTSUP) return out;
    return Errno("listxattr", path);
  }
  if (len == 0) return out;
  std::string names(static_cast<size_t>(len), '\0');
  len = ::llistxattr(path.c_str(), names.data(), names.size());
  if (len < 0) return Errno("listxattr", path);
  names.resize(static_cast<size_t>(len));
  for (size_t pos = 0; pos < names.size();) {
    const std::string name = names.c_str() + pos;
    pos += name.size() + 1;
    if (name.empty()) continue;
    ssize_t vlen = ::lgetxattr(path.c_str(), name.c_str(), nullptr, 0);
    if (vlen < 0) return Errno("getxattr " + name, path);
    std::string value(static_cast<size_t>(vlen), '\0');
    vlen = ::lgetxattr(path.c_str(), name.c_str(), value.data(), value.size());
    if (vlen < 0) return Errno("getxattr " + name, path);
    value.resize(static_cast<size_t>(vlen));
    out.emplace_back(name, std::move(value));
  }
  return out;
}

// File data is read and written 256 KiB at a time: at 1 MiB the zeroed
// buffer was a quarter of an image build's heap, and 256 KiB is as fast.
constexpr size_t kPlainReadSize = size_t{256} << 10;

// The item-by-item importer: every inode through the public write API.
// Used for `cp` and for whatever the bulk importer leaves to it (file data).
class Importer {
 public:
  Importer(Filesystem& fs, const ImportOptions& options, ImportStats* stats)
      : fs_(fs), options_(options), stats_(stats ? stats : &own_stats_) {}

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
    const int dfd = OpenSource(AT_FDCWD, src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR* d = dfd < 0 ? nullptr : ::fdopendir(dfd);
    if (!d) {
      const Status st = Errno("opendir", src);
      if (dfd >= 0) ::close(dfd);
      return st;
    }
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
    c.uid = options_.owner ? options_.owner->first : st.st_uid;
    c.gid = options_.owner ? options_.owner->second : st.st_gid;
    c.atime = ToTime(Clamp(st.st_atim, options_.max_time));
    c.mtime = ToTime(Clamp(st.st_mtim, options_.max_time));
    c.ctime = ToTime(Clamp(st.st_ctim, options_.max_time));
    return fs_.SetAttr(id, c);
  }

  Status CopyData(const std::string& src, InodeId id, const struct stat& st) {
    // Not before the first file that needs it.
    if (buf_.empty()) buf_.resize(read_size_);
    int fd = OpenSource(AT_FDCWD, src.c_str(), O_RDONLY | O_CLOEXEC);
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
      Result<size_t> w = Status::Ok();
      if (options_.reflink) {
        io::CloneCounts& cc = io::GlobalCloneCounts();
        const uint64_t cloned = cc.cloned, copied = cc.copied;
        txn::ScopedCloneSource from_host({fd, off, buf_.data(), static_cast<size_t>(n)});
        w = fs_.Write(id, off, std::span(buf_.data(), static_cast<size_t>(n)));
        stats_->reflinked_bytes += cc.cloned - cloned;
        stats_->kernel_copied_bytes += cc.copied - copied;
      } else {
        w = fs_.Write(id, off, std::span(buf_.data(), static_cast<size_t>(n)));
      }
      if (!w.ok()) {
        result = w.status();
        break;
      }
      off += static_cast<uint64_t>(n);
      result = Wrote(static_cast<uint64_t>(n));
      if (!result.ok()) break;
    }
    ::close(fd);
    UB_RETURN_IF_ERROR(result);
    return EndData(id, off, st);
  }

  // A compressing bulk import reads as CompressAhead does (see kChunk).
  void ReadInChunksOf(size_t bytes) { read_size_ = bytes; }

  // CopyData of a file that `ahead` read and compressed (its k-th).
  Status CopyAhead(fsimpl::FilesystemImpl& impl, CompressAhead& ahead, size_t k, InodeId id, const struct stat& st) {
    uint64_t off = 0;
    for (;;) {
      UB_ASSIGN_OR_RETURN(std::optional<CompressAhead::Chunk> chunk, ahead.Next(k));
      if (!chunk) break;
      UB_RETURN_IF_ERROR(impl.WritePrecompressed(id, chunk->off, chunk->data(), chunk->pre).status());
      off = chunk->off + chunk->len;
      ahead.Recycle(std::move(chunk->bytes));
      UB_RETURN_IF_ERROR(Wrote(chunk->len));
    }
    return EndData(id, off, st);
  }

 private:
  NewInode Attrs(const struct stat& st) {
    NewInode a;
    a.mode = st.st_mode & 07777;
    a.uid = options_.owner ? options_.owner->first : st.st_uid;
    a.gid = options_.owner ? options_.owner->second : st.st_gid;
    a.atime = ToTime(Clamp(st.st_atim, options_.max_time));
    a.mtime = ToTime(Clamp(st.st_mtim, options_.max_time));
    a.ctime = ToTime(Clamp(st.st_ctim, options_.max_time));
    return a;
  }

  // Returns whether there were any.
  Result<bool> CopyXattrs(const std::string& src, InodeId id) {
    UB_ASSIGN_OR_RETURN(auto xattrs, HostXattrs(src));
    for (const auto& [name, value] : xattrs) {
      UB_RETURN_IF_ERROR(fs_.SetXattr(id, name, value, 0).WithContext("xattr " + name));
      ++stats_->xattrs;
    }
    return !xattrs.empty();
  }

  // After n more bytes of a file's data: the totals, progress now and
  // then, and a commit every options_.commit_every_bytes.
  Status Wrote(uint64_t n) {
    stats_->bytes += n;
    if (options_.progress && stats_->bytes - progress_bytes_ >= (16u << 20)) {
      progress_bytes_ = stats_->bytes;
      options_.progress(*stats_);
    }
    since_commit_ += n;
    if (since_commit_ < options_.commit_every_bytes) return Status::Ok();
    since_commit_ = 0;
    return fs_.Commit();
  }

  // The data read ended at `off`: a hole up to the size is the size's.
  Status EndData(InodeId id, uint64_t off, const struct stat& st) {
    if (off < static_cast<uint64_t>(st.st_size) || st.st_size == 0) {
      AttrChange c;
      c.size = static_cast<uint64_t>(st.st_size);  // a trailing hole
      UB_RETURN_IF_ERROR(fs_.SetAttr(id, c));
    }
    return Status::Ok();
  }

  Filesystem& fs_;
  ImportOptions options_;
  ImportStats own_stats_;
  ImportStats* stats_;
  size_t read_size_ = kPlainReadSize;
  std::vector<uint8_t> buf_;
  std::map<std::pair<dev_t, ino_t>, InodeId> links_;
  uint64_t since_commit_ = 0;
  uint64_t progress_tick_ = 0;
  uint64_t progress_bytes_ = 0;  // stats_->bytes at the last progress call from the data path
};

// ---- Bulk import ---------------------------------------------------------------------------------
//
// For a new image: the whole host tree is scanned first (directory-relative
// fstatat/readlinkat, small files read whole), then every item of the new
// inodes is built in key order and appended to the fs tree a leaf at a time
// (one search per leaf instead of several per inode). Inode numbers follow
// the scan: a directory's children get consecutive numbers when it is
// listed. Data too large to be inline goes in afterwards through the
// ordinary write path.

using format::Key;

constexpr uint32_t kNone = UINT32_MAX;
// As the write path: files up to this size (and below a sector) are inline.
constexpr uint64_t kMaxInline = 2048;

struct HostNode {
  std::string name;
  uint32_t parent = kNone;  // kNone: the destination directory
  uint32_t mode = 0, uid = 0, gid = 0;
  uint32_t index = 0;       // position among the parent's entries
  uint32_t link_of = kNone;  // a further hard link to this node
  uint32_t extra = kNone;    // into Extras: xattrs, inline data, children
  uint8_t iflags = 0;        // NODATACOW / NODATASUM (--inode-flags, inherited)
  uint64_t rdev = 0, size = 0;
  timespec atime{}, mtime{}, ctime{};
  uint64_t ino = 0;
};

struct Extra {
  std::vector<std::pair<std::string, std::string>> xattrs;
  std::string inline_data;         // inline file content (compressed: inline_compression) or symlink target
  uint8_t inline_compression = 0;
  bool nocompress = false;         // data did not compress: the inode gets NOCOMPRESS
  std::vector<uint32_t> children;  // directories: entries in name order
  std::vector<uint32_t> links;     // further hard links (nodes with link_of)
  bool deferred_data = false;      // data through the write path later
};

void PutDirItem(std::vector<uint8_t>& b, const Key& location, uint64_t transid, uint8_t type, std::string_view name,
                std::string_view data) {
  const size_t at = b.size();
  b.resize(at + sizeof(format::DirItem) + name.size() + data.size());
  auto* di = reinterpret_cast<format::DirItem*>(b.data() + at);
  location.To(&di->location);
  di->transid = transid;
  di->data_len = static_cast<uint16_t>(data.size());
  di->name_len = static_cast<uint16_t>(name.size());
  di->type = type;
  std::memcpy(b.data() + at + sizeof(format::DirItem), name.data(), name.size());
  if (!data.empty()) std::memcpy(b.data() + at + sizeof(format::DirItem) + name.size(), data.data(), data.size());
}

uint64_t ExtrefHash(uint64_t parent, std::string_view name) {
  return format::Crc32c(static_cast<uint32_t>(parent),
                        std::span(reinterpret_cast<const uint8_t*>(name.data()), name.size()));
}

void SetTs(format::Timespec& out, const timespec& ts) {
  out.sec = static_cast<uint64_t>(ts.tv_sec);
  out.nsec = static_cast<uint32_t>(ts.tv_nsec);
}

class BulkImporter {
 public:
  BulkImporter(fsimpl::FilesystemImpl& fs, const ImportOptions& options, ImportStats* stats)
      : fs_(fs), options_(options), stats_(stats) {}

  // False (nothing done) when `dest` is not empty: the caller imports item by item.
  Result<bool> Run(const std::string& src, InodeId dest) {
    dest_ = dest;
    auto t = fs_.BulkBegin(dest);
    if (!t.ok() && t.status().code() == ENOTEMPTY) return false;
    UB_ASSIGN_OR_RETURN(t_, std::move(t));
    // The directory's property is not looked up: a new image has none.
    if (auto it = options_.inode_flags.find(""); it != options_.inode_flags.end() && it->second) {
      UB_RETURN_IF_ERROR(fs_.AddInodeFlags(dest, ToInodeFlags(it->second, S_IFDIR)));
      t_.inode_flags |= ToInodeFlags(it->second, S_IFDIR);
    }
    skip_.insert(options_.skip.begin(), options_.skip.end());
    zc_ = ChooseCompression(fs_.compression(), t_.inode_flags, 0);
    next_ino_ = t_.first_ino;
    {
      int fd = OpenSource(AT_FDCWD, src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) return Errno("open", src);
      UB_RETURN_IF_ERROR(ScanDir(fd, src, kNone, "", static_cast<uint8_t>(t_.inode_flags & kDataFlags)));
    }
    if (nodes_.size() > UINT32_MAX - 1) return Status::Error(EOVERFLOW, src + ": too many entries");
    UB_RETURN_IF_ERROR(Emit());
    UB_RETURN_IF_ERROR(fs_.BulkEnd(dest, t_, next_ino_ - t_.first_ino, top_.size(), top_size_));
    // File data too large to be inline, through the write path; with
    // compression, read and compressed ahead of the writes on all cores.
    Importer data(fs_, options_, stats_);
    if (zc_.on()) data.ReadInChunksOf(CompressAhead::kChunk);
    std::vector<uint32_t> deferred;
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
      const HostNode& n = nodes_[i];
      if (n.extra != kNone && extras_[n.extra].deferred_data) deferred.push_back(i);
    }
    auto gets_ahead = [&](uint32_t i) { return zc_.on() && !options_.reflink && nodes_[i].iflags == 0; };
    std::optional<CompressAhead> ahead;
    if (std::any_of(deferred.begin(), deferred.end(), gets_ahead)) {
      std::vector<CompressAhead::File> files;
      for (uint32_t i : deferred) {
        if (gets_ahead(i)) files.push_back(CompressAhead::File{PathOf(src, i), nodes_[i].size});
      }
      ahead.emplace(zc_, t_.sectorsize, std::move(files));
      if (!ahead->started()) ahead.reset();
    }
    size_t ahead_k = 0;
    for (uint32_t i : deferred) {
      const HostNode& n = nodes_[i];
      const std::string path = PathOf(src, i);
      struct stat st {};
      st.st_mode = n.mode;
      st.st_uid = n.uid;
      st.st_gid = n.gid;
      st.st_size = static_cast<off_t>(n.size);
      st.st_atim = n.atime;
      st.st_mtim = n.mtime;
      st.st_ctim = n.ctime;
      const InodeId id{dest_.root, n.ino};
      if (ahead && gets_ahead(i)) {
        UB_RETURN_IF_ERROR(data.CopyAhead(fs_, *ahead, ahead_k++, id, st).WithContext(path));
      } else {
        UB_RETURN_IF_ERROR(data.CopyData(path, id, st).WithContext(path));
      }
      UB_RETURN_IF_ERROR(data.SetAttrs(id, st).WithContext(path));
    }
    return true;
  }

 private:
  std::string PathOf(const std::string& src, uint32_t i) const {
    std::vector<uint32_t> chain;
    for (uint32_t c = i; c != kNone; c = nodes_[c].parent) chain.push_back(c);
    std::string p = src;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) p += "/" + nodes_[*it].name;
    return p;
  }

  Extra& ExtraOf(uint32_t i) {
    if (nodes_[i].extra == kNone) {
      nodes_[i].extra = static_cast<uint32_t>(extras_.size());
      extras_.emplace_back();
    }
    return extras_[nodes_[i].extra];
  }

  // --inode-flags bits (kImport*) as the inode flags of an inode of type `mode`.
  static uint64_t ToInodeFlags(uint32_t bits, uint32_t mode) {
    uint64_t f = 0;
    if (bits & kImportNodatacow) f |= format::kInodeNodatacow | (S_ISREG(mode) ? format::kInodeNodatasum : 0);
    if (bits & kImportNodatasum) f |= format::kInodeNodatasum;
    return f;
  }
  static constexpr uint64_t kDataFlags = format::kInodeNodatacow | format::kInodeNodatasum;

  // Lists directory `dfd` (host path `path`, `rel` below the source, node
  // `self`, whose NODATACOW/NODATASUM flags are `dir_flags`), adds a node
  // for every entry, then descends into the subdirectories. Takes `dfd`.
  Status ScanDir(int dfd, const std::string& path, uint32_t self, const std::string& rel, uint8_t dir_flags) {
    DIR* d = ::fdopendir(dfd);
    if (!d) {
      const Status st = Errno("opendir", path);
      ::close(dfd);
      return st;
    }
    std::vector<std::string> names;
    errno = 0;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
      names.emplace_back(e->d_name);
    }
    if (errno != 0) {
      const Status st = Errno("readdir", path);
      ::closedir(d);
      return st;
    }
    std::sort(names.begin(), names.end());  // a reproducible image for a given tree
    // Entries left out (--subvol directories) and the flags each entry
    // starts with: its directory's and its own --inode-flags.
    std::vector<uint8_t> pre(names.size(), dir_flags);
    if (!skip_.empty() || !options_.inode_flags.empty()) {
      size_t kept = 0;
      for (size_t k = 0; k < names.size(); ++k) {
        const std::string child = rel.empty() ? names[k] : rel + "/" + names[k];
        if (skip_.count(child)) continue;
        uint8_t f = dir_flags;
        if (auto it = options_.inode_flags.find(child); it != options_.inode_flags.end()) {
          f |= static_cast<uint8_t>(it->second & (kImportNodatacow | kImportNodatasum));
        }
        pre[kept] = f;
        if (kept != k) names[kept] = std::move(names[k]);
        ++kept;
      }
      names.resize(kept);
      pre.resize(kept);
    }
    std::vector<uint32_t> children;
    children.reserve(names.size());
    std::vector<uint32_t> subdirs;
    // The host calls (stat, xattrs, small reads) for a large directory run
    // on two threads; the nodes are then added in name order.
    Probes probes(names.size());
    {
      // Work in slices taken in turn, so that a thread the scheduler holds
      // back does not hold up the other.
      constexpr size_t kParallelFrom = 512, kSlice = 256;
      std::atomic<size_t> next{0};
      auto work = [&] {
        for (;;) {
          const size_t from = next.fetch_add(kSlice);
          if (from >= names.size()) return;
          ProbeRange(::dirfd(d), path, names, pre, from, std::min(names.size(), from + kSlice), &probes);
        }
      };
      std::thread helper;
      if (names.size() >= kParallelFrom) {
        try {
          helper = std::thread(work);
        } catch (const std::system_error&) {
          // no thread to be had (the process limit): this one probes all
        }
      }
      work();
      if (helper.joinable()) helper.join();
    }
    Status result;
    for (size_t k = 0; k < names.size() && result.ok(); ++k) {
      auto r = AddEntry(::dirfd(d), path, names[k], self, static_cast<uint32_t>(k), pre[k], probes[k]);
      if (!r.ok()) {
        result = r.status();
        break;
      }
      children.push_back(*r);
      if (S_ISDIR(nodes_[*r].mode) && nodes_[*r].link_of == kNone) subdirs.push_back(*r);
    }
    if (!result.ok()) {
      ::closedir(d);
      return result;
    }
    if (self == kNone) {
      top_ = std::move(children);
    } else {
      ExtraOf(self).children = std::move(children);
    }
    // One directory descriptor open at a time: the subdirectories are opened
    // by path once this one is closed.
    ::closedir(d);
    for (uint32_t c : subdirs) {
      const std::string sub = path + "/" + nodes_[c].name;
      int fd = OpenSource(AT_FDCWD, sub.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) return Errno("open", sub);
      UB_RETURN_IF_ERROR(ScanDir(fd, sub, c, rel.empty() ? nodes_[c].name : rel + "/" + nodes_[c].name,
                                 static_cast<uint8_t>(nodes_[c].iflags & kDataFlags)));
    }
    return Status::Ok();
  }

  // What the host says about one directory entry: gathered for many entries
  // at once, on two threads for a large directory.
  struct Probe {
    struct stat st {};
    std::string data;  // inline file content (compressed: compression) or symlink target
    uint8_t compression = 0;
    bool nocompress = false;
    std::vector<std::pair<std::string, std::string>> xattrs;
    bool deferred_data = false;
    Status status;
  };

  // With `all` false, a file with more than one link gets only its stat (a
  // further link to a file seen before needs nothing else).
  // `pre`: the entry's --inode-flags bits (no compression with either).
  void ProbeEntry(int dfd, const std::string& path, const std::string& name, uint8_t pre, Probe* p,
                  bool all = false) const {
    if (::fstatat(dfd, name.c_str(), &p->st, AT_SYMLINK_NOFOLLOW) != 0) {
      p->status = Errno("lstat", path);
      return;
    }
    const struct stat& st = p->st;
    if (!all && !S_ISDIR(st.st_mode) && st.st_nlink > 1) return;
    if (S_ISREG(st.st_mode)) {
      const WriteCompression& zc = pre ? no_zc_ : zc_;
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      // With compression a file of up to a sector may still go inline.
      const uint64_t inline_max = zc.on() ? t_.sectorsize : std::min<uint64_t>(kMaxInline, t_.sectorsize - 1);
      if (size > 0 && size <= inline_max) {
        p->data.assign(size, '\0');
        int fd = OpenSource(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
          p->status = Errno("open", path);
          return;
        }
        ssize_t got = ::pread(fd, p->data.data(), p->data.size(), 0);
        const int e = errno;
        ::close(fd);
        errno = e;
        if (got < 0) {
          p->status = Errno("read", path);
          return;
        }
        if (static_cast<size_t>(got) != p->data.size()) {
          p->data.clear();
          p->deferred_data = true;  // changed under us: the write path copies what is there
        } else if (zc.on()) {
          // Here, on the probing threads, as the write path would decide.
          bool failed = false;
          auto z = CompressInline(zc, std::span(reinterpret_cast<const uint8_t*>(p->data.data()), p->data.size()),
                                  t_.sectorsize, kMaxInline, &failed);
          p->nocompress = failed && !zc.force;
          if (z) {
            p->data.assign(z->begin(), z->end());
            p->compression = zc.type;
          } else if (size > kMaxInline || size >= t_.sectorsize) {
            p->data.clear();
            p->deferred_data = true;  // a plain regular extent, through the write path
          }
        }
      } else if (size > 0) {
        p->deferred_data = true;
      }
    } else if (S_ISLNK(st.st_mode)) {
      p->data.assign(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t got = ::readlinkat(dfd, name.c_str(), p->data.data(), p->data.size());
      if (got < 0) {
        p->status = Errno("readlink", path);
        return;
      }
      p->data.resize(static_cast<size_t>(got));
    }
    auto x = HostXattrs(path, dfd, name.c_str());
    if (!x.ok()) {
      p->status = x.status();
      return;
    }
    p->xattrs = std::move(*x);
  }

  // Probes entries [from, to) of a directory.
  using Probes = std::vector<Probe, mem::HugePageAllocator<Probe>>;
  void ProbeRange(int dfd, const std::string& dir_path, const std::vector<std::string>& names,
                  const std::vector<uint8_t>& pre, size_t from, size_t to, Probes* probes) const {
    for (size_t k = from; k < to; ++k) ProbeEntry(dfd, dir_path + "/" + names[k], names[k], pre[k], &(*probes)[k]);
  }

  // Adds the node of one probed entry.
  Result<uint32_t> AddEntry(int dfd, const std::string& dir_path, const std::string& name, uint32_t parent,
                            uint32_t index, uint8_t pre, Probe& p) {
    const std::string path = dir_path + "/" + name;
    if (name.size() > 255) return Status::Error(ENAMETOOLONG, path + ": name longer than 255 bytes");
    UB_RETURN_IF_ERROR(p.status);
    const struct stat& st = p.st;
    if (options_.progress && (++progress_tick_ % 4096 == 0)) options_.progress(*stats_);
    const uint32_t id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
    HostNode& n = nodes_.back();
    n.name = name;
    n.parent = parent;
    n.index = index;
    if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
      auto [it, fresh] = links_.try_emplace({st.st_dev, st.st_ino}, id);
      if (!fresh) {
        n.link_of = it->second;
        n.mode = nodes_[it->second].mode;
        ExtraOf(it->second).links.push_back(id);
        ++stats_->hardlinks;
        return id;
      }
      ProbeEntry(dfd, path, name, pre, &p, /*all=*/true);  // the first link: the rest of what it needs
      UB_RETURN_IF_ERROR(p.status);
    }
    n.mode = st.st_mode & (S_IFMT | 07777);
    n.uid = options_.owner ? options_.owner->first : st.st_uid;
    n.gid = options_.owner ? options_.owner->second : st.st_gid;
    n.size = static_cast<uint64_t>(st.st_size);
    n.atime = Clamp(st.st_atim, options_.max_time);
    n.mtime = Clamp(st.st_mtim, options_.max_time);
    n.ctime = Clamp(st.st_ctim, options_.max_time);
    n.ino = next_ino_++;
    n.iflags = static_cast<uint8_t>(ToInodeFlags(pre, st.st_mode));
    if (S_ISDIR(st.st_mode)) {
      n.size = 0;
      ++stats_->dirs;
    } else if (S_ISREG(st.st_mode)) {
      ++stats_->files;
      if (p.deferred_data) {
        ExtraOf(id).deferred_data = true;
      } else if (!p.data.empty()) {
        stats_->bytes += n.size;
        ExtraOf(id).inline_data = std::move(p.data);
        ExtraOf(id).inline_compression = p.compression;
        if (p.compression) fs_.NoteCompressed(p.compression);
      }
      if (p.nocompress) ExtraOf(id).nocompress = true;
    } else if (S_ISLNK(st.st_mode)) {
      ++stats_->symlinks;
      if (p.data.empty()) return Status::Error(ENOENT, path + ": empty symlink target");
      if (p.data.size() >= 4096 || p.data.size() > t_.max_item - format::kFileExtentInlineDataStart) {
        return Status::Error(ENAMETOOLONG, path + ": symlink target of " + std::to_string(p.data.size()) + " bytes");
      }
      n.mode = S_IFLNK | 0777;
      n.size = p.data.size();
      ExtraOf(id).inline_data = std::move(p.data);
    } else {
      ++stats_->specials;
      n.rdev = st.st_rdev;
    }
    if (!p.xattrs.empty()) {
      stats_->xattrs += p.xattrs.size();
      ExtraOf(id).xattrs = std::move(p.xattrs);
    }
    return id;
  }

  // ---- Items ----

  Status Add(const Key& key, std::vector<uint8_t> data) {
    if (data.size() > t_.max_item) {
      return Status::Error(E2BIG, "item " + format::KeyToString(key) + " of " + std::to_string(data.size()) +
                                      " bytes does not fit in a leaf");
    }
    const uint32_t need = static_cast<uint32_t>(data.size() + sizeof(format::Item));
    if (batch_bytes_ + need > t_.leaf_space) UB_RETURN_IF_ERROR(FlushBatch());
    keys_.push_back(key);
    data_.push_back(std::move(data));
    batch_bytes_ += need;
    return Status::Ok();
  }

  Status FlushBatch() {
    if (keys_.empty()) return Status::Ok();
    UB_RETURN_IF_ERROR(fs_.BulkInsert(dest_, keys_, data_));
    keys_.clear();
    data_.clear();
    batch_bytes_ = 0;
    return Status::Ok();
  }

  uint64_t InoOf(uint32_t i) const {
    const HostNode& n = nodes_[i];
    return n.link_of == kNone ? n.ino : nodes_[n.link_of].ino;
  }
  uint64_t ParentIno(uint32_t i) const { return nodes_[i].parent == kNone ? dest_.ino : nodes_[nodes_[i].parent].ino; }
  uint64_t IndexOf(uint32_t i) const {
    return (nodes_[i].parent == kNone ? t_.first_index : 2) + nodes_[i].index;
  }

  // DIR_ITEM (by name hash, colliding names sharing an item) and DIR_INDEX
  // items of one directory.
  Status EmitEntries(uint64_t dir_ino, const std::vector<uint32_t>& children) {
    std::vector<std::pair<uint64_t, uint32_t>> by_hash;
    by_hash.reserve(children.size());
    for (uint32_t c : children) by_hash.emplace_back(format::NameHash(nodes_[c].name), c);
    std::sort(by_hash.begin(), by_hash.end());
    for (size_t k = 0; k < by_hash.size();) {
      std::vector<uint8_t> item;
      const uint64_t h = by_hash[k].first;
      for (; k < by_hash.size() && by_hash[k].first == h; ++k) {
        const uint32_t c = by_hash[k].second;
        PutDirItem(item, Key{InoOf(c), format::kInodeItemKey, 0}, t_.transid, format::FileTypeOfMode(nodes_[c].mode),
                   nodes_[c].name, {});
      }
      UB_RETURN_IF_ERROR(Add(Key{dir_ino, format::kDirItemKey, h}, std::move(item)));
    }
    for (uint32_t c : children) {
      std::vector<uint8_t> item;
      PutDirItem(item, Key{InoOf(c), format::kInodeItemKey, 0}, t_.transid, format::FileTypeOfMode(nodes_[c].mode),
                 nodes_[c].name, {});
      UB_RETURN_IF_ERROR(Add(Key{dir_ino, format::kDirIndexKey, IndexOf(c)}, std::move(item)));
    }
    return Status::Ok();
  }

  Status EmitInode(uint32_t i) {
    const HostNode& n = nodes_[i];
    Extra* x = n.extra == kNone ? nullptr : &extras_[n.extra];
    // INODE_ITEM.
    format::InodeItem ii{};
    ii.generation = t_.transid;
    ii.transid = t_.transid;
    ii.nlink = static_cast<uint32_t>(1 + (x ? x->links.size() : 0));
    ii.uid = n.uid;
    ii.gid = n.gid;
    ii.mode = n.mode;
    if (S_ISCHR(n.mode) || S_ISBLK(n.mode)) {
      const dev_t rdev = static_cast<dev_t>(n.rdev);
      ii.rdev = (uint64_t{major(rdev)} << 20) | minor(rdev);
    }
    ii.flags = (t_.inode_flags & ~kDataFlags) | n.iflags | (x && x->nocompress ? format::kInodeNocompress : 0);
    SetTs(ii.atime, n.atime);
    SetTs(ii.mtime, n.mtime);
    SetTs(ii.ctime, n.ctime);
    SetTs(ii.otime, now_);
    uint64_t dir_size = 0;
    if (S_ISDIR(n.mode) && x) {
      for (uint32_t c : x->children) dir_size += 2 * nodes_[c].name.size();
    }
    const bool has_inline = x && !x->inline_data.empty();
    if (S_ISDIR(n.mode)) {
      ii.size = dir_size;
    } else if (has_inline || !(x && x->deferred_data)) {
      ii.size = n.size;
      ii.nbytes = has_inline ? n.size : 0;
    }  // deferred data: size 0 until the write path adds the data
    const auto* ib = reinterpret_cast<const uint8_t*>(&ii);
    UB_RETURN_IF_ERROR(Add(Key{n.ino, format::kInodeItemKey, 0}, std::vector<uint8_t>(ib, ib + sizeof ii)));

    // INODE_REF per parent (names in link order); an INODE_EXTREF for what
    // does not fit, as the write path does.
    std::vector<uint32_t> names{i};
    if (x) names.insert(names.end(), x->links.begin(), x->links.end());
    std::map<uint64_t, std::vector<uint8_t>> refs;
    std::map<uint64_t, std::vector<uint8_t>> extrefs;
    for (uint32_t l : names) {
      const HostNode& ln = nodes_[l];
      const uint64_t parent = ParentIno(l);
      std::vector<uint8_t>& r = refs[parent];
      if (r.size() + sizeof(format::InodeRef) + ln.name.size() <= t_.max_item) {
        const size_t at = r.size();
        r.resize(at + sizeof(format::InodeRef) + ln.name.size());
        auto* ir = reinterpret_cast<format::InodeRef*>(r.data() + at);
        ir->index = IndexOf(l);
        ir->name_len = static_cast<uint16_t>(ln.name.size());
        std::memcpy(r.data() + at + sizeof(format::InodeRef), ln.name.data(), ln.name.size());
      } else {
        std::vector<uint8_t>& e = extrefs[ExtrefHash(parent, ln.name)];
        const size_t at = e.size();
        e.resize(at + sizeof(format::InodeExtref) + ln.name.size());
        auto* er = reinterpret_cast<format::InodeExtref*>(e.data() + at);
        er->parent_objectid = parent;
        er->index = IndexOf(l);
        er->name_len = static_cast<uint16_t>(ln.name.size());
        std::memcpy(e.data() + at + sizeof(format::InodeExtref), ln.name.data(), ln.name.size());
        if (e.size() > t_.max_item) return Status::Error(EMLINK, "too many hard links to " + ln.name);
      }
    }
    for (auto& [parent, r] : refs) UB_RETURN_IF_ERROR(Add(Key{n.ino, format::kInodeRefKey, parent}, std::move(r)));
    for (auto& [h, e] : extrefs) UB_RETURN_IF_ERROR(Add(Key{n.ino, format::kInodeExtrefKey, h}, std::move(e)));

    // XATTR_ITEMs, colliding names sharing an item.
    if (x && !x->xattrs.empty()) {
      std::map<uint64_t, std::vector<uint8_t>> items;
      for (const auto& [name, value] : x->xattrs) {
        if (name.size() > 255) return Status::Error(ERANGE, "xattr name " + name + " is too long");
        PutDirItem(items[format::NameHash(name)], Key{}, t_.transid, format::kFtXattr, name, value);
      }
      for (auto& [h, item] : items) {
        if (item.size() > t_.max_item) {
          return Status::Error(E2BIG, nodes_[i].name + ": xattrs of " + std::to_string(item.size()) +
                                          " bytes do not fit in one item");
        }
        UB_RETURN_IF_ERROR(Add(Key{n.ino, format::kXattrItemKey, h}, std::move(item)));
      }
    }
    if (S_ISDIR(n.mode) && x) UB_RETURN_IF_ERROR(EmitEntries(n.ino, x->children));
    if (has_inline) {
      std::vector<uint8_t> item(format::kFileExtentInlineDataStart + x->inline_data.size());
      auto* fe = reinterpret_cast<format::FileExtentItem*>(item.data());
      fe->generation = t_.transid;
      fe->ram_bytes = x->inline_compression ? n.size : x->inline_data.size();
      fe->compression = x->inline_compression;
      fe->type = format::kFileExtentInline;
      std::memcpy(item.data() + format::kFileExtentInlineDataStart, x->inline_data.data(), x->inline_data.size());
      UB_RETURN_IF_ERROR(Add(Key{n.ino, format::kExtentDataKey, 0}, std::move(item)));
      x->inline_data.clear();
      x->inline_data.shrink_to_fit();
    }
    return Status::Ok();
  }

  Status Emit() {
    now_ = txn::WallClock();
    for (uint32_t c : top_) top_size_ += 2 * nodes_[c].name.size();
    UB_RETURN_IF_ERROR(EmitEntries(dest_.ino, top_));
    // Node order is inode number order.
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].link_of != kNone) continue;
      UB_RETURN_IF_ERROR(EmitInode(i).WithContext("importing " + nodes_[i].name));
    }
    return FlushBatch();
  }

  fsimpl::FilesystemImpl& fs_;
  ImportOptions options_;
  ImportStats* stats_;
  InodeId dest_;
  fsimpl::FilesystemImpl::BulkTarget t_;
  WriteCompression zc_;  // for the new files (inline data here, the rest in the write path)
  WriteCompression no_zc_;  // for files with NODATACOW / NODATASUM
  std::set<std::string> skip_;
  std::vector<HostNode, mem::HugePageAllocator<HostNode>> nodes_;
  std::vector<Extra> extras_;
  std::vector<uint32_t> top_;  // entries of the destination directory
  uint64_t top_size_ = 0;
  std::map<std::pair<dev_t, ino_t>, uint32_t> links_;
  uint64_t next_ino_ = 0;
  uint64_t progress_tick_ = 0;
  timespec now_{};
  std::vector<Key> keys_;
  std::vector<std::vector<uint8_t>> data_;
  uint32_t batch_bytes_ = 0;
};

}  // namespace
}  // namespace ubtrfs::fs

namespace ubtrfs {
using fs::Importer;
using fs::BulkImporter;
using fs::Errno;

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
  ImportStats own;
  if (!stats) stats = &own;
  Importer imp(fs, options, stats);
  auto* impl = dynamic_cast<fsimpl::FilesystemImpl*>(&fs);
  const bool needs_bulk = !options.skip.empty() || !options.inode_flags.empty();
  const Status no_bulk = Status::Error(
      EINVAL, "skipped entries and inode flags need a bulk import into an empty directory");
  if (options.bulk && impl) {
    BulkImporter bulk(*impl, options, stats);
    UB_ASSIGN_OR_RETURN(bool done, bulk.Run(src, dest_dir));
    if (!done && needs_bulk) return no_bulk;
    if (!done) UB_RETURN_IF_ERROR(imp.CopyEntries(src, dest_dir));
  } else if (needs_bulk) {
    return no_bulk;
  } else {
    UB_RETURN_IF_ERROR(imp.CopyEntries(src, dest_dir));
  }
  return imp.Finish(src, dest_dir, st);
}

}  // namespace ubtrfs

// ---- The library side of the bulk import ---------------------------------------------------------

namespace ubtrfs::fsimpl {

Result<FilesystemImpl::BulkTarget> FilesystemImpl::BulkBegin(InodeId dir) {
  return Change({dir}, 1, [&]() -> Result<BulkTarget> {
    UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(dir));
    if (!S_ISDIR(ii.mode.get())) return Status::Error(ENOTDIR, InodeName(dir) + " is not a directory");
    if (const auto* q = delayed_->Pending(dir.root, dir.ino); q && !q->empty()) {
      return Status::Error(ENOTEMPTY, InodeName(dir) + " is not empty");
    }
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.Seek(Key{dir.ino, kDirItemKey, 0}));
    if (c.Valid() && c.key().objectid == dir.ino && (c.key().type == kDirItemKey || c.key().type == kDirIndexKey)) {
      return Status::Error(ENOTEMPTY, InodeName(dir) + " is not empty");
    }
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
    dir_items_->Forget(dir.root, dir.ino);  // bulk items bypass the name-hash index
    BulkTarget t;
    t.transid = txn_->transid();
    UB_ASSIGN_OR_RETURN(t.first_ino, NextIno(dir.root));
    UB_ASSIGN_OR_RETURN(t.first_index, NextDirIndex(dir));
    t.inode_flags = ii.flags.get() & (kInodeNodatacow | kInodeNodatasum | kInodeCompress | kInodeNocompress);
    t.max_item = w->MaxItemSize();
    t.leaf_space = t.max_item + static_cast<uint32_t>(sizeof(Item));
    t.sectorsize = vol_->sectorsize();
    return t;
  });
}

Status FilesystemImpl::BulkInsert(InodeId dir, std::span<const Key> keys, std::span<const std::vector<uint8_t>> data) {
  return Change({dir}, 2, [&]() -> Status {
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
    return w->InsertBatch(keys, data);
  });
}

Status FilesystemImpl::AddInodeFlags(InodeId id, uint64_t flags) {
  return Change({id}, 1, [&]() -> Status {
    UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
    ii.flags = ii.flags.get() | flags;
    return StoreInode(id, ii);
  });
}

Status FilesystemImpl::BulkEnd(InodeId dir, const BulkTarget& t, uint64_t inodes, uint64_t entries,
                               uint64_t dir_size_delta) {
  return Change({dir}, 1, [&]() -> Status {
    uint64_t& next = next_ino_[dir.root];
    next = std::max(next, t.first_ino + inodes);
    uint64_t& index = DirStateOf(dir).next_index[{dir.root, dir.ino}];  // exclusive: no lock needed
    index = std::max(index, t.first_index + entries);
    UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(dir));
    ii.size = ii.size.get() + dir_size_delta;
    const timespec now = txn::WallClock();
    ii.mtime.sec = static_cast<uint64_t>(now.tv_sec);
    ii.mtime.nsec = static_cast<uint32_t>(now.tv_nsec);
    ii.ctime = ii.mtime;
    return StoreInode(dir, ii);
  });
}

}  // namespace ubtrfs::fsimpl
