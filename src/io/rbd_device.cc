#include "io/rbd_device.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>

#include "io/ceph_library.h"

namespace ubtrfs::io {

std::string RbdSpec::Name() const {
  std::string n = std::string(kRbdPrefix) + pool + "/";
  if (!ns.empty()) n += ns + "/";
  n += image;
  if (!snap.empty()) n += "@" + snap;
  return n;
}

Result<RbdSpec> ParseRbdSpec(std::string_view text) {
  const std::string whole(text);
  if (!IsRbdPath(text)) return Status::Invalid(whole + ": not an rbd: path");
  const auto bad = [&](const std::string& why) {
    return Status::Invalid(whole + ": " + why + " (expected rbd:POOL/IMAGE[@SNAP][:KEY=VALUE...])");
  };
  // Split on unescaped ':'; within a piece keep the unescaped '/', '@' and
  // '=' apart from escaped ones by remembering their positions.
  struct Piece {
    std::string text;
    std::vector<size_t> slashes, ats, equals;
  };
  std::vector<Piece> pieces(1);
  for (size_t i = kRbdPrefix.size(); i < text.size(); ++i) {
    char c = text[i];
    Piece& p = pieces.back();
    if (c == '\\') {
      if (i + 1 == text.size()) return bad("a trailing '\\'");
      p.text += text[++i];
      continue;
    }
    if (c == ':') {
      pieces.emplace_back();
      continue;
    }
    if (c == '/') p.slashes.push_back(p.text.size());
    if (c == '@') p.ats.push_back(p.text.size());
    if (c == '=') p.equals.push_back(p.text.size());
    p.text += c;
  }
  RbdSpec s;
  const Piece& name = pieces[0];
  std::string path = name.text;
  if (name.ats.size() > 1) return bad("more than one '@'");
  if (!name.ats.empty()) {
    if (!name.slashes.empty() && name.ats[0] < name.slashes.back()) return bad("'@SNAP' must follow the image");
    s.snap = path.substr(name.ats[0] + 1);
    path.resize(name.ats[0]);
    if (s.snap.empty()) return bad("an empty snapshot name");
  }
  if (name.slashes.empty()) return bad("no pool");
  if (name.slashes.size() > 2) return bad("too many '/'");
  s.pool = path.substr(0, name.slashes[0]);
  if (name.slashes.size() == 2) {
    s.ns = path.substr(name.slashes[0] + 1, name.slashes[1] - name.slashes[0] - 1);
    s.image = path.substr(name.slashes[1] + 1);
    if (s.ns.empty()) return bad("an empty namespace");
  } else {
    s.image = path.substr(name.slashes[0] + 1);
  }
  if (s.pool.empty()) return bad("an empty pool name");
  if (s.image.empty()) return bad("an empty image name");
  for (size_t i = 1; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (p.equals.empty()) return bad("option '" + p.text + "' is not KEY=VALUE");
    std::string key = p.text.substr(0, p.equals[0]);
    std::string value = p.text.substr(p.equals[0] + 1);
    if (key.empty()) return bad("an option with no name");
    if (key == "conf") {
      s.conf = value;
    } else if (key == "id") {
      s.id = value;
    } else if (key == "keyring") {
      s.keyring = value;
    } else {
      s.options.emplace_back(std::move(key), std::move(value));
    }
  }
  return s;
}

#ifndef UBTRFS_HAVE_RBD

bool RbdSupported() { return false; }

namespace {
Status NoRbd(const std::string& spec) {
  return Status::Error(EOPNOTSUPP, spec + ": this ubtrfs was built without Ceph RBD support (install librbd-dev "
                                          "and librados-dev and rebuild)");
}
}  // namespace

Result<std::unique_ptr<BlockDevice>> OpenRbdDevice(const std::string& spec, OpenFlags) { return NoRbd(spec); }
Result<std::optional<uint64_t>> RbdImageSize(const std::string& spec) { return NoRbd(spec); }
Status CreateRbdImage(const std::string& spec, uint64_t) { return NoRbd(spec); }
Status ResizeRbdImage(const std::string& spec, uint64_t) { return NoRbd(spec); }
Status RemoveRbdImage(const std::string& spec) { return NoRbd(spec); }

#else

bool RbdSupported() { return LoadCephLibrary().ok(); }

namespace {

// The loaded libraries: valid once Connection::Open has loaded them, which
// every way to a device or an image goes through first.
const CephLibrary& Ceph() { return *LoadCephLibrary().value(); }

std::string Errno(int e) { return std::strerror(e < 0 ? -e : e); }
Status Fail(int r, const std::string& message) { return Status::Error(r < 0 ? -r : r, message + ": " + Errno(r)); }

// Bounds on what a down or unreachable cluster can cost: librados' own
// defaults wait 300 s to connect and forever for a monitor or OSD answer.
// Options in the spec (and the conf file's settings, for those it names
// below the spec) override them.
constexpr const char* kDefaults[][2] = {
    {"client_mount_timeout", "15"},
    {"rados_mon_op_timeout", "30"},
    {"rados_osd_op_timeout", "60"},
    // The device keeps its own writes in flight and the filesystem caches
    // what it reads; librbd's cache would be a second copy of both.
    {"rbd_cache", "false"},
};

std::string ConfGet(rados_t c, const char* key) {
  char buf[256];
  if (Ceph().rados_conf_get(c, key, buf, sizeof buf) != 0) return "?";
  return buf;
}

// One cluster connection and the pool's I/O context.
class Connection {
 public:
  ~Connection() {
    if (io_) Ceph().rados_ioctx_destroy(io_);
    if (cluster_) Ceph().rados_shutdown(cluster_);
  }
  rados_ioctx_t io() const { return io_; }

