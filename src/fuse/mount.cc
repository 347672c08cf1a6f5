#include "fuse/mount.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>

#include "fuse/adapter.h"
#include "fuse/readahead.h"
#include "ubtrfs/devices.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::fuse {
namespace {

std::atomic<bool> g_daemonized{false};

// Messages after the mount: stderr in the foreground, syslog once daemonized
// (stdio then points at /dev/null).
void Log(const std::string& msg) {
  if (g_daemonized.load()) {
    syslog(LOG_ERR, "%s", msg.c_str());
  } else {
    fmt::print(stderr, "ubtrfs: mount: {}\n", msg);
  }
}

struct Parsed {
  bool read_only = false;
  unsigned commit_seconds = 30;
  unsigned threads = 0;  // 0 = DefaultThreads()
  unsigned readahead_kib = 4096;  // readahead=KiB; 0 keeps the kernel's (readahead.h)
  bool readahead_given = false;
  bool stats = false;
  bool debug = false;
  bool default_permissions = true;
  AdapterOptions adapter;
  std::vector<std::string> fuse_options;  // passed through to libfuse
  std::string subvol;                     // subvol=, subvolid= (OpenOptions)
  uint64_t subvolid = 0;
  CompressOptions compress;               // compress=, compress-force=
  bool degraded = false;                  // degraded (OpenOptions::degraded)
  RescueOptions rescue;                   // rescue=A:B (OpenOptions::rescue)
  std::vector<std::string> devices;       // device=PATH (OpenOptions::devices), as the kernel's
};

bool ParseSeconds(const std::string& text, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno || !end || *end || text.empty() || v < 0 || v > 1e9) return false;
  *out = v;
  return true;
}

bool ParseUnsigned(const std::string& text, unsigned* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long v = std::strtoul(text.c_str(), &end, 10);
  if (errno || !end || *end || text.empty() || text[0] == '-' || v > UINT_MAX) return false;
  *out = static_cast<unsigned>(v);
  return true;
}

