// The C API (include/ubtrfs/ubtrfs.h) over ubtrfs::Filesystem. Translation
// only: check the arguments, call the C++ API, turn a Status into a negative
// errno and a thread-local message. No C++ exception leaves a call.
#include "ubtrfs/ubtrfs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "io/block_device.h"
#include "io/rbd_device.h"
#include "txn/mkfs.h"
#include "ubtrfs/export.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/mkfs.h"

struct ubtrfs_fs {
  std::unique_ptr<ubtrfs::Filesystem> fs;
  bool writable = false;
  bool discarded = false;  // ubtrfs_discard: close commits nothing
};

namespace {

using ubtrfs::InodeId;
using ubtrfs::Status;

thread_local std::string t_error;

// Records the failure of `fn` and returns -code.
int Fail(const char* fn, int code, const std::string& message) {
  if (code <= 0) code = EIO;
  try {
    t_error = std::string("ubtrfs_") + fn + ": " + message;
  } catch (...) {
    t_error.clear();
  }
  return -code;
}

int FailStatus(const char* fn, const Status& st) { return Fail(fn, st.code(), st.message()); }

// Runs `body` (which returns an int or int64_t result), turning exceptions
// into errors. The thread's message is cleared first.
template <typename R, typename F>
R Call(const char* fn, F&& body) {
  t_error.clear();
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(fn, ENOMEM, "out of memory");
  } catch (const std::exception& e) {
    return Fail(fn, EIO, std::string("internal error: ") + e.what());
  } catch (...) {
    return Fail(fn, EIO, "internal error");
  }
}

InodeId Id(ubtrfs_ino i) { return InodeId{i.root, i.ino}; }
ubtrfs_ino CIno(InodeId i) { return ubtrfs_ino{i.root, i.ino}; }
ubtrfs_time CTime(ubtrfs::Time t) { return ubtrfs_time{t.sec, t.nsec}; }

ubtrfs::Time Now() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ubtrfs::Time{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)};
}

// The checks every handle call makes first; 0 when fine.
int CheckFs(const char* fn, ubtrfs_fs* fs) {
  if (!fs || !fs->fs) return Fail(fn, EBADF, "the ubtrfs_fs handle is NULL");
  return 0;
}

int CheckPtr(const char* fn, const void* p, const char* what) {
  if (!p) return Fail(fn, EINVAL, std::string(what) + " is NULL");
  return 0;
}

// A single path component.
int CheckName(const char* fn, const char* name) {
  if (!name) return Fail(fn, EINVAL, "name is NULL");
  const size_t n = std::strlen(name);
  if (n == 0) return Fail(fn, EINVAL, "empty name");
  if (n > 255) return Fail(fn, ENAMETOOLONG, "name longer than 255 bytes");
  if (std::strchr(name, '/')) return Fail(fn, EINVAL, std::string("'") + name + "' is not a single name (holds '/')");
  if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) {
    return Fail(fn, EINVAL, std::string("'") + name + "' cannot be used as a name");
  }
  return 0;
}

void FillStat(const ubtrfs::Stat& s, ubtrfs_stat_t* out) {
  std::memset(out, 0, sizeof(*out));
  out->id = CIno(s.id);
  out->mode = s.mode;
  out->nlink = s.nlink;
  out->uid = s.uid;
  out->gid = s.gid;
  out->rdev = s.rdev;
  out->size = s.size;
  out->nbytes = s.nbytes;
  out->generation = s.generation;
  out->flags = s.flags;
  out->atime = CTime(s.atime);
  out->mtime = CTime(s.mtime);
  out->ctime = CTime(s.ctime);
  out->otime = CTime(s.otime);
}

ubtrfs::NewInode NewAttrs(uint32_t mode) {
  ubtrfs::NewInode a;
  a.mode = mode;
  a.uid = geteuid();
  a.gid = getegid();
  return a;
}

// Create, Mkdir, Mknod and Symlink share their shape.
template <typename F>
int MakeInode(const char* fn, ubtrfs_fs* fs, const char* name, ubtrfs_ino* out, F&& make) {
  return Call<int>(fn, [&]() -> int {
    if (int e = CheckFs(fn, fs)) return e;
    if (int e = CheckName(fn, name)) return e;
    auto r = make();
    if (!r.ok()) return FailStatus(fn, r.status().WithContext(name));
    if (out) *out = CIno(*r);
    return 0;
  });
}

int SetAttrChange(const char* fn, ubtrfs_fs* fs, ubtrfs_ino ino, const ubtrfs::AttrChange& c) {
  Status st = fs->fs->SetAttr(Id(ino), c);
  return st.ok() ? 0 : FailStatus(fn, st);
}

}  // namespace