  static Result<std::unique_ptr<Connection>> Open(const RbdSpec& s) {
    UB_RETURN_IF_ERROR(LoadCephLibrary().status());
    auto c = std::make_unique<Connection>();
    const std::string name = s.Name();
    int r = Ceph().rados_create(&c->cluster_, s.id.empty() ? nullptr : s.id.c_str());
    if (r < 0) return Fail(r, name + ": rados_create");
    for (const auto& kv : kDefaults) Ceph().rados_conf_set(c->cluster_, kv[0], kv[1]);
    if (!s.conf.empty()) {
      r = Ceph().rados_conf_read_file(c->cluster_, s.conf.c_str());
      if (r < 0) return Fail(r, name + ": cannot read the Ceph configuration " + s.conf);
    } else {
      // The usual search ($CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config,
      // ./ceph.conf); none found leaves mon_host empty, which connect names.
      (void)Ceph().rados_conf_read_file(c->cluster_, nullptr);
    }
    r = Ceph().rados_conf_parse_env(c->cluster_, nullptr);
    if (r < 0) return Fail(r, name + ": CEPH_ARGS");
    if (!s.keyring.empty()) {
      r = Ceph().rados_conf_set(c->cluster_, "keyring", s.keyring.c_str());
      if (r < 0) return Fail(r, name + ": keyring=" + s.keyring);
    }
    for (const auto& [k, v] : s.options) {
      r = Ceph().rados_conf_set(c->cluster_, k.c_str(), v.c_str());
      if (r == -ENOENT) return Status::Invalid(name + ": '" + k + "' is not a Ceph option");
      if (r < 0) return Fail(r, name + ": " + k + "=" + v);
    }
    const std::string mons = ConfGet(c->cluster_, "mon_host");
    if (mons.empty()) {
      return Status::Error(ENOENT, name + ": no Ceph monitor address: give :conf=PATH (a ceph.conf), :mon_host=ADDR, "
                                          "or set CEPH_CONF");
    }
    r = Ceph().rados_connect(c->cluster_);
    if (r < 0) {
      std::string why = name + ": cannot connect to the Ceph cluster at " + mons;
      if (!s.conf.empty()) why += " (conf " + s.conf + ")";
      if (r == -ETIMEDOUT) why += " within client_mount_timeout=" + ConfGet(c->cluster_, "client_mount_timeout") + " s";
      return Fail(r, why);
    }
    r = Ceph().rados_ioctx_create(c->cluster_, s.pool.c_str(), &c->io_);
    if (r == -ENOENT) return Status::NotFound(name + ": the cluster has no pool '" + s.pool + "'");
    if (r < 0) return Fail(r, name + ": pool " + s.pool);
    if (!s.ns.empty()) Ceph().rados_ioctx_set_namespace(c->io_, s.ns.c_str());
    return c;
  }