// Splits "a,b\,c" at unescaped commas (libfuse's own escaping).
std::vector<std::string> SplitOptions(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      cur += s[i];
      cur += s[++i];
    } else if (s[i] == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += s[i];
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string EscapeOption(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// The request loop's threads: as many as the machine has cores (at least
// 2, at most libfuse's own default of 10). libfuse starts a thread for
// each request that finds the others busy, and the kernel queues several
// reads of a file at once (its read-ahead), so with 10 threads on 2 cores
// they took the cores from the reader and from each other: 1 GiB read back
// cold 0.613 s median against 0.511 with 2 threads, fs_mark creates of
// 4 KiB files 5.8-7.2k against 8.6-10.0k files/s (docs/BENCHMARKS.md,
// session 51). A single thread read faster still (0.490 s) but created
// slower (3.1-5.0k): two clients' requests wait for each other.
unsigned DefaultThreads() {
  const unsigned cores = std::thread::hardware_concurrency();
  return std::clamp(cores, 2u, 10u);
}

bool ParseOptions(const MountConfig& cfg, Parsed* p, std::string* error) {
  p->debug = cfg.debug;
  p->rescue = cfg.rescue;
  for (const auto& group : cfg.options) {
    for (const auto& opt : SplitOptions(group)) {
      const size_t eq = opt.find('=');
      const std::string key = opt.substr(0, eq), val = eq == std::string::npos ? "" : opt.substr(eq + 1);
      const bool has_val = eq != std::string::npos;
      if (opt == "ro") {
        p->read_only = true;
      } else if (opt == "degraded") {
        p->degraded = true;
      } else if (key == "rescue" && has_val) {
        Status st = ParseRescueOptions(val, &p->rescue);
        if (!st.ok()) return *error = st.message(), false;
      } else if (key == "device" && has_val && !val.empty()) {
        p->devices.push_back(val);
      } else if (opt == "rw") {
        p->read_only = false;
      } else if (key == "commit" && has_val) {
        if (!ParseUnsigned(val, &p->commit_seconds)) return *error = "bad commit interval '" + val + "'", false;
      } else if ((key == "attr_timeout" || key == "entry_timeout" || key == "negative_timeout") && has_val) {
        double v;
        if (!ParseSeconds(val, &v)) return *error = "bad " + key + " '" + val + "'", false;
        (key == "attr_timeout" ? p->adapter.attr_timeout
                               : key == "entry_timeout" ? p->adapter.entry_timeout : p->adapter.negative_timeout) = v;
      } else if (key == "threads" && has_val) {
        if (!ParseUnsigned(val, &p->threads) || p->threads == 0 || p->threads > 1024) {
          return *error = "bad thread count '" + val + "'", false;
        }
      } else if (key == "readahead" && has_val) {
        if (!ParseUnsigned(val, &p->readahead_kib) || p->readahead_kib > (1u << 20)) {
          return *error = "bad readahead '" + val + "' (KiB, at most 1048576)", false;
        }
        p->readahead_given = true;
        p->adapter.max_readahead = p->readahead_kib * 1024;
      } else if (key == "subvol" && has_val && !val.empty()) {
        p->subvol = val;
      } else if (key == "subvolid" && has_val) {
        char* end = nullptr;
        errno = 0;
        p->subvolid = std::strtoull(val.c_str(), &end, 10);
        if (errno || val.empty() || *end || val[0] == '-') return *error = "bad subvolid '" + val + "'", false;
      } else if (key == "compress" || key == "compress-force") {
        // As the kernel: a bare compress means zlib; the last one given wins.
        CompressOptions c;
        c.force = key == "compress-force";
        Status s = ParseCompressSpec(has_val ? val : "zlib", &c);
        if (!s.ok()) return *error = s.message(), false;
        p->compress = c;
      } else if (opt == "stats") {
        p->stats = true;
      } else if (opt == "debug") {
        p->debug = true;
      } else if (opt == "noreaddirplus") {
        p->adapter.readdirplus = false;
      } else if (opt == "writeback_cache") {
        p->adapter.writeback_cache = true;
      } else if (opt == "notreelog") {
        p->adapter.tree_log = false;
      } else if (opt == "treelog") {
        p->adapter.tree_log = true;
      } else if (opt == "default_permissions") {
        p->default_permissions = true;
      } else if (opt == "nodefault_permissions") {
        p->default_permissions = false;
      } else if (key == "commit" || key == "threads" || key == "readahead" || key == "subvol" || key == "subvolid" ||
                 key.ends_with("_timeout")) {
        return *error = "option '" + key + "' needs a value", false;
      } else if (opt == "defaults" || opt == "auto" || opt == "noauto" || opt == "nofail" || opt == "_netdev" ||
                 opt == "user" || opt == "users" || opt == "nouser" || opt == "owner" || opt == "group" ||
                 key == "comment" || key.starts_with("x-")) {
        // /etc/fstab words for mount(8) and systemd, not for the file system
        // (mount(8) drops most of them itself; mount.fuse3 run by hand does not).
      } else {
        p->fuse_options.push_back(opt);
      }
    }
  }
  if (p->rescue.any() && !p->read_only) {
    // As the kernel: a rescue mount is asked for read-only, not made so.
    *error = "the rescue options read a damaged image: mount it with -o ro";
    return false;
  }
  p->adapter.read_only = p->read_only;
  if (!p->default_permissions && !p->read_only &&
      std::find(p->fuse_options.begin(), p->fuse_options.end(), "allow_other") != p->fuse_options.end()) {
    // The adapter checks no permissions of its own: every user could change
    // every file.
    *error = "nodefault_permissions with allow_other would let every user change every file "
             "(ubtrfs leaves permission checks to the kernel); drop one, or add ro";
    return false;
  }
  return true;
}

// Periodic commits from their own thread, which takes no signals (those
// belong to the session loop).
class CommitTimer {
 public:
  CommitTimer(Adapter& adapter, unsigned seconds) : adapter_(adapter), seconds_(seconds) {
    if (seconds_ == 0) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error& e) {
      // The mount is up already: it goes on, committing when asked to.
      Log(std::string("no periodic commits: cannot start their thread: ") + e.what() +
          "; changes are committed at fsync and unmount");
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  ~CommitTimer() { Stop(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (cv_.wait_for(lock, std::chrono::seconds(seconds_), [this] { return stop_; })) break;
      lock.unlock();
      Status st = adapter_.CommitIfDirty();
      if (!st.ok()) Log("periodic commit failed: " + st.ToString());
      lock.lock();
    }
  }

  Adapter& adapter_;
  const unsigned seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

struct SessionDeleter {
  void operator()(fuse_session* se) const { fuse_session_destroy(se); }
};

}  // namespace

int RunMount(const MountConfig& cfg) {
  Parsed p;
  p.adapter.max_readahead = p.readahead_kib * 1024;
  std::string error;
  if (!ParseOptions(cfg, &p, &error)) {
    fmt::print(stderr, "ubtrfs: mount: {}\n", error);
    return 2;
  }
  // libfuse keeps the mount point for the unmount, after the daemon has
  // changed to "/": make it absolute.
  char* mp_real = ::realpath(cfg.mountpoint.c_str(), nullptr);
  if (!mp_real) {
    fmt::print(stderr, "ubtrfs: mount: {}: {}\n", cfg.mountpoint, std::strerror(errno));
    return 1;
  }
  const std::string mountpoint = mp_real;
  std::free(mp_real);
  struct stat mst;
  if (::stat(mountpoint.c_str(), &mst) != 0 || !S_ISDIR(mst.st_mode)) {
    fmt::print(stderr, "ubtrfs: mount: {}: not a directory\n", cfg.mountpoint);
    return 1;
  }
  char* img_real = ::realpath(cfg.image.c_str(), nullptr);
  const std::string image_abs = img_real ? img_real : cfg.image;
  std::free(img_real);

  // librados runs threads, which fork does not take along: an RBD image
  // is opened in the daemon, forked before the open, and the parent waits
  // until the daemon has mounted (exit 0) or failed (its exit code; it
  // printed why on the terminal they share).
  const bool rbd = std::string_view(cfg.image).starts_with("rbd:");
  const bool early_fork = rbd && !cfg.foreground;
  int ready_fd = -1;
  if (early_fork) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      fmt::print(stderr, "ubtrfs: mount: pipe: {}\n", std::strerror(errno));
      return 1;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      fmt::print(stderr, "ubtrfs: mount: fork: {}\n", std::strerror(errno));
      return 1;
    }
    if (pid > 0) {
      ::close(fds[1]);
      char c;
      ssize_t n;
      do n = ::read(fds[0], &c, 1);
      while (n < 0 && errno == EINTR);
      ::close(fds[0]);
      if (n == 1) return 0;
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return WIFEXITED(status) && WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1;
    }
    ::close(fds[0]);
    ready_fd = fds[1];
    ::setsid();
  }

  // One read-write mount per image: an exclusive lock, held (across the
  // daemon's fork, which shares the open file description) until exit. A
  // read-only mount takes a shared lock, so it and a read-write one exclude
  // each other too. Every device of a multi-device filesystem is locked
  // alike. (An RBD image's writer takes the image's own exclusive lock when
  // it opens, which other machines see as well.)
  std::vector<std::string> to_lock = SplitDeviceList(cfg.image);
  for (const auto& d : p.devices) to_lock.push_back(d);
  std::vector<int> lock_fds;
  auto unlock_all = [&] {
    for (int fd : lock_fds) ::close(fd);
    lock_fds.clear();
  };
  for (const auto& path : to_lock) {
    if (std::string_view(path).starts_with("rbd:")) continue;
    const int lock_fd = ::open(path.c_str(), (p.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (lock_fd < 0) {
      fmt::print(stderr, "ubtrfs: mount: {}: {}\n", path, std::strerror(errno));
      unlock_all();
      return 1;
    }
    lock_fds.push_back(lock_fd);
    if (::flock(lock_fd, (p.read_only ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
      const int e = errno;
      if (e == EWOULDBLOCK) {
        fmt::print(stderr,
                   "ubtrfs: mount: {} is in use by another mount ({}); refusing to mount it {} as well\n",
                   path, p.read_only ? "mounted read-write" : "locked by another ubtrfs process",
                   p.read_only ? "read-only" : "read-write");
      } else {
        fmt::print(stderr, "ubtrfs: mount: locking {}: {}\n", path, std::strerror(e));
      }
      unlock_all();
      return 1;
    }
  }

  OpenOptions oo;
  oo.writable = !p.read_only;
  oo.subvol = p.subvol;
  oo.subvolid = p.subvolid;
  oo.compress = p.compress;
  oo.offset = cfg.offset;
  oo.partition = cfg.partition;
  oo.devices = p.devices;
  for (const auto& d : cfg.devices) oo.devices.push_back(d);
  oo.scan_dirs = cfg.scan_dirs;
  oo.degraded = p.degraded || cfg.degraded;
  oo.rescue = p.rescue;
  auto opened = Filesystem::Open(cfg.image, oo);
  if (!opened.ok()) {
    fmt::print(stderr, "ubtrfs: mount: {}: {}{}\n", cfg.image, opened.status().ToString(),
               !p.read_only && opened.status().code() == EOPNOTSUPP ? "; -o ro mounts it read-only" : "");
    unlock_all();
    return 1;
  }
  std::unique_ptr<Filesystem> fs = std::move(*opened);
  for (const auto& w : fs->Warnings()) fmt::print(stderr, "ubtrfs: mount: warning: {}: {}\n", cfg.image, w);

  p.adapter.log = Log;
  auto adapter = std::make_unique<Adapter>(*fs, p.adapter);

  std::string fsname = image_abs;
  if (rbd) {
    // rbd:POOL/IMAGE[@SNAP] only: /proc/mounts is world-readable, and the
    // options may hold a key (key=...) or name a keyring.
    for (size_t i = 4; i < fsname.size(); ++i) {
      if (fsname[i] == '\\') {
        ++i;
      } else if (fsname[i] == ':') {
        fsname.resize(i);
        break;
      }
    }
  }
  std::string fuse_opts = "fsname=" + EscapeOption(fsname) + ",subtype=ubtrfs";
  if (p.default_permissions) fuse_opts += ",default_permissions";
  if (p.read_only) fuse_opts += ",ro";
  for (const auto& o : p.fuse_options) fuse_opts += "," + o;
  std::vector<std::string> argv_s = {"ubtrfs", "-o", fuse_opts};
  if (p.debug) argv_s.push_back("-d");
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());

  std::unique_ptr<fuse_session, SessionDeleter> se(
      fuse_session_new(&args, &Adapter::Ops(), sizeof(fuse_lowlevel_ops), adapter.get()));
  fuse_opt_free_args(&args);
  if (se) adapter->SetSession(se.get());
  if (!se) {
    fmt::print(stderr, "ubtrfs: mount: bad FUSE options '{}'\n", fuse_opts);
    unlock_all();
    return 2;
  }
  if (fuse_set_signal_handlers(se.get()) != 0) {
    fmt::print(stderr, "ubtrfs: mount: cannot install signal handlers\n");
    unlock_all();
    return 1;
  }
  if (fuse_session_mount(se.get(), mountpoint.c_str()) != 0) {
    // libfuse has said why (no /dev/fuse, EPERM from fusermount3, ...).
    fmt::print(stderr, "ubtrfs: mount: cannot mount {} on {}\n", cfg.image, mountpoint);
    fuse_remove_signal_handlers(se.get());
    unlock_all();
    return 1;
  }
  if (p.readahead_kib != 0) {
    // Only root may; a user who asked for it hears why not.
    const std::string why = SetMountReadahead(mountpoint, p.readahead_kib);
    if (!why.empty() && (p.readahead_given || p.debug)) Log("readahead not set: " + why);
  }
  if (early_fork) {
    // What fuse_daemonize does after its fork, then the parent may go.
    const int nul = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul >= 0) {
      ::dup2(nul, 0);
      ::dup2(nul, 1);
      ::dup2(nul, 2);
      if (nul > 2) ::close(nul);
    }
    if (::chdir("/") != 0) {
      // (nothing relies on the working directory; "/" only frees the old one)
    }
    const char ready = 1;
    (void)!::write(ready_fd, &ready, 1);
    ::close(ready_fd);
    openlog("ubtrfs", LOG_PID, LOG_DAEMON);
    g_daemonized = true;
  } else if (!cfg.foreground) {
    // Returns in the child; the parent exits 0 once the child is ready.
    if (fuse_daemonize(0) != 0) {
      fuse_session_unmount(se.get());
      fuse_remove_signal_handlers(se.get());
      unlock_all();
      return 1;
    }
    openlog("ubtrfs", LOG_PID, LOG_DAEMON);
    g_daemonized = true;
  }

  int loop_result;
  {
    CommitTimer timer(*adapter, p.read_only ? 0 : p.commit_seconds);
    if (p.threads == 1) {
      loop_result = fuse_session_loop(se.get());
    } else {
      fuse_loop_config* lc = fuse_loop_cfg_create();
      fuse_loop_cfg_set_max_threads(lc, p.threads ? p.threads : DefaultThreads());
      loop_result = fuse_session_loop_mt(se.get(), lc);
      fuse_loop_cfg_destroy(lc);
    }
    timer.Stop();
  }
  fuse_remove_signal_handlers(se.get());
  fuse_session_unmount(se.get());
  se.reset();

  int rc = 0;
  if (loop_result < 0) {
    Log(std::string("session ended with an error: ") + std::strerror(-loop_result));
    rc = 1;
  }
  Status st = adapter->Shutdown();
  if (!st.ok()) Log(st.ToString());
  if (!p.read_only) {
    st = fs->Commit();
    if (!st.ok()) {
      Log("final commit failed: " + st.ToString());
      rc = 1;
    }
  }
  if (p.stats) Log("requests: " + adapter->CountsReport());
  adapter.reset();
  fs.reset();
  unlock_all();  // only now may another mount open the image
  return rc;
}

}  // namespace ubtrfs::fuse