extern "C" {

const char* ubtrfs_last_error(void) { return t_error.c_str(); }

const char* ubtrfs_version(void) { return "0.1.0"; }

int ubtrfs_open_ex(const char* path, unsigned flags, uint64_t offset, int partition, ubtrfs_fs** out) {
  return Call<int>("open", [&]() -> int {
    if (int e = CheckPtr("open", out, "out")) return e;
    *out = nullptr;
    if (int e = CheckPtr("open", path, "path")) return e;
    constexpr unsigned kAll = UBTRFS_OPEN_WRITABLE | UBTRFS_OPEN_NO_VERIFY_CSUMS | UBTRFS_OPEN_UNDO_UNCOMMITTED;
    if (flags & ~kAll) {
      return Fail("open", EINVAL, "unknown flags " + std::to_string(flags) +
                                      " (UBTRFS_OPEN_WRITABLE, UBTRFS_OPEN_NO_VERIFY_CSUMS and "
                                      "UBTRFS_OPEN_UNDO_UNCOMMITTED exist)");
    }
    if (partition < 0) return Fail("open", EINVAL, "partition " + std::to_string(partition) + " is negative");
    if (partition > 0 && offset > 0) return Fail("open", EINVAL, "give an offset or a partition, not both");
    ubtrfs::OpenOptions opts;
    opts.writable = (flags & UBTRFS_OPEN_WRITABLE) != 0;
    opts.verify_data_csums = (flags & UBTRFS_OPEN_NO_VERIFY_CSUMS) == 0;
    opts.undo_uncommitted = (flags & UBTRFS_OPEN_UNDO_UNCOMMITTED) != 0;
    opts.offset = offset;
    opts.partition = partition;
    auto r = ubtrfs::Filesystem::Open(path, opts);
    if (!r.ok()) return FailStatus("open", r.status().WithContext(path));
    auto h = std::make_unique<ubtrfs_fs>();
    h->fs = std::move(*r);
    h->writable = opts.writable;
    *out = h.release();
    return 0;
  });
}

int ubtrfs_open(const char* path, unsigned flags, ubtrfs_fs** out) { return ubtrfs_open_ex(path, flags, 0, 0, out); }

int ubtrfs_discard(ubtrfs_fs* fs) {
  return Call<int>("discard", [&]() -> int {
    if (int e = CheckFs("discard", fs)) return e;
    if (!fs->writable) return Fail("discard", EROFS, "the image was opened read-only");
    Status st = fs->fs->Discard();
    if (!st.ok()) return FailStatus("discard", st);
    fs->discarded = true;
    return 0;
  });
}

int ubtrfs_close(ubtrfs_fs* fs) {
  return Call<int>("close", [&]() -> int {
    if (int e = CheckFs("close", fs)) return e;
    std::unique_ptr<ubtrfs_fs> h(fs);
    int rc = 0;
    if (h->writable && !h->discarded) {
      Status st = h->fs->Commit();
      if (!st.ok()) rc = FailStatus("close", st.WithContext("committing"));
    }
    h->fs.reset();
    return rc;
  });
}

int ubtrfs_commit(ubtrfs_fs* fs) {
  return Call<int>("commit", [&]() -> int {
    if (int e = CheckFs("commit", fs)) return e;
    if (!fs->writable) return Fail("commit", EROFS, "the image was opened read-only");
    Status st = fs->fs->Commit();
    return st.ok() ? 0 : FailStatus("commit", st);
  });
}

namespace {

// ubtrfs_mkfs on rbd:POOL/IMAGE: the RBD image is created (or grown) to
// `size` as an image file would be.
int MkfsRbd(const std::string& p, uint64_t size, bool force) {
  auto have = ubtrfs::io::RbdImageSize(p);
  if (!have.ok()) return FailStatus("mkfs", have.status());
  const bool exists = have->has_value();
  if (!exists && size == 0) return Fail("mkfs", EINVAL, p + " does not exist and no size was given");
  ubtrfs::txn::MkfsOptions opts;
  const uint64_t want = size ? size : **have;
  if (want < ubtrfs::txn::MkfsMinBytes(opts.nodesize)) {
    return Fail("mkfs", EINVAL, p + ": " + std::to_string(want) + " bytes is too small");
  }
  if (exists && !force) {
    auto dev = ubtrfs::io::OpenDevice(p);
    if (!dev.ok()) return FailStatus("mkfs", dev.status());
    auto has = ubtrfs::txn::HasBtrfsSignature(dev->get());
    if (!has.ok()) return FailStatus("mkfs", has.status());
    if (*has) return Fail("mkfs", EEXIST, p + " already holds a btrfs filesystem (pass force to overwrite it)");
  }
  if (!exists) {
    if (Status c = ubtrfs::io::CreateRbdImage(p, want); !c.ok()) return FailStatus("mkfs", c);
  } else if (want > **have) {
    if (Status c = ubtrfs::io::ResizeRbdImage(p, want); !c.ok()) return FailStatus("mkfs", c);
  }
  auto dev = ubtrfs::io::OpenDevice(p, ubtrfs::io::OpenFlags{true});
  Status s = dev.ok() ? ubtrfs::txn::MakeFilesystem(dev->get(), opts) : dev.status();
  if (dev.ok()) dev->reset();
  if (!s.ok()) {
    if (!exists) (void)ubtrfs::io::RemoveRbdImage(p);
    return FailStatus("mkfs", s.WithContext(p));
  }
  return 0;
}

}  // namespace

int ubtrfs_fsync(ubtrfs_fs* fs, ubtrfs_ino ino, int datasync) {
  return Call<int>("fsync", [&]() -> int {
    if (int e = CheckFs("fsync", fs)) return e;
    if (!fs->writable) return Fail("fsync", EROFS, "the image was opened read-only");
    Status st = fs->fs->Fsync(Id(ino), datasync != 0);
    return st.ok() ? 0 : FailStatus("fsync", st);
  });
}

int ubtrfs_pin_inode(ubtrfs_fs* fs, ubtrfs_ino ino) {
  return Call<int>("pin_inode", [&]() -> int {
    if (int e = CheckFs("pin_inode", fs)) return e;
    fs->fs->PinInode(Id(ino));
    return 0;
  });
}

int ubtrfs_unpin_inode(ubtrfs_fs* fs, ubtrfs_ino ino) {
  return Call<int>("unpin_inode", [&]() -> int {
    if (int e = CheckFs("unpin_inode", fs)) return e;
    Status st = fs->fs->UnpinInode(Id(ino));
    return st.ok() ? 0 : FailStatus("unpin_inode", st);
  });
}

int ubtrfs_mkfs(const char* path, uint64_t size, int force) {
  return Call<int>("mkfs", [&]() -> int {
    if (int e = CheckPtr("mkfs", path, "path")) return e;
    const std::string p = path;
    if (p.empty()) return Fail("mkfs", EINVAL, "empty path");
    if (ubtrfs::io::IsRbdPath(p)) return MkfsRbd(p, size, force != 0);
    struct stat st;
    const bool exists = ::stat(path, &st) == 0;
    if (!exists && errno != ENOENT) return Fail("mkfs", errno, p + ": " + std::strerror(errno));
    if (exists && !S_ISREG(st.st_mode)) return Fail("mkfs", EINVAL, p + ": not a regular file");
    if (!exists && size == 0) return Fail("mkfs", EINVAL, p + " does not exist and no size was given");
    ubtrfs::txn::MkfsOptions opts;
    if (Status s = ubtrfs::txn::ValidateMkfsOptions(opts); !s.ok()) return FailStatus("mkfs", s);
    const uint64_t have = exists ? static_cast<uint64_t>(st.st_size) : 0;
    const uint64_t want = size ? size : have;
    const uint64_t min = ubtrfs::txn::MkfsMinBytes(opts.nodesize);
    if (want < min) {
      return Fail("mkfs", EINVAL, p + ": " + std::to_string(want) + " bytes is too small; at least " +
                                      std::to_string(min) + " are needed");
    }
    if (want > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
      return Fail("mkfs", EFBIG, p + ": size too large");
    }
    if (exists && !force) {
      auto dev = ubtrfs::io::OpenFileDevice(p);
      if (!dev.ok()) return FailStatus("mkfs", dev.status());
      auto has = ubtrfs::txn::HasBtrfsSignature(dev->get());
      if (!has.ok()) return FailStatus("mkfs", has.status());
      if (*has) return Fail("mkfs", EEXIST, p + " already holds a btrfs filesystem (pass force to overwrite it)");
    }
    if (!exists || want > have) {
      int fd = ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) return Fail("mkfs", errno, p + ": cannot create: " + std::strerror(errno));
      if (::ftruncate(fd, static_cast<off_t>(want)) != 0) {
        const int e = errno;
        ::close(fd);
        if (!exists) ::unlink(path);
        return Fail("mkfs", e, p + ": cannot set the size: " + std::strerror(e));
      }
      ::close(fd);
    }
    auto dev = ubtrfs::io::OpenFileDevice(p, ubtrfs::io::OpenFlags{true});
    if (!dev.ok()) {
      if (!exists) ::unlink(path);
      return FailStatus("mkfs", dev.status());
    }
    Status s = ubtrfs::txn::MakeFilesystem(dev->get(), opts);
    dev->reset();
    if (!s.ok()) {
      if (!exists) ::unlink(path);
      return FailStatus("mkfs", s.WithContext(p));
    }
    return 0;
  });
}