 private:
  rados_t cluster_ = nullptr;
  rados_ioctx_t io_ = nullptr;
};

// Set UBTRFS_RBD_SYNC_WRITES=1 to write synchronously, one round trip per
// write (the benchmark's comparison).
bool SyncWrites() {
  const char* v = std::getenv("UBTRFS_RBD_SYNC_WRITES");
  return v && *v && std::strcmp(v, "0") != 0;
}

class RbdDevice final : public BlockDevice {
 public:
  RbdDevice(std::unique_ptr<Connection> conn, rbd_image_t image, std::string name, uint64_t size, bool writable)
      : conn_(std::move(conn)), image_(image), name_(std::move(name)), size_(size), writable_(writable),
        sync_(SyncWrites()) {}

  ~RbdDevice() override {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return AllDoneLocked(); });
      ReapLocked();
    }
    if (!cookie_.empty()) Ceph().rbd_unlock(image_, cookie_.c_str());
    Ceph().rbd_close(image_);  // releases the exclusive lock
  }

  // Takes the writer's lock: the exclusive-lock feature's lock, acquired
  // explicitly so that librbd does not hand it to another client that asks
  // (its default for a lock taken by a write), or an advisory lock.
  Status Lock() {
    uint64_t features = 0;
    int r = Ceph().rbd_get_features(image_, &features);
    if (r < 0) return Fail(r, name_ + ": reading the image's features");
    if (features & RBD_FEATURE_EXCLUSIVE_LOCK) {
      r = Ceph().rbd_lock_acquire(image_, RBD_LOCK_MODE_EXCLUSIVE);
      // (librbd answers EROFS when the owner refuses to hand the lock over)
      if (r == -EROFS || r == -EBUSY) {
        return Status::Error(EBUSY, name_ + ": in use: another client holds its exclusive lock" + Owners() +
                                        " (another read-write ubtrfs or a VM; read-only opens work)");
      }
      if (r < 0) return Fail(r, name_ + ": taking the exclusive lock");
      return Status::Ok();
    }
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string cookie = std::string("ubtrfs ") + host + " " + std::to_string(::getpid());
    r = Ceph().rbd_lock_exclusive(image_, cookie.c_str());
    if (r == -EBUSY || r == -EEXIST) {
      return Status::Error(EBUSY, name_ + ": in use: it holds an advisory lock of another client (`rbd lock ls` "
                                          "names it; `rbd lock rm` frees it if that client is gone)");
    }
    if (r < 0) return Fail(r, name_ + ": taking an advisory lock");
    cookie_ = std::move(cookie);
    return Status::Ok();
  }

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    if (offset > size_ || buf.size() > size_ - offset) {
      return Status::IoError(name_ + ": read of " + std::to_string(buf.size()) + " bytes at offset " +
                             std::to_string(offset) + " is past the end of the image (" + std::to_string(size_) +
                             " bytes)");
    }
    {
      // librbd does not promise that a read sees a write still in flight.
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !OverlapsLocked(offset, buf.size()); });
    }
    size_t done = 0;
    while (done < buf.size()) {
      const size_t n = std::min<size_t>(buf.size() - done, size_t{64} << 20);
      ssize_t r = Ceph().rbd_read(image_, offset + done, n, reinterpret_cast<char*>(buf.data() + done));
      if (r < 0) return Fail(static_cast<int>(r), name_ + ": read at offset " + std::to_string(offset + done));
      if (r == 0) return Status::IoError(name_ + ": short read at offset " + std::to_string(offset + done));
      done += static_cast<size_t>(r);
    }
    return Status::Ok();
  }

  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    std::vector<uint8_t> copy(buf.begin(), buf.end());
    return Submit(offset, std::move(copy));
  }

  Status WriteGather(uint64_t offset, std::span<const std::span<const uint8_t>> pieces) override {
    size_t total = 0;
    for (const auto& p : pieces) total += p.size();
    std::vector<uint8_t> joined;
    joined.reserve(total);
    for (const auto& p : pieces) joined.insert(joined.end(), p.begin(), p.end());
    return Submit(offset, std::move(joined));
  }

  Status Flush() override {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return AllDoneLocked(); });
      ReapLocked();
      if (!error_.ok()) return error_;
    }
    int r = Ceph().rbd_flush(image_);
    if (r < 0) {
      std::lock_guard lock(mu_);
      if (error_.ok()) error_ = Fail(r, name_ + ": rbd_flush");
      return error_;
    }
    return Status::Ok();
  }

  uint64_t Size() const override { return size_; }
  std::string Name() const override { return name_; }

 private:
  struct Op {
    RbdDevice* dev = nullptr;
    rbd_completion_t completion = nullptr;
    uint64_t offset = 0;
    std::vector<uint8_t> bytes;
    bool done = false;
  };

  // Ops in flight at most, and their bytes: enough to keep a commit's 1 MiB
  // gathered writes streaming to every OSD, bounded in memory.
  static constexpr size_t kMaxOps = 128;
  static constexpr size_t kMaxBytes = size_t{128} << 20;

  static void OnComplete(rbd_completion_t, void* arg) {
    Op* op = static_cast<Op*>(arg);
    RbdDevice* dev = op->dev;
    std::lock_guard lock(dev->mu_);
    op->done = true;
    // Under the lock: the device (and its cv_) may go as soon as it is released.
    dev->cv_.notify_all();
  }

  bool AllDoneLocked() const {
    return std::all_of(ops_.begin(), ops_.end(), [](const auto& op) { return op->done; });
  }

  bool OverlapsLocked(uint64_t offset, uint64_t len) const {
    for (const auto& op : ops_) {
      if (!op->done && op->offset < offset + len && offset < op->offset + op->bytes.size()) return true;
    }
    return false;
  }

  // Collects finished ops: the first error stays, so that every later
  // Flush fails too (the bytes of the failed write are not on the image).
  void ReapLocked() {
    for (auto it = ops_.begin(); it != ops_.end();) {
      Op& op = **it;
      if (!op.done) {
        ++it;
        continue;
      }
      ssize_t r = Ceph().rbd_aio_get_return_value(op.completion);
      if (r < 0 && error_.ok()) {
        error_ = Fail(static_cast<int>(r), name_ + ": write of " + std::to_string(op.bytes.size()) +
                                               " bytes at offset " + std::to_string(op.offset));
      }
      Ceph().rbd_aio_release(op.completion);
      in_flight_bytes_ -= op.bytes.size();
      it = ops_.erase(it);
    }
  }

  Status Submit(uint64_t offset, std::vector<uint8_t> bytes) {
    if (!writable_) return Status::Error(EROFS, name_ + ": opened read-only");
    if (offset > size_ || bytes.size() > size_ - offset) {
      return Status::Error(ENOSPC, name_ + ": write of " + std::to_string(bytes.size()) + " bytes at offset " +
                                       std::to_string(offset) + " is past the end of the image (" +
                                       std::to_string(size_) + " bytes)");
    }
    if (bytes.empty()) return Status::Ok();
    if (sync_) {
      ssize_t r = Ceph().rbd_write(image_, offset, bytes.size(), reinterpret_cast<const char*>(bytes.data()));
      if (r < 0) return Fail(static_cast<int>(r), name_ + ": write at offset " + std::to_string(offset));
      return Status::Ok();
    }
    const uint64_t len = bytes.size();
    auto op = std::make_unique<Op>();
    op->dev = this;
    op->offset = offset;
    op->bytes = std::move(bytes);
    Op* raw = op.get();
    {
      std::unique_lock lock(mu_);
      // Writes to a range still in flight wait for it: librbd does not
      // order overlapping requests.
      cv_.wait(lock, [&] {
        ReapLocked();
        return !OverlapsLocked(offset, len) &&
               (ops_.empty() || (ops_.size() < kMaxOps && in_flight_bytes_ + len <= kMaxBytes));
      });
      if (!error_.ok()) return error_;
      int r = Ceph().rbd_aio_create_completion(raw, &RbdDevice::OnComplete, &raw->completion);
      if (r < 0) return Fail(r, name_ + ": rbd_aio_create_completion");
      in_flight_bytes_ += len;
      ops_.push_back(std::move(op));
    }
    // Not under mu_: librbd may complete (and call OnComplete) before it returns.
    int r = Ceph().rbd_aio_write(image_, offset, len, reinterpret_cast<const char*>(raw->bytes.data()), raw->completion);
    if (r < 0) {
      std::lock_guard lock(mu_);
      // Never started, so no callback comes: take it out here.
      auto it = std::find_if(ops_.begin(), ops_.end(), [&](const auto& o) { return o.get() == raw; });
      Ceph().rbd_aio_release(raw->completion);
      in_flight_bytes_ -= len;
      ops_.erase(it);
      Status st = Fail(r, name_ + ": write at offset " + std::to_string(offset));
      if (error_.ok()) error_ = st;
      cv_.notify_all();
      return st;
    }
    return Status::Ok();
  }

  std::string Owners() {
    rbd_lock_mode_t mode;
    char* owners[8] = {};
    size_t n = 8;
    if (Ceph().rbd_lock_get_owners(image_, &mode, owners, &n) < 0 || n == 0) return "";
    std::string out = " (";
    for (size_t i = 0; i < n; ++i) out += (i ? ", " : "") + std::string(owners[i]);
    Ceph().rbd_lock_get_owners_cleanup(owners, n);
    return out + ")";
  }

  std::unique_ptr<Connection> conn_;
  rbd_image_t image_;
  std::string name_;
  uint64_t size_;
  bool writable_;
  bool sync_;
  std::string cookie_;  // the advisory lock's, when it holds one

  std::mutex mu_;
  std::condition_variable cv_;
  std::list<std::unique_ptr<Op>> ops_;
  uint64_t in_flight_bytes_ = 0;
  Status error_;
};

