#include "support/tree_compare.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>

#include <fmt/core.h>

#include "support/test_util.h"

namespace ubtrfs_test {

namespace {

using Identity = std::pair<uint64_t, uint64_t>;

struct Ts {
  int64_t sec = 0;
  uint32_t nsec = 0;
  bool operator==(const Ts& o) const { return sec == o.sec && nsec == o.nsec; }
};

std::string Show(const Ts& t) { return fmt::format("{}.{:09d}", t.sec, t.nsec); }

struct Attr {
  uint32_t mode = 0, nlink = 0, uid = 0, gid = 0;
  uint64_t rdev = 0, size = 0, nbytes = 0, ino = 0;
  Ts atime, mtime, ctime, otime;
  bool has_otime = false;
  Identity identity;
};

struct Entry {
  std::string name;
  uint8_t type = DT_UNKNOWN;
  Identity identity;
  uint64_t index = 0;
};

class Reader {
 public:
  virtual ~Reader() = default;
  // Reads until buf is full or EOF; *n = bytes read. Returns "" or an error.
  virtual std::string ReadFull(uint64_t offset, std::span<uint8_t> buf, size_t* n) = 0;
};

class Collector {
 public:
  explicit Collector(size_t cap) : cap_(cap) {}
  void Add(std::string m) {
    ++total_;
    if (out_.size() < cap_) out_.push_back(std::move(m));
  }
  bool full() const { return total_ >= cap_; }
  std::vector<std::string> Finish(bool stopped) {
    if (stopped && total_ >= cap_) out_.push_back(fmt::format("... stopped after {} mismatches", total_));
    return std::move(out_);
  }

 private:
  size_t cap_;
  size_t total_ = 0;
  std::vector<std::string> out_;
};

std::string ShowPath(const std::string& rel) { return rel.empty() ? "/" : "/" + Printable(rel, 300); }

std::string Join(const std::string& dir, const std::string& name) { return dir.empty() ? name : dir + "/" + name; }

class View {
 public:
  virtual ~View() = default;
  virtual std::string Stat(const std::string& rel, Attr* out) = 0;
  virtual std::string List(const std::string& rel, std::vector<Entry>* out) = 0;
  virtual std::string ReadLink(const std::string& rel, std::string* out) = 0;
  virtual std::string ListXattr(const std::string& rel, std::vector<std::string>* out) = 0;
  virtual std::string GetXattr(const std::string& rel, const std::string& name, std::string* out) = 0;
  virtual std::string Open(const std::string& rel, std::unique_ptr<Reader>* out) = 0;
  // Whether readdir ids/types are expected to equal the ids/types of a stat.
  virtual bool ExactReaddir() const = 0;
};

// ------------------------------------------------------------- host side ---

class HostReader : public Reader {
 public:
  explicit HostReader(int fd) : fd_(fd) {}
  ~HostReader() override { close(fd_); }
  std::string ReadFull(uint64_t offset, std::span<uint8_t> buf, size_t* n) override {
    size_t done = 0;
    while (done < buf.size()) {
      ssize_t r = pread(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        *n = done;
        return fmt::format("pread: {}", strerror(errno));
      }
      if (r == 0) break;
      done += r;
    }
    *n = done;
    return "";
  }

 private:
  int fd_;
};

class HostView : public View {
 public:
  explicit HostView(std::string root) : root_(std::move(root)) {}

  std::string Path(const std::string& rel) const { return rel.empty() ? root_ : root_ + "/" + rel; }

  std::string Stat(const std::string& rel, Attr* a) override {
    struct statx sx;
    if (statx(AT_FDCWD, Path(rel).c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS | STATX_BTIME, &sx) != 0)
      return fmt::format("statx: {}", strerror(errno));
    a->mode = sx.stx_mode;
    a->nlink = sx.stx_nlink;
    a->uid = sx.stx_uid;
    a->gid = sx.stx_gid;
    a->rdev = makedev(sx.stx_rdev_major, sx.stx_rdev_minor);
    a->size = sx.stx_size;
    a->nbytes = sx.stx_blocks * 512;
    a->ino = sx.stx_ino;
    a->atime = {sx.stx_atime.tv_sec, sx.stx_atime.tv_nsec};
    a->mtime = {sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec};
    a->ctime = {sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec};
    a->has_otime = (sx.stx_mask & STATX_BTIME) != 0;
    a->otime = {sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec};
    a->identity = {makedev(sx.stx_dev_major, sx.stx_dev_minor), sx.stx_ino};
    return "";
  }