int ubtrfs_mkfs_ex(const char* const* devices, size_t ndevices, const ubtrfs_mkfs_opts_t* opts) {
  return Call<int>("mkfs", [&]() -> int {
    if (int e = CheckPtr("mkfs", devices, "devices")) return e;
    if (int e = CheckPtr("mkfs", opts, "opts")) return e;
    if (ndevices == 0) return Fail("mkfs", EINVAL, "no device given");
    // A caller built against an older header passes a shorter struct: the
    // fields past its end are the defaults.
    if (opts->struct_size < offsetof(ubtrfs_mkfs_opts_t, size) + sizeof(uint64_t)) {
      return Fail("mkfs", EINVAL, "opts->struct_size is not set (sizeof(ubtrfs_mkfs_opts_t))");
    }
    ubtrfs_mkfs_opts_t o{};
    std::memcpy(&o, opts, std::min<size_t>(opts->struct_size, sizeof o));
    ubtrfs::MkfsSpec spec;
    for (size_t i = 0; i < ndevices; ++i) {
      if (int e = CheckPtr("mkfs", devices[i], "a device path")) return e;
      spec.images.emplace_back(devices[i]);
    }
    auto text = [](const char* p) { return p ? std::string(p) : std::string(); };
    auto list = [](const char* const* p) {
      std::vector<std::string> v;
      for (; p && *p; ++p) v.emplace_back(*p);
      return v;
    };
    if (o.size) spec.size = o.size;
    spec.force = o.force != 0;
    spec.label = text(o.label);
    spec.uuid = text(o.uuid);
    if (o.csum) spec.csum = o.csum;
    if (o.nodesize) spec.nodesize = o.nodesize;
    spec.data_profile = text(o.data_profile);
    spec.metadata_profile = text(o.metadata_profile);
    if (o.features) spec.features = {o.features};
    spec.mixed = o.mixed != 0;
    spec.rootdir = text(o.rootdir);
    spec.compress = text(o.compress);
    spec.subvols = list(o.subvols);
    spec.inode_flags = list(o.inode_flags);
    if (o.owner_set) spec.owner.emplace(o.owner_uid, o.owner_gid);
    spec.deterministic = o.deterministic != 0;
    if (o.source_date_epoch_set) spec.source_date_epoch = o.source_date_epoch;
    spec.shrink = o.shrink != 0;
    spec.reflink = o.reflink != 0;
    if (Status s = ubtrfs::Mkfs(spec); !s.ok()) return FailStatus("mkfs", s);
    return 0;
  });
}