Result<std::pair<RbdSpec, std::unique_ptr<Connection>>> Connect(const std::string& text) {
  UB_ASSIGN_OR_RETURN(RbdSpec spec, ParseRbdSpec(text));
  UB_ASSIGN_OR_RETURN(auto conn, Connection::Open(spec));
  return std::pair{std::move(spec), std::move(conn)};
}

}  // namespace

Result<std::unique_ptr<BlockDevice>> OpenRbdDevice(const std::string& text, OpenFlags flags) {
  UB_ASSIGN_OR_RETURN(RbdSpec spec, ParseRbdSpec(text));
  if (flags.writable && !spec.snap.empty()) {
    return Status::Error(EROFS, spec.Name() + ": a snapshot is read-only");
  }
  UB_ASSIGN_OR_RETURN(auto conn, Connection::Open(spec));
  const std::string name = spec.Name();
  rbd_image_t image = nullptr;
  const char* snap = spec.snap.empty() ? nullptr : spec.snap.c_str();
  // Read-only opens neither watch the header for writers nor lock: any
  // number of them may run beside the one writer (as QEMU's read-only).
  int r = flags.writable ? Ceph().rbd_open(conn->io(), spec.image.c_str(), &image, nullptr)
                         : Ceph().rbd_open_read_only(conn->io(), spec.image.c_str(), &image, snap);
  if (r == -ENOENT) {
    return Status::NotFound(name + ": no such " + (snap ? "image or snapshot" : "image") + " in pool " + spec.pool);
  }
  if (r < 0) return Fail(r, name + ": cannot open");
  uint64_t size = 0;
  r = Ceph().rbd_get_size(image, &size);
  if (r < 0) {
    Ceph().rbd_close(image);
    return Fail(r, name + ": size");
  }
  auto dev = std::make_unique<RbdDevice>(std::move(conn), image, name, size, flags.writable);
  if (flags.writable) UB_RETURN_IF_ERROR(dev->Lock());
  return std::unique_ptr<BlockDevice>(std::move(dev));
}