  std::string List(const std::string& rel, std::vector<Entry>* out) override {
    DIR* d = opendir(Path(rel).c_str());
    if (!d) return fmt::format("opendir: {}", strerror(errno));
    errno = 0;
    while (struct dirent* e = readdir(d)) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      Entry en;
      en.name = e->d_name;
      en.type = e->d_type;
      en.identity = {0, e->d_ino};
      out->push_back(std::move(en));
    }
    int err = errno;
    closedir(d);
    if (err) return fmt::format("readdir: {}", strerror(err));
    return "";
  }

  std::string ReadLink(const std::string& rel, std::string* out) override {
    std::vector<char> buf(256);
    for (;;) {
      ssize_t n = readlink(Path(rel).c_str(), buf.data(), buf.size());
      if (n < 0) return fmt::format("readlink: {}", strerror(errno));
      if (static_cast<size_t>(n) < buf.size()) {
        out->assign(buf.data(), n);
        return "";
      }
      buf.resize(buf.size() * 2);
    }
  }

  std::string ListXattr(const std::string& rel, std::vector<std::string>* out) override {
    std::string p = Path(rel);
    for (;;) {
      ssize_t n = llistxattr(p.c_str(), nullptr, 0);
      if (n < 0) {
        if (errno == ENOTSUP) return "";
        return fmt::format("llistxattr: {}", strerror(errno));
      }
      std::vector<char> buf(n + 1);
      ssize_t m = llistxattr(p.c_str(), buf.data(), buf.size());
      if (m < 0 && errno == ERANGE) continue;
      if (m < 0) return fmt::format("llistxattr: {}", strerror(errno));
      for (ssize_t i = 0; i < m;) {
        std::string name(buf.data() + i);
        i += name.size() + 1;
        out->push_back(std::move(name));
      }
      return "";
    }
  }

  std::string GetXattr(const std::string& rel, const std::string& name, std::string* out) override {
    std::string p = Path(rel);
    for (;;) {
      ssize_t n = lgetxattr(p.c_str(), name.c_str(), nullptr, 0);
      if (n < 0) return fmt::format("lgetxattr: {}", strerror(errno));
      std::string v(n, '\0');
      ssize_t m = lgetxattr(p.c_str(), name.c_str(), v.data(), v.size());
      if (m < 0 && errno == ERANGE) continue;
      if (m < 0) return fmt::format("lgetxattr: {}", strerror(errno));
      v.resize(m);
      *out = std::move(v);
      return "";
    }
  }

  std::string Open(const std::string& rel, std::unique_ptr<Reader>* out) override {
    int fd = open(Path(rel).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return fmt::format("open: {}", strerror(errno));
    *out = std::make_unique<HostReader>(fd);
    return "";
  }

  bool ExactReaddir() const override { return false; }

 private:
  std::string root_;
};

// ------------------------------------------------------------ image side ---

std::string ShowId(const ubtrfs::InodeId& id) { return fmt::format("(root {}, ino {})", id.root, id.ino); }

class ImageReader : public Reader {
 public:
  ImageReader(ubtrfs::Filesystem& fs, ubtrfs::InodeId id) : fs_(fs), id_(id) {}
  std::string ReadFull(uint64_t offset, std::span<uint8_t> buf, size_t* n) override {
    size_t done = 0;
    while (done < buf.size()) {
      auto r = fs_.Read(id_, offset + done, buf.subspan(done));
      if (!r.ok()) {
        *n = done;
        return fmt::format("Read(offset {}, len {}): {}", offset + done, buf.size() - done, r.status().ToString());
      }
      if (*r == 0) break;
      if (*r > buf.size() - done) {
        *n = done;
        return fmt::format("Read(offset {}, len {}) returned {} > len", offset + done, buf.size() - done, *r);
      }
      done += *r;
    }
    *n = done;
    return "";
  }