int ubtrfs_root(ubtrfs_fs* fs, ubtrfs_ino* out) {
  return Call<int>("root", [&]() -> int {
    if (int e = CheckFs("root", fs)) return e;
    if (int e = CheckPtr("root", out, "out")) return e;
    *out = CIno(fs->fs->Root());
    return 0;
  });
}

int ubtrfs_lookup(ubtrfs_fs* fs, const char* path, ubtrfs_ino* out) {
  return Call<int>("lookup", [&]() -> int {
    if (int e = CheckFs("lookup", fs)) return e;
    if (int e = CheckPtr("lookup", path, "path")) return e;
    if (int e = CheckPtr("lookup", out, "out")) return e;
    if (path[0] != '/') return Fail("lookup", EINVAL, std::string("'") + path + "' is not an absolute path");
    auto r = fs->fs->Lookup(path);
    if (!r.ok()) return FailStatus("lookup", r.status().WithContext(path));
    *out = CIno(*r);
    return 0;
  });
}

int ubtrfs_lookup_child(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name, ubtrfs_ino* out) {
  return Call<int>("lookup_child", [&]() -> int {
    if (int e = CheckFs("lookup_child", fs)) return e;
    if (int e = CheckPtr("lookup_child", name, "name")) return e;
    if (int e = CheckPtr("lookup_child", out, "out")) return e;
    auto r = fs->fs->LookupChild(Id(dir), name);
    if (!r.ok()) return FailStatus("lookup_child", r.status().WithContext(name));
    *out = CIno(*r);
    return 0;
  });
}

int ubtrfs_stat(ubtrfs_fs* fs, ubtrfs_ino ino, ubtrfs_stat_t* out) {
  return Call<int>("stat", [&]() -> int {
    if (int e = CheckFs("stat", fs)) return e;
    if (int e = CheckPtr("stat", out, "out")) return e;
    auto r = fs->fs->GetStat(Id(ino));
    if (!r.ok()) return FailStatus("stat", r.status());
    FillStat(*r, out);
    return 0;
  });
}

int ubtrfs_stat_path(ubtrfs_fs* fs, const char* path, ubtrfs_stat_t* out) {
  ubtrfs_ino ino;
  if (int e = ubtrfs_lookup(fs, path, &ino)) return e;
  return ubtrfs_stat(fs, ino, out);
}

int ubtrfs_readdir(ubtrfs_fs* fs, ubtrfs_ino dir, ubtrfs_readdir_fn fn, void* ctx) {
  return Call<int>("readdir", [&]() -> int {
    if (int e = CheckFs("readdir", fs)) return e;
    if (!fn) return Fail("readdir", EINVAL, "callback is NULL");
    auto r = fs->fs->ReadDir(Id(dir));
    if (!r.ok()) return FailStatus("readdir", r.status());
    for (const auto& e : *r) {
      if (int rc = fn(ctx, e.name.c_str(), CIno(e.id), e.type, e.index)) return rc;
    }
    return 0;
  });
}

int64_t ubtrfs_read(ubtrfs_fs* fs, ubtrfs_ino file, uint64_t offset, void* buf, size_t len) {
  return Call<int64_t>("read", [&]() -> int64_t {
    if (int e = CheckFs("read", fs)) return e;
    if (len == 0) return 0;
    if (int e = CheckPtr("read", buf, "buf")) return e;
    if (len > static_cast<size_t>(INT64_MAX)) len = static_cast<size_t>(INT64_MAX);
    auto r = fs->fs->Read(Id(file), offset, std::span<uint8_t>(static_cast<uint8_t*>(buf), len));
    if (!r.ok()) return FailStatus("read", r.status());
    return static_cast<int64_t>(*r);
  });
}

int64_t ubtrfs_write(ubtrfs_fs* fs, ubtrfs_ino file, uint64_t offset, const void* buf, size_t len) {
  return Call<int64_t>("write", [&]() -> int64_t {
    if (int e = CheckFs("write", fs)) return e;
    if (len == 0) return 0;
    if (int e = CheckPtr("write", buf, "buf")) return e;
    if (len > static_cast<size_t>(INT64_MAX)) return Fail("write", EINVAL, "len too large");
    auto r = fs->fs->Write(Id(file), offset, std::span<const uint8_t>(static_cast<const uint8_t*>(buf), len));
    if (!r.ok()) return FailStatus("write", r.status());
    return static_cast<int64_t>(*r);
  });
}

int64_t ubtrfs_readlink(ubtrfs_fs* fs, ubtrfs_ino link, char* buf, size_t len) {
  return Call<int64_t>("readlink", [&]() -> int64_t {
    if (int e = CheckFs("readlink", fs)) return e;
    if (len > 0) {
      if (int e = CheckPtr("readlink", buf, "buf")) return e;
    }
    auto r = fs->fs->ReadLink(Id(link));
    if (!r.ok()) return FailStatus("readlink", r.status());
    if (len > 0) {
      const size_t n = r->size() < len ? r->size() : len;
      std::memcpy(buf, r->data(), n);
      if (n < len) buf[n] = '\0';
    }
    return static_cast<int64_t>(r->size());
  });
}