Result<std::optional<uint64_t>> RbdImageSize(const std::string& text) {
  UB_ASSIGN_OR_RETURN(auto sc, Connect(text));
  auto& [spec, conn] = sc;
  rbd_image_t image = nullptr;
  int r = Ceph().rbd_open_read_only(conn->io(), spec.image.c_str(), &image, spec.snap.empty() ? nullptr : spec.snap.c_str());
  if (r == -ENOENT) return std::optional<uint64_t>();
  if (r < 0) return Fail(r, spec.Name() + ": cannot open");
  uint64_t size = 0;
  r = Ceph().rbd_get_size(image, &size);
  Ceph().rbd_close(image);
  if (r < 0) return Fail(r, spec.Name() + ": size");
  return std::optional<uint64_t>(size);
}

Status CreateRbdImage(const std::string& text, uint64_t bytes) {
  UB_ASSIGN_OR_RETURN(auto sc, Connect(text));
  auto& [spec, conn] = sc;
  if (!spec.snap.empty()) return Status::Invalid(spec.Name() + ": cannot create a snapshot");
  rbd_image_options_t opts;
  Ceph().rbd_image_options_create(&opts);
  int r = Ceph().rbd_create4(conn->io(), spec.image.c_str(), bytes, opts);
  Ceph().rbd_image_options_destroy(opts);
  if (r < 0) return Fail(r, spec.Name() + ": cannot create an image of " + std::to_string(bytes) + " bytes");
  return Status::Ok();
}