 private:
  ubtrfs::Filesystem& fs_;
  ubtrfs::InodeId id_;
};

class ImageView : public View {
 public:
  ImageView(ubtrfs::Filesystem& fs, std::string base, const CompareOptions& o, Collector& c)
      : fs_(fs), base_(std::move(base)), o_(o), c_(c) {
    while (base_.size() > 1 && base_.back() == '/') base_.pop_back();
    if (base_.empty()) base_ = "/";
    auto info = fs_.Info();
    sectorsize_ = info.sectorsize ? info.sectorsize : 4096;
  }

  std::string Path(const std::string& rel) const {
    if (rel.empty()) return base_;
    return base_ == "/" ? "/" + rel : base_ + "/" + rel;
  }

  std::string Id(const std::string& rel, ubtrfs::InodeId* id) {
    auto it = ids_.find(rel);
    if (it != ids_.end()) {
      *id = it->second;
      return "";
    }
    auto r = fs_.Lookup(Path(rel));
    if (!r.ok()) return fmt::format("Lookup({}): {}", Printable(Path(rel), 300), r.status().ToString());
    *id = *r;
    ids_[rel] = *r;
    return "";
  }

  std::string Stat(const std::string& rel, Attr* a) override {
    ubtrfs::InodeId id;
    std::string e = Id(rel, &id);
    if (!e.empty()) return e;
    auto st = fs_.GetStat(id);
    if (!st.ok()) return fmt::format("GetStat{}: {}", ShowId(id), st.status().ToString());
    if (!(st->id == id))
      c_.Add(fmt::format("{}: GetStat{} returned Stat.id {}", ShowPath(rel), ShowId(id), ShowId(st->id)));
    a->mode = st->mode;
    a->nlink = st->nlink;
    a->uid = st->uid;
    a->gid = st->gid;
    a->rdev = st->rdev;
    a->size = st->size;
    a->nbytes = (st->nbytes + sectorsize_ - 1) / sectorsize_ * sectorsize_;
    a->ino = id.ino;
    a->atime = {st->atime.sec, st->atime.nsec};
    a->mtime = {st->mtime.sec, st->mtime.nsec};
    a->ctime = {st->ctime.sec, st->ctime.nsec};
    a->otime = {st->otime.sec, st->otime.nsec};
    a->has_otime = true;
    a->identity = {id.root, id.ino};
    if (o_.check_lookup_consistency) CheckLookups(rel, id, S_ISDIR(st->mode));
    return "";
  }

  void CheckLookups(const std::string& rel, const ubtrfs::InodeId& id, bool is_dir) {
    std::string path = Path(rel);
    if (is_dir) {
      std::string dot = path == "/" ? "/." : path + "/.";
      auto r = fs_.Lookup(dot);
      if (!r.ok() || !(*r == id))
        c_.Add(fmt::format("{}: Lookup(\"{}\") = {} but Lookup of the directory = {}", ShowPath(rel),
                           Printable(dot, 300), r.ok() ? ShowId(*r) : r.status().ToString(), ShowId(id)));
    }
    if (rel.empty()) return;
    size_t slash = rel.rfind('/');
    std::string parent_rel = slash == std::string::npos ? "" : rel.substr(0, slash);
    std::string name = slash == std::string::npos ? rel : rel.substr(slash + 1);
    ubtrfs::InodeId parent;
    if (!Id(parent_rel, &parent).empty()) return;
    auto lc = fs_.LookupChild(parent, name);
    if (!lc.ok() || !(*lc == id))
      c_.Add(fmt::format("{}: LookupChild({}, name) = {} but Lookup(path) = {}", ShowPath(rel), ShowId(parent),
                         lc.ok() ? ShowId(*lc) : lc.status().ToString(), ShowId(id)));
    if (is_dir) {
      std::string dotdot = path + "/..";
      auto r = fs_.Lookup(dotdot);
      if (!r.ok() || !(*r == parent))
        c_.Add(fmt::format("{}: Lookup(\"<dir>/..\") = {} but the parent is {}", ShowPath(rel),
                           r.ok() ? ShowId(*r) : r.status().ToString(), ShowId(parent)));
    }
  }