int ubtrfs_create(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name, uint32_t mode, ubtrfs_ino* out) {
  return MakeInode("create", fs, name, out, [&] { return fs->fs->Create(Id(dir), name, NewAttrs(mode & 07777)); });
}

int ubtrfs_mkdir(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name, uint32_t mode, ubtrfs_ino* out) {
  return MakeInode("mkdir", fs, name, out, [&] { return fs->fs->Mkdir(Id(dir), name, NewAttrs(mode & 07777)); });
}

int ubtrfs_mknod(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name, uint32_t mode, uint64_t rdev, ubtrfs_ino* out) {
  return Call<int>("mknod", [&]() -> int {
    const uint32_t type = mode & S_IFMT;
    if (type != S_IFIFO && type != S_IFSOCK && type != S_IFCHR && type != S_IFBLK) {
      return Fail("mknod", EINVAL, "mode must carry S_IFIFO, S_IFSOCK, S_IFCHR or S_IFBLK");
    }
    return MakeInode("mknod", fs, name, out, [&] {
      auto a = NewAttrs(mode);
      a.rdev = rdev;
      return fs->fs->Mknod(Id(dir), name, a);
    });
  });
}

int ubtrfs_symlink(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name, const char* target, ubtrfs_ino* out) {
  return Call<int>("symlink", [&]() -> int {
    if (int e = CheckPtr("symlink", target, "target")) return e;
    if (target[0] == '\0') return Fail("symlink", ENOENT, "empty target");
    return MakeInode("symlink", fs, name, out,
                     [&] { return fs->fs->Symlink(Id(dir), name, target, NewAttrs(0777)); });
  });
}

int ubtrfs_link(ubtrfs_fs* fs, ubtrfs_ino target, ubtrfs_ino dir, const char* name) {
  return Call<int>("link", [&]() -> int {
    if (int e = CheckFs("link", fs)) return e;
    if (int e = CheckName("link", name)) return e;
    Status st = fs->fs->Link(Id(target), Id(dir), name);
    return st.ok() ? 0 : FailStatus("link", st.WithContext(name));
  });
}

int ubtrfs_unlink(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name) {
  return Call<int>("unlink", [&]() -> int {
    if (int e = CheckFs("unlink", fs)) return e;
    if (int e = CheckName("unlink", name)) return e;
    Status st = fs->fs->Unlink(Id(dir), name);
    return st.ok() ? 0 : FailStatus("unlink", st.WithContext(name));
  });
}

int ubtrfs_rmdir(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name) {
  return Call<int>("rmdir", [&]() -> int {
    if (int e = CheckFs("rmdir", fs)) return e;
    if (int e = CheckName("rmdir", name)) return e;
    Status st = fs->fs->Rmdir(Id(dir), name);
    return st.ok() ? 0 : FailStatus("rmdir", st.WithContext(name));
  });
}

int ubtrfs_rename(ubtrfs_fs* fs, ubtrfs_ino old_dir, const char* old_name, ubtrfs_ino new_dir, const char* new_name,
                  unsigned flags) {
  return Call<int>("rename", [&]() -> int {
    if (int e = CheckFs("rename", fs)) return e;
    if (int e = CheckName("rename", old_name)) return e;
    if (int e = CheckName("rename", new_name)) return e;
    if (flags & ~(UBTRFS_RENAME_NOREPLACE | UBTRFS_RENAME_EXCHANGE)) {
      return Fail("rename", EINVAL, "unknown flags " + std::to_string(flags));
    }
    if ((flags & UBTRFS_RENAME_NOREPLACE) && (flags & UBTRFS_RENAME_EXCHANGE)) {
      return Fail("rename", EINVAL, "UBTRFS_RENAME_NOREPLACE and UBTRFS_RENAME_EXCHANGE exclude each other");
    }
    unsigned f = 0;
    if (flags & UBTRFS_RENAME_NOREPLACE) f |= ubtrfs::kRenameNoReplace;
    if (flags & UBTRFS_RENAME_EXCHANGE) f |= ubtrfs::kRenameExchange;
    Status st = fs->fs->Rename(Id(old_dir), old_name, Id(new_dir), new_name, f);
    return st.ok() ? 0 : FailStatus("rename", st.WithContext(std::string(old_name) + " -> " + new_name));
  });
}