Status ResizeRbdImage(const std::string& text, uint64_t bytes) {
  UB_ASSIGN_OR_RETURN(auto sc, Connect(text));
  auto& [spec, conn] = sc;
  rbd_image_t image = nullptr;
  int r = Ceph().rbd_open(conn->io(), spec.image.c_str(), &image, nullptr);
  if (r < 0) return Fail(r, spec.Name() + ": cannot open");
  r = Ceph().rbd_resize(image, bytes);
  Ceph().rbd_close(image);
  if (r < 0) return Fail(r, spec.Name() + ": cannot resize to " + std::to_string(bytes) + " bytes");
  return Status::Ok();
}

Status RemoveRbdImage(const std::string& text) {
  UB_ASSIGN_OR_RETURN(auto sc, Connect(text));
  auto& [spec, conn] = sc;
  int r = Ceph().rbd_remove(conn->io(), spec.image.c_str());
  if (r < 0) return Fail(r, spec.Name() + ": cannot remove");
  return Status::Ok();
}

#endif  // UBTRFS_HAVE_RBD

Result<std::unique_ptr<BlockDevice>> OpenDevice(const std::string& path, OpenFlags flags) {
  if (IsRbdPath(path)) return OpenRbdDevice(path, flags);
  return OpenFileDevice(path, flags);
}

}  // namespace ubtrfs::io