  std::string List(const std::string& rel, std::vector<Entry>* out) override {
    ubtrfs::InodeId id;
    std::string e = Id(rel, &id);
    if (!e.empty()) return e;
    auto r = fs_.ReadDir(id);
    if (!r.ok()) return fmt::format("ReadDir{}: {}", ShowId(id), r.status().ToString());
    std::set<std::string> seen;
    uint64_t last_index = 0;
    bool first = true;
    for (const auto& de : *r) {
      if (de.name == "." || de.name == "..")
        c_.Add(fmt::format("{}: ReadDir returned \"{}\"", ShowPath(rel), de.name));
      if (de.name.empty() || de.name.find('/') != std::string::npos || de.name.find('\0') != std::string::npos)
        c_.Add(fmt::format("{}: ReadDir returned invalid name \"{}\"", ShowPath(rel), Printable(de.name)));
      if (!seen.insert(de.name).second)
        c_.Add(fmt::format("{}: ReadDir returned \"{}\" twice", ShowPath(rel), Printable(de.name)));
      if (!first && de.index <= last_index)
        c_.Add(fmt::format("{}: ReadDir not in DIR_INDEX order: index {} after {} (\"{}\")", ShowPath(rel), de.index,
                           last_index, Printable(de.name)));
      first = false;
      last_index = de.index;
      Entry en;
      en.name = de.name;
      en.type = de.type;
      en.identity = {de.id.root, de.id.ino};
      en.index = de.index;
      out->push_back(std::move(en));
    }
    return "";
  }

  std::string ReadLink(const std::string& rel, std::string* out) override {
    ubtrfs::InodeId id;
    std::string e = Id(rel, &id);
    if (!e.empty()) return e;
    auto r = fs_.ReadLink(id);
    if (!r.ok()) return fmt::format("ReadLink{}: {}", ShowId(id), r.status().ToString());
    *out = *r;
    return "";
  }

  std::string ListXattr(const std::string& rel, std::vector<std::string>* out) override {
    ubtrfs::InodeId id;
    std::string e = Id(rel, &id);
    if (!e.empty()) return e;
    auto r = fs_.ListXattr(id);
    if (!r.ok()) return fmt::format("ListXattr{}: {}", ShowId(id), r.status().ToString());
    *out = *r;
    return "";
  }

  std::string GetXattr(const std::string& rel, const std::string& name, std::string* out) override {
    ubtrfs::InodeId id;
    std::string e = Id(rel, &id);
    if (!e.empty()) return e;
    auto r = fs_.GetXattr(id, name);
    if (!r.ok()) return fmt::format("GetXattr{}: {}", ShowId(id), r.status().ToString());
    *out = *r;
    return "";
  }

  std::string Open(const std::string& rel, std::unique_ptr<Reader>* out) override {
    ubtrfs::InodeId id;
    std::string e = Id(rel, &id);
    if (!e.empty()) return e;
    *out = std::make_unique<ImageReader>(fs_, id);
    return "";
  }

  bool ExactReaddir() const override { return true; }

 private:
  ubtrfs::Filesystem& fs_;
  std::string base_;
  const CompareOptions& o_;
  Collector& c_;
  uint32_t sectorsize_ = 4096;
  std::unordered_map<std::string, ubtrfs::InodeId> ids_;
};

// ------------------------------------------------------------ comparison ---

std::string ShowMode(uint32_t m) { return fmt::format("0{:o}", m); }

const char* TypeName(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "regular file";
    case S_IFDIR: return "directory";
    case S_IFLNK: return "symlink";
    case S_IFIFO: return "fifo";
    case S_IFSOCK: return "socket";
    case S_IFCHR: return "char device";
    case S_IFBLK: return "block device";
    default: return "unknown type";
  }
}

std::string ShowBytes(const std::string& v) {
  return fmt::format("{} bytes \"{}\"", v.size(), Printable(v, 80));
}

class Comparer {
 public:
  Comparer(View& a, View& b, const char* a_name, const char* b_name, const CompareOptions& o, Collector& c,
           CompareStats* stats)
      : a_(a), b_(b), an_(a_name), bn_(b_name), o_(o), c_(c), stats_(stats) {}

  void Run() { Node("", true, nullptr, nullptr); }
  bool stopped() const { return c_.full(); }