int ubtrfs_setattr(ubtrfs_fs* fs, ubtrfs_ino ino, const ubtrfs_setattr_t* attr) {
  return Call<int>("setattr", [&]() -> int {
    if (int e = CheckFs("setattr", fs)) return e;
    if (int e = CheckPtr("setattr", attr, "attr")) return e;
    constexpr uint32_t kAll = UBTRFS_SET_MODE | UBTRFS_SET_UID | UBTRFS_SET_GID | UBTRFS_SET_SIZE |
                              UBTRFS_SET_ATIME | UBTRFS_SET_MTIME | UBTRFS_SET_CTIME;
    if (attr->valid & ~kAll) return Fail("setattr", EINVAL, "unknown bits in valid: " + std::to_string(attr->valid));
    for (const ubtrfs_time* t : {&attr->atime, &attr->mtime, &attr->ctime}) {
      if (t->nsec >= 1000000000u) return Fail("setattr", EINVAL, "nsec must be below 1000000000");
    }
    ubtrfs::AttrChange c;
    if (attr->valid & UBTRFS_SET_MODE) c.mode = attr->mode & 07777;
    if (attr->valid & UBTRFS_SET_UID) c.uid = attr->uid;
    if (attr->valid & UBTRFS_SET_GID) c.gid = attr->gid;
    if (attr->valid & UBTRFS_SET_SIZE) c.size = attr->size;
    if (attr->valid & UBTRFS_SET_ATIME) c.atime = ubtrfs::Time{attr->atime.sec, attr->atime.nsec};
    if (attr->valid & UBTRFS_SET_MTIME) c.mtime = ubtrfs::Time{attr->mtime.sec, attr->mtime.nsec};
    if (attr->valid & UBTRFS_SET_CTIME) c.ctime = ubtrfs::Time{attr->ctime.sec, attr->ctime.nsec};
    return SetAttrChange("setattr", fs, ino, c);
  });
}

int ubtrfs_truncate(ubtrfs_fs* fs, ubtrfs_ino file, uint64_t size) {
  return Call<int>("truncate", [&]() -> int {
    if (int e = CheckFs("truncate", fs)) return e;
    auto st = fs->fs->GetStat(Id(file));
    if (!st.ok()) return FailStatus("truncate", st.status());
    if (S_ISDIR(st->mode)) return Fail("truncate", EISDIR, "is a directory");
    if (!S_ISREG(st->mode)) return Fail("truncate", EINVAL, "not a regular file");
    ubtrfs::AttrChange c;
    c.size = size;
    c.mtime = Now();
    return SetAttrChange("truncate", fs, file, c);
  });
}

int ubtrfs_chmod(ubtrfs_fs* fs, ubtrfs_ino ino, uint32_t mode) {
  return Call<int>("chmod", [&]() -> int {
    if (int e = CheckFs("chmod", fs)) return e;
    if (mode & ~07777u) return Fail("chmod", EINVAL, "mode holds more than permission bits (07777)");
    ubtrfs::AttrChange c;
    c.mode = mode;
    return SetAttrChange("chmod", fs, ino, c);
  });
}

int ubtrfs_chown(ubtrfs_fs* fs, ubtrfs_ino ino, uint32_t uid, uint32_t gid) {
  return Call<int>("chown", [&]() -> int {
    if (int e = CheckFs("chown", fs)) return e;
    ubtrfs::AttrChange c;
    if (uid != UINT32_MAX) c.uid = uid;
    if (gid != UINT32_MAX) c.gid = gid;
    return SetAttrChange("chown", fs, ino, c);
  });
}

int ubtrfs_utimens(ubtrfs_fs* fs, ubtrfs_ino ino, const ubtrfs_time times[2]) {
  return Call<int>("utimens", [&]() -> int {
    if (int e = CheckFs("utimens", fs)) return e;
    ubtrfs::AttrChange c;
    if (times) {
      for (int i = 0; i < 2; ++i) {
        if (times[i].nsec >= 1000000000u) return Fail("utimens", EINVAL, "nsec must be below 1000000000");
      }
      c.atime = ubtrfs::Time{times[0].sec, times[0].nsec};
      c.mtime = ubtrfs::Time{times[1].sec, times[1].nsec};
    } else {
      c.atime = c.mtime = Now();
    }
    return SetAttrChange("utimens", fs, ino, c);
  });
}

int64_t ubtrfs_getxattr(ubtrfs_fs* fs, ubtrfs_ino ino, const char* name, void* buf, size_t len) {
  return Call<int64_t>("getxattr", [&]() -> int64_t {
    if (int e = CheckFs("getxattr", fs)) return e;
    if (int e = CheckPtr("getxattr", name, "name")) return e;
    if (len > 0) {
      if (int e = CheckPtr("getxattr", buf, "buf")) return e;
    }
    auto r = fs->fs->GetXattr(Id(ino), name);
    if (!r.ok()) return FailStatus("getxattr", r.status().WithContext(name));
    if (len > 0 && r->size() <= len) std::memcpy(buf, r->data(), r->size());
    return static_cast<int64_t>(r->size());
  });
}

int64_t ubtrfs_listxattr(ubtrfs_fs* fs, ubtrfs_ino ino, char* buf, size_t len) {
  return Call<int64_t>("listxattr", [&]() -> int64_t {
    if (int e = CheckFs("listxattr", fs)) return e;
    if (len > 0) {
      if (int e = CheckPtr("listxattr", buf, "buf")) return e;
    }
    auto r = fs->fs->ListXattr(Id(ino));
    if (!r.ok()) return FailStatus("listxattr", r.status());
    std::string all;
    for (const auto& n : *r) {
      all += n;
      all.push_back('\0');
    }
    if (len > 0 && all.size() <= len) std::memcpy(buf, all.data(), all.size());
    return static_cast<int64_t>(all.size());
  });
}