 private:
  void Add(const std::string& rel, const std::string& what) { c_.Add(fmt::format("{}: {}", ShowPath(rel), what)); }
  template <typename T>
  void Diff(const std::string& rel, const char* what, const T& av, const T& bv) {
    Add(rel, fmt::format("{} differs: {}={} {}={}", what, an_, av, bn_, bv));
  }

  void Node(const std::string& rel, bool top, const Entry* a_entry, const Entry* b_entry);
  void Attrs(const std::string& rel, bool top, const Attr& a, const Attr& b);
  void CheckIdentity(const std::string& rel, const Attr& a, const Attr& b);
  void Xattrs(const std::string& rel);
  void Data(const std::string& rel, uint64_t size);
  void Dir(const std::string& rel);

  View& a_;
  View& b_;
  const char* an_;
  const char* bn_;
  const CompareOptions& o_;
  Collector& c_;
  CompareStats* stats_;
  std::map<Identity, std::pair<Identity, std::string>> a_to_b_;  // a inode -> (b inode, first path)
  std::map<Identity, std::pair<Identity, std::string>> b_to_a_;
  std::vector<uint8_t> abuf_, bbuf_;
};

void Comparer::Node(const std::string& rel, bool top, const Entry* a_entry, const Entry* b_entry) {
  if (c_.full()) return;
  Attr a, b;
  std::string e = a_.Stat(rel, &a);
  if (!e.empty()) return Add(rel, fmt::format("cannot stat on {} side: {}", an_, e));
  e = b_.Stat(rel, &b);
  if (!e.empty()) return Add(rel, fmt::format("cannot stat on {} side: {}", bn_, e));
  if (stats_) ++stats_->entries;

  // readdir entry vs stat, on the side(s) where they must agree.
  auto check_entry = [&](View& v, const char* side, const Entry* en, const Attr& at) {
    if (!en) return;
    uint8_t want = static_cast<uint8_t>(IFTODT(at.mode));
    if (en->type != DT_UNKNOWN && en->type != want)
      Add(rel, fmt::format("{}: readdir type {} but stat says {} ({})", side, en->type, want, TypeName(at.mode)));
    if (v.ExactReaddir() && en->identity != at.identity)
      Add(rel, fmt::format("{}: readdir id (root {}, ino {}) but Lookup id (root {}, ino {})", side,
                           en->identity.first, en->identity.second, at.identity.first, at.identity.second));
  };
  check_entry(a_, an_, a_entry, a);
  check_entry(b_, bn_, b_entry, b);

  if ((a.mode & S_IFMT) != (b.mode & S_IFMT)) {
    if (o_.compare_type)
      Add(rel, fmt::format("type differs: {}={} {}={}", an_, TypeName(a.mode), bn_, TypeName(b.mode)));
    return;
  }
  Attrs(rel, top, a, b);
  // Directories have no hard links; the kernel gives every placeholder of a
  // subvolume inside a snapshot the same inode number, 2.
  if (o_.compare_hardlink_identity && !top && !S_ISDIR(a.mode)) CheckIdentity(rel, a, b);
  if (o_.compare_xattrs && (!top || o_.compare_top_attrs)) Xattrs(rel);
  if (S_ISREG(a.mode) && o_.compare_data) Data(rel, std::min(a.size, b.size));
  if (S_ISLNK(a.mode) && o_.compare_symlinks) {
    std::string at, bt;
    std::string ea = a_.ReadLink(rel, &at), eb = b_.ReadLink(rel, &bt);
    if (!ea.empty()) Add(rel, fmt::format("{}: {}", an_, ea));
    else if (!eb.empty()) Add(rel, fmt::format("{}: {}", bn_, eb));
    else if (at != bt) Add(rel, fmt::format("symlink target differs: {}={} {}={}", an_, ShowBytes(at), bn_, ShowBytes(bt)));
  }
  if (S_ISDIR(a.mode)) Dir(rel);
}

void Comparer::Attrs(const std::string& rel, bool top, const Attr& a, const Attr& b) {
  bool is_dir = S_ISDIR(a.mode), is_lnk = S_ISLNK(a.mode);
  bool attrs = !top || o_.compare_top_attrs;
  if (attrs && o_.compare_mode && (a.mode & 07777) != (b.mode & 07777))
    Diff(rel, "mode", ShowMode(a.mode), ShowMode(b.mode));
  if (attrs && o_.compare_owner) {
    if (a.uid != b.uid) Diff(rel, "uid", a.uid, b.uid);
    if (a.gid != b.gid) Diff(rel, "gid", a.gid, b.gid);
  }
  if (is_dir ? o_.compare_dir_nlink : o_.compare_nlink) {
    if (a.nlink != b.nlink) Diff(rel, "nlink", a.nlink, b.nlink);
  }
  if (is_dir ? o_.compare_dir_size : o_.compare_size) {
    if (a.size != b.size) Diff(rel, "size", a.size, b.size);
  }
  if (o_.compare_rdev && (S_ISCHR(a.mode) || S_ISBLK(a.mode)) && a.rdev != b.rdev)
    Diff(rel, "rdev", fmt::format("{}:{} (0x{:x})", major(a.rdev), minor(a.rdev), a.rdev),
         fmt::format("{}:{} (0x{:x})", major(b.rdev), minor(b.rdev), b.rdev));
  bool times = attrs && !(o_.skip_times && o_.skip_times(rel));
  auto teq = [&](const Ts& x, const Ts& y) { return x.sec == y.sec && (!o_.compare_time_nsec || x.nsec == y.nsec); };
  bool mtime = o_.compare_mtime && (!is_dir || o_.compare_dir_mtime) && (!is_lnk || o_.compare_symlink_mtime);
  if (times && mtime && !teq(a.mtime, b.mtime)) Diff(rel, "mtime", Show(a.mtime), Show(b.mtime));
  if (times && o_.compare_ctime && !teq(a.ctime, b.ctime)) Diff(rel, "ctime", Show(a.ctime), Show(b.ctime));
  if (times && o_.compare_atime && !teq(a.atime, b.atime)) Diff(rel, "atime", Show(a.atime), Show(b.atime));
  if (times && o_.compare_otime && a.has_otime && b.has_otime && !teq(a.otime, b.otime))
    Diff(rel, "otime (btime)", Show(a.otime), Show(b.otime));
  if (o_.compare_inode_numbers && a.ino != b.ino) Diff(rel, "inode number", a.ino, b.ino);
  if (o_.compare_nbytes && !is_dir && a.nbytes != b.nbytes)
    Diff(rel, "allocated bytes (st_blocks*512 vs nbytes rounded up to a sector)", a.nbytes, b.nbytes);
}

void Comparer::CheckIdentity(const std::string& rel, const Attr& a, const Attr& b) {
  auto [ait, a_new] = a_to_b_.emplace(a.identity, std::make_pair(b.identity, rel));
  auto [bit, b_new] = b_to_a_.emplace(b.identity, std::make_pair(a.identity, rel));
  if (!a_new && ait->second.first != b.identity)
    Add(rel, fmt::format("hard link to {} on {} side (same inode), but a different inode on {} side: "
                         "({}, {}) vs ({}, {})",
                         ShowPath(ait->second.second), an_, bn_, ait->second.first.first, ait->second.first.second,
                         b.identity.first, b.identity.second));
  if (!b_new && bit->second.first != a.identity)
    Add(rel, fmt::format("same inode ({}, {}) as {} on {} side, but distinct inodes on {} side", b.identity.first,
                         b.identity.second, ShowPath(bit->second.second), bn_, an_));
}

void Comparer::Xattrs(const std::string& rel) {
  std::vector<std::string> al, bl;
  std::string e = a_.ListXattr(rel, &al);
  if (!e.empty()) return Add(rel, fmt::format("{}: {}", an_, e));
  e = b_.ListXattr(rel, &bl);
  if (!e.empty()) return Add(rel, fmt::format("{}: {}", bn_, e));
  auto ignored = [&](const std::string& n) {
    for (const auto& p : o_.ignore_xattr_prefixes)
      if (n.compare(0, p.size(), p) == 0) return true;
    return false;
  };
  std::set<std::string> as, bs;
  for (const auto& n : al)
    if (!ignored(n)) as.insert(n);
  for (const auto& n : bl) {
    if (ignored(n)) continue;
    if (!bs.insert(n).second) Add(rel, fmt::format("xattr \"{}\" listed twice on {} side", Printable(n), bn_));
  }
  for (const auto& n : o_.source_only_xattrs)
    if (as.count(n) && !bs.count(n)) as.erase(n);
  for (const auto& n : as) {
    if (!bs.count(n)) {
      std::string v;
      std::string ev = a_.GetXattr(rel, n, &v);
      Add(rel, fmt::format("xattr \"{}\" missing on {} side ({} value: {})", Printable(n), bn_, an_,
                           ev.empty() ? ShowBytes(v) : ev));
      continue;
    }
    std::string av, bv;
    std::string ea = a_.GetXattr(rel, n, &av), eb = b_.GetXattr(rel, n, &bv);
    if (!ea.empty()) Add(rel, fmt::format("xattr \"{}\": {}: {}", Printable(n), an_, ea));
    else if (!eb.empty()) Add(rel, fmt::format("xattr \"{}\": {}: {}", Printable(n), bn_, eb));
    else if (av != bv)
      Add(rel, fmt::format("xattr \"{}\" value differs: {}={} {}={}", Printable(n), an_, ShowBytes(av), bn_,
                           ShowBytes(bv)));
  }
  for (const auto& n : bs)
    if (!as.count(n)) {
      std::string v;
      std::string ev = b_.GetXattr(rel, n, &v);
      Add(rel, fmt::format("extra xattr \"{}\" on {} side (value: {})", Printable(n), bn_, ev.empty() ? ShowBytes(v) : ev));
    }
}

void Comparer::Data(const std::string& rel, uint64_t size) {
  std::unique_ptr<Reader> ar, br;
  std::string e = a_.Open(rel, &ar);
  if (!e.empty()) return Add(rel, fmt::format("{}: {}", an_, e));
  e = b_.Open(rel, &br);
  if (!e.empty()) return Add(rel, fmt::format("{}: {}", bn_, e));
  if (stats_) ++stats_->files_read;
  uint64_t x = o_.read_seed * 0x9E3779B97F4A7C15ull + std::hash<std::string>()(rel);
  auto rnd = [&]() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  // Compares [off, off+len) on both sides; false after reporting a mismatch.
  auto compare = [&](uint64_t off, size_t len) -> bool {
    if (abuf_.size() < len) abuf_.resize(len);
    if (bbuf_.size() < len) bbuf_.resize(len);
    size_t an = 0, bn = 0;
    std::string ea = ar->ReadFull(off, std::span<uint8_t>(abuf_.data(), len), &an);
    if (!ea.empty()) {
      Add(rel, fmt::format("{}: {}", an_, ea));
      return false;
    }
    std::string eb = br->ReadFull(off, std::span<uint8_t>(bbuf_.data(), len), &bn);
    if (!eb.empty()) {
      Add(rel, fmt::format("{}: {}", bn_, eb));
      return false;
    }
    if (stats_) stats_->bytes_read += bn;
    if (an != bn) {
      Add(rel, fmt::format("read at offset {} length {}: {} returned {} bytes, {} returned {}", off, len, an_, an,
                           bn_, bn));
      return false;
    }
    if (memcmp(abuf_.data(), bbuf_.data(), an) != 0) {
      size_t i = 0;
      while (abuf_[i] == bbuf_[i]) ++i;
      size_t ndiff = 0, last = i;
      for (size_t j = i; j < an; ++j)
        if (abuf_[j] != bbuf_[j]) ++ndiff, last = j;
      size_t show = std::min<size_t>(16, an - i);
      std::string as, bs;
      for (size_t j = 0; j < show; ++j) {
        as += fmt::format("{:02x}", abuf_[i + j]);
        bs += fmt::format("{:02x}", bbuf_[i + j]);
      }
      Add(rel, fmt::format("data differs at file offset {} (read at {} length {}; {} bytes differ up to offset {}): "
                           "{}={} {}={}",
                           off + i, off, len, ndiff, off + last, an_, as, bn_, bs));
      return false;
    }
    return true;
  };
  // Sequential pass with varied chunk sizes (so offsets drift off alignment).
  static const size_t kSmall[] = {1, 3, 511, 512, 4095, 4096, 4097, 8191};
  uint64_t off = 0;
  while (off < size) {
    size_t len;
    uint64_t r = rnd() % 100;
    if (r < 12) len = kSmall[rnd() % 8];
    else if (r < 30) len = 4096 * (1 + rnd() % 32);
    else if (r < 40) len = 1 << 20;
    else len = 1 + rnd() % 300000;
    len = static_cast<size_t>(std::min<uint64_t>(len, size - off + (rnd() % 3 == 0 ? 4096 : 0)));
    if (len == 0) len = 1;
    if (!compare(off, len)) return;
    off += len;
  }
  // Reads at and beyond EOF return nothing; a few random unaligned reads.
  if (!compare(size, 4096) || !compare(size + 12345, 100)) return;
  for (int i = 0; i < 4 && size > 0; ++i) {
    uint64_t o = rnd() % size;
    if (!compare(o, 1 + rnd() % 200000)) return;
  }
}

void Comparer::Dir(const std::string& rel) {
  std::vector<Entry> al, bl;
  std::string e = a_.List(rel, &al);
  if (!e.empty()) return Add(rel, fmt::format("{}: {}", an_, e));
  e = b_.List(rel, &bl);
  if (!e.empty()) return Add(rel, fmt::format("{}: {}", bn_, e));
  std::map<std::string, const Entry*> am, bm;
  for (const auto& en : al) am[en.name] = &en;
  for (const auto& en : bl) bm.emplace(en.name, &en);
  for (const auto& [n, en] : am)
    if (!bm.count(n)) Add(Join(rel, n), fmt::format("missing on {} side", bn_));
  for (const auto& [n, en] : bm)
    if (!am.count(n)) Add(Join(rel, n), fmt::format("extra entry on {} side (not on {} side)", bn_, an_));
  if (o_.compare_readdir_order && al.size() == bl.size()) {
    for (size_t i = 0; i < al.size(); ++i) {
      if (al[i].name != bl[i].name) {
        Add(rel, fmt::format("readdir order differs at position {}: {}=\"{}\" {}=\"{}\"", i, an_,
                             Printable(al[i].name), bn_, Printable(bl[i].name)));
        break;
      }
    }
  }
  for (const auto& [n, en] : am) {
    auto it = bm.find(n);
    if (it == bm.end()) continue;
    if (c_.full()) return;
    Node(Join(rel, n), false, en, it->second);
  }
}

}  // namespace