int ubtrfs_setxattr(ubtrfs_fs* fs, ubtrfs_ino ino, const char* name, const void* value, size_t len, int flags) {
  return Call<int>("setxattr", [&]() -> int {
    if (int e = CheckFs("setxattr", fs)) return e;
    if (int e = CheckPtr("setxattr", name, "name")) return e;
    if (len > 0) {
      if (int e = CheckPtr("setxattr", value, "value")) return e;
    }
    if (flags & ~(UBTRFS_XATTR_CREATE | UBTRFS_XATTR_REPLACE)) {
      return Fail("setxattr", EINVAL, "unknown flags " + std::to_string(flags));
    }
    if ((flags & UBTRFS_XATTR_CREATE) && (flags & UBTRFS_XATTR_REPLACE)) {
      return Fail("setxattr", EINVAL, "UBTRFS_XATTR_CREATE and UBTRFS_XATTR_REPLACE exclude each other");
    }
    int f = 0;
    if (flags & UBTRFS_XATTR_CREATE) f |= XATTR_CREATE;
    if (flags & UBTRFS_XATTR_REPLACE) f |= XATTR_REPLACE;
    std::string_view v(len ? static_cast<const char*>(value) : "", len);
    Status st = fs->fs->SetXattr(Id(ino), name, v, f);
    return st.ok() ? 0 : FailStatus("setxattr", st.WithContext(name));
  });
}

int ubtrfs_removexattr(ubtrfs_fs* fs, ubtrfs_ino ino, const char* name) {
  return Call<int>("removexattr", [&]() -> int {
    if (int e = CheckFs("removexattr", fs)) return e;
    if (int e = CheckPtr("removexattr", name, "name")) return e;
    Status st = fs->fs->RemoveXattr(Id(ino), name);
    return st.ok() ? 0 : FailStatus("removexattr", st);
  });
}

int ubtrfs_subvol_create(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name, uint32_t mode, ubtrfs_ino* out) {
  return MakeInode("subvol_create", fs, name, out,
                   [&] { return fs->fs->CreateSubvolume(Id(dir), name, NewAttrs(mode & 07777)); });
}

int ubtrfs_snapshot(ubtrfs_fs* fs, ubtrfs_ino subvol, ubtrfs_ino dir, const char* name, int read_only,
                    ubtrfs_ino* out) {
  return MakeInode("snapshot", fs, name, out,
                   [&] { return fs->fs->CreateSnapshot(Id(subvol), Id(dir), name, read_only != 0); });
}

int ubtrfs_subvol_delete(ubtrfs_fs* fs, ubtrfs_ino dir, const char* name) {
  return Call<int>("subvol_delete", [&]() -> int {
    if (int e = CheckFs("subvol_delete", fs)) return e;
    if (int e = CheckPtr("subvol_delete", name, "name")) return e;
    Status st = fs->fs->DeleteSubvolume(Id(dir), name);
    return st.ok() ? 0 : FailStatus("subvol_delete", st);
  });
}

int ubtrfs_subvol_list(ubtrfs_fs* fs, ubtrfs_subvol_fn fn, void* ctx) {
  return Call<int>("subvol_list", [&]() -> int {
    if (int e = CheckFs("subvol_list", fs)) return e;
    if (!fn) return Fail("subvol_list", EINVAL, "callback is NULL");
    auto r = fs->fs->ListSubvolumes();
    if (!r.ok()) return FailStatus("subvol_list", r.status());
    for (const ubtrfs::SubvolumeInfo& s : *r) {
      ubtrfs_subvol_t c;
      std::memset(&c, 0, sizeof(c));
      c.id = s.id;
      c.parent_id = s.parent_id;
      c.dir_ino = s.dir_ino;
      c.path = s.path.c_str();
      std::memcpy(c.uuid, s.uuid.data(), 16);
      std::memcpy(c.parent_uuid, s.parent_uuid.data(), 16);
      std::memcpy(c.received_uuid, s.received_uuid.data(), 16);
      c.generation = s.generation;
      c.ctransid = s.ctransid;
      c.otransid = s.otransid;
      c.ctime = ubtrfs_time{s.ctime.sec, s.ctime.nsec};
      c.otime = ubtrfs_time{s.otime.sec, s.otime.nsec};
      c.read_only = s.read_only ? 1 : 0;
      if (int rc = fn(ctx, &c)) return rc;
    }
    return 0;
  });
}

int ubtrfs_subvol_get_default(ubtrfs_fs* fs, uint64_t* id) {
  return Call<int>("subvol_get_default", [&]() -> int {
    if (int e = CheckFs("subvol_get_default", fs)) return e;
    if (int e = CheckPtr("subvol_get_default", id, "id")) return e;
    auto r = fs->fs->DefaultSubvolume();
    if (!r.ok()) return FailStatus("subvol_get_default", r.status());
    *id = *r;
    return 0;
  });
}

int ubtrfs_subvol_set_default(ubtrfs_fs* fs, uint64_t id) {
  return Call<int>("subvol_set_default", [&]() -> int {
    if (int e = CheckFs("subvol_set_default", fs)) return e;
    Status st = fs->fs->SetDefaultSubvolume(id);
    return st.ok() ? 0 : FailStatus("subvol_set_default", st);
  });
}

int ubtrfs_subvol_get_readonly(ubtrfs_fs* fs, ubtrfs_ino subvol, int* read_only) {
  return Call<int>("subvol_get_readonly", [&]() -> int {
    if (int e = CheckFs("subvol_get_readonly", fs)) return e;
    if (int e = CheckPtr("subvol_get_readonly", read_only, "read_only")) return e;
    auto r = fs->fs->SubvolumeReadOnly(Id(subvol));
    if (!r.ok()) return FailStatus("subvol_get_readonly", r.status());
    *read_only = *r ? 1 : 0;
    return 0;
  });
}