CompareOptions KernelMountCompareOptions() {
  CompareOptions o;
  o.compare_dir_nlink = true;
  o.compare_dir_size = true;
  o.compare_ctime = true;
  o.compare_atime = true;
  o.compare_otime = true;
  o.compare_inode_numbers = true;
  o.compare_nbytes = true;
  o.compare_readdir_order = true;
  o.source_only_xattrs.clear();
  return o;
}

std::vector<std::string> CompareTreeToImage(const std::string& source_dir, ubtrfs::Filesystem& fs,
                                            const CompareOptions& options, const std::string& image_dir,
                                            CompareStats* stats) {
  Collector c(options.max_mismatches);
  HostView a(source_dir);
  ImageView b(fs, image_dir, options, c);
  Comparer cmp(a, b, "source", "image", options, c, stats);
  cmp.Run();
  return c.Finish(cmp.stopped());
}

std::vector<std::string> CompareHostTrees(const std::string& a_dir, const std::string& b_dir,
                                          const CompareOptions& options, CompareStats* stats) {
  CompareOptions o = options;
  o.compare_ctime = false;
  o.compare_atime = false;
  o.compare_otime = false;
  o.compare_inode_numbers = false;
  o.compare_readdir_order = false;
  Collector c(o.max_mismatches);
  HostView a(a_dir), b(b_dir);
  Comparer cmp(a, b, "a", "b", o, c, stats);
  cmp.Run();
  return c.Finish(cmp.stopped());
}

std::string FormatMismatches(const std::vector<std::string>& mismatches) {
  std::string r = fmt::format("{} mismatch(es):\n", mismatches.size());
  for (const auto& m : mismatches) r += "  - " + m + "\n";
  return r;
}

}  // namespace ubtrfs_test