int ubtrfs_subvol_set_readonly(ubtrfs_fs* fs, ubtrfs_ino subvol, int read_only) {
  return Call<int>("subvol_set_readonly", [&]() -> int {
    if (int e = CheckFs("subvol_set_readonly", fs)) return e;
    Status st = fs->fs->SetSubvolumeReadOnly(Id(subvol), read_only != 0);
    return st.ok() ? 0 : FailStatus("subvol_set_readonly", st);
  });
}

int ubtrfs_clone(ubtrfs_fs* fs, ubtrfs_ino src, uint64_t src_offset, ubtrfs_ino dst, uint64_t dst_offset,
                 uint64_t len) {
  return Call<int>("clone", [&]() -> int {
    if (int e = CheckFs("clone", fs)) return e;
    Status st = fs->fs->Clone(Id(src), src_offset, Id(dst), dst_offset, len);
    return st.ok() ? 0 : FailStatus("clone", st);
  });
}

int ubtrfs_enable_verity(ubtrfs_fs* fs, ubtrfs_ino file, int hash_alg, uint32_t block_size, const void* salt,
                         size_t salt_len) {
  return Call<int>("enable_verity", [&]() -> int {
    if (int e = CheckFs("enable_verity", fs)) return e;
    if (hash_alg < 0 || hash_alg > 255) return Fail("enable_verity", EINVAL, "hash_alg");
    if (salt_len && !salt) return Fail("enable_verity", EINVAL, "salt is NULL");
    ubtrfs::VerityParams p;
    p.hash_algorithm = static_cast<uint8_t>(hash_alg);
    if (block_size) p.block_size = block_size;
    const auto* s = static_cast<const uint8_t*>(salt);
    if (salt_len) p.salt.assign(s, s + salt_len);
    Status st = fs->fs->EnableVerity(Id(file), p);
    return st.ok() ? 0 : FailStatus("enable_verity", st);
  });
}

int ubtrfs_measure_verity(ubtrfs_fs* fs, ubtrfs_ino file, int* hash_alg, uint8_t digest[64], size_t* digest_len) {
  return Call<int>("measure_verity", [&]() -> int {
    if (int e = CheckFs("measure_verity", fs)) return e;
    if (!hash_alg || !digest || !digest_len) return Fail("measure_verity", EINVAL, "NULL argument");
    auto v = fs->fs->GetVerity(Id(file));
    if (!v.ok()) return FailStatus("measure_verity", v.status());
    if (!*v) return Fail("measure_verity", ENODATA, "the file has no fs-verity");
    *hash_alg = (*v)->params.hash_algorithm;
    *digest_len = std::min<size_t>((*v)->digest.size(), 64);
    std::memcpy(digest, (*v)->digest.data(), *digest_len);
    return 0;
  });
}

int ubtrfs_statfs(ubtrfs_fs* fs, ubtrfs_statfs_t* out) {
  return Call<int>("statfs", [&]() -> int {
    if (int e = CheckFs("statfs", fs)) return e;
    if (int e = CheckPtr("statfs", out, "out")) return e;
    auto r = fs->fs->StatFs();
    if (!r.ok()) return FailStatus("statfs", r.status());
    std::memset(out, 0, sizeof(*out));
    out->block_size = r->block_size;
    out->node_size = r->node_size;
    out->total_bytes = r->total_bytes;
    out->used_bytes = r->used_bytes;
    out->free_bytes = r->free_bytes;
    out->name_max = r->name_max;
    out->avail_bytes = r->avail_bytes;
    return 0;
  });
}

int ubtrfs_export(ubtrfs_fs* fs, const char* src_path, const char* dest, unsigned flags) {
  return Call<int>("export", [&]() -> int {
    if (int e = CheckFs("export", fs)) return e;
    if (int e = CheckPtr("export", src_path, "src_path")) return e;
    if (int e = CheckPtr("export", dest, "dest")) return e;
    if (dest[0] == '\0') return Fail("export", EINVAL, "empty dest");
    if (flags & ~(UBTRFS_EXPORT_STRICT | UBTRFS_EXPORT_NO_DEVICES | UBTRFS_EXPORT_NO_XATTRS)) {
      return Fail("export", EINVAL, "unknown flags " + std::to_string(flags));
    }
    if (src_path[0] != '/') return Fail("export", EINVAL, std::string("'") + src_path + "' is not an absolute path");
    auto id = fs->fs->Lookup(src_path);
    if (!id.ok()) return FailStatus("export", id.status().WithContext(src_path));
    ubtrfs::ExportOptions opts;
    opts.strict = (flags & UBTRFS_EXPORT_STRICT) != 0;
    opts.devices = (flags & UBTRFS_EXPORT_NO_DEVICES) == 0;
    opts.xattrs = (flags & UBTRFS_EXPORT_NO_XATTRS) == 0;
    std::string first_error;
    opts.on_message = [&](bool error, std::string_view msg) {
      if (error && first_error.empty()) first_error = std::string(msg);
    };
    ubtrfs::ExportReport report;
    Status st = ubtrfs::ExportTree(*fs->fs, *id, src_path, dest, opts, &report);
    if (!st.ok()) {
      std::string msg = st.message();
      if (!first_error.empty() && msg.find(first_error) == std::string::npos) msg += " (first: " + first_error + ")";
      return Fail("export", st.code(), msg);
    }
    return 0;
  });
}

}  // extern "C"
