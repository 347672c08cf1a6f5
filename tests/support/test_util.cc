#include "support/test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/core.h>
#include <gtest/gtest.h>

extern char** environ;

namespace ubtrfs_test {

std::string CommandResult::Describe() const {
  auto trunc = [](const std::string& s) {
    constexpr size_t kMax = 4000;
    if (s.size() <= kMax) return s;
    return s.substr(0, kMax) + fmt::format("... ({} bytes total)", s.size());
  };
  return fmt::format("exit {}; stderr: {}; stdout: {}", exit_code, trunc(err), trunc(out));
}

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::string r;
  for (const auto& a : argv) {
    if (!r.empty()) r += ' ';
    bool plain = !a.empty();
    for (char c : a) {
      if (!(isalnum(static_cast<unsigned char>(c)) || strchr("-_./=:,+@%", c))) plain = false;
    }
    if (plain) {
      r += a;
    } else {
      r += '\'';
      for (char c : a) {
        if (c == '\'') r += "'\\''";
        else r += c;
      }
      r += '\'';
    }
  }
  return r;
}

std::string Sha256(const std::string& path) {
  CommandResult r = RunCommand({"sha256sum", path});
  return r.ok() ? r.out.substr(0, 64) : "sha256sum failed: " + r.Describe();
}

std::string FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  std::string path = getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin";
  path += ":/usr/local/sbin:/usr/sbin:/sbin";
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t end = path.find(':', pos);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(pos, end - pos);
    if (!dir.empty()) {
      std::string cand = dir + "/" + name;
      struct stat st;
      if (stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(cand.c_str(), X_OK) == 0) return cand;
    }
    pos = end + 1;
  }
  return "";
}

CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult res;
  if (argv.empty()) return res;
  std::string prog = FindProgram(argv[0]);
  if (prog.empty()) {
    res.err = fmt::format("{}: program not found in PATH", argv[0]);
    return res;
  }
  int outp[2], errp[2];
  if (pipe2(outp, O_CLOEXEC) != 0) {
    res.err = fmt::format("pipe: {}", strerror(errno));
    return res;
  }
  if (pipe2(errp, O_CLOEXEC) != 0) {
    res.err = fmt::format("pipe: {}", strerror(errno));
    close(outp[0]);
    close(outp[1]);
    return res;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
  posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, prog.c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(outp[1]);
  close(errp[1]);
  if (rc != 0) {
    close(outp[0]);
    close(errp[0]);
    res.err = fmt::format("spawn {}: {}", prog, strerror(rc));
    return res;
  }
  struct pollfd fds[2] = {{outp[0], POLLIN, 0}, {errp[0], POLLIN, 0}};
  std::string* sinks[2] = {&res.out, &res.err};
  int open_count = 2;
  char buf[65536];
  while (open_count > 0) {
    int n = poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = read(fds[i].fd, buf, sizeof buf);
      if (r > 0) {
        sinks[i]->append(buf, r);
      } else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      res.exit_code = -1;
      return res;
    }
  }
  if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) res.exit_code = 128 + WTERMSIG(status);
  return res;
}

std::string Printable(std::string_view bytes, size_t max_len) {
  std::string r;
  size_t n = std::min(bytes.size(), max_len);
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') r += static_cast<char>(c);
    else if (c == '\\') r += "\\\\";
    else r += fmt::format("\\x{:02x}", c);
  }
  if (bytes.size() > max_len) r += fmt::format("...({} bytes)", bytes.size());
  return r;
}

namespace {

void RemoveAt(int parent_fd, const char* name, dev_t dev) {
  struct stat st;
  if (fstatat(parent_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    unlinkat(parent_fd, name, 0);
    return;
  }
  if (st.st_dev != dev) return;  // a mount point: leave it alone
  if ((st.st_mode & 0700) != 0700) fchmodat(parent_fd, name, (st.st_mode & 07777) | 0700, 0);
  int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    names.push_back(e->d_name);
  }
  for (const auto& n : names) RemoveAt(dirfd(d), n.c_str(), dev);
  closedir(d);
  unlinkat(parent_fd, name, AT_REMOVEDIR);
}

}  // namespace

void RemoveTree(const std::string& path) {
  if (path.empty() || path == "/") return;
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  RemoveAt(AT_FDCWD, path.c_str(), st.st_dev);
}

TempDir::TempDir(const std::string& prefix) {
  std::string templ = "/tmp/" + prefix + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {
    ADD_FAILURE() << "mkdtemp " << templ << ": " << strerror(errno);
    return;
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  bool failed = ::testing::Test::HasFailure();
  // Suite-level scratch (deleted from TearDownTestSuite): keep it when any
  // test of the suite failed.
  const auto* unit = ::testing::UnitTest::GetInstance();
  if (!unit->current_test_info() && unit->current_test_suite() && unit->current_test_suite()->Failed()) failed = true;
  if (keep_ || failed) {
    fmt::print(stderr, "[ keeping  ] scratch directory kept for inspection: {}\n", path_);
    return;
  }
  RemoveTree(path_);
}

bool MakeSparseFile(const std::string& path, uint64_t size, std::string* error) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (error) *error = fmt::format("creating sparse file {}: {}", path, strerror(errno));
    if (fd >= 0) close(fd);
    return false;
  }
  close(fd);
  return true;
}

LoopMount::~LoopMount() {
  std::string e = Unmount();
  if (!e.empty()) fmt::print(stderr, "LoopMount cleanup: {}\n", e);
}

std::string LoopMount::Mount(const std::string& image, const std::string& mountpoint,
                             const std::string& options) {
  if (mounted_) return "already mounted";
  std::string opts = options.empty() ? "loop" : "loop," + options;
  CommandResult r = RunCommand({"mount", "-t", "btrfs", "-o", opts, image, mountpoint});
  // A copy of an image mounted a moment ago has the same fsid, and the
  // kernel may still list the old loop device under it (its release is
  // asynchronous): forget unmounted devices and try again. Two copies of one
  // image mounted at the same moment (tests running in parallel on one
  // fixture) race in the kernel's temp-fsid registration: one mount fails
  // with "failed to init sysfs fsid interface: -17" in the kernel log, which
  // mount(8) reports as "wrong fs type, bad option, bad superblock". A
  // damaged image fails that way every time, so it still fails here.
  // Loop devices are shared by every test running at once: mount(8) may
  // lose one it picked to another setup ("failed to setup loop device"),
  // or find it still claimed by a release in progress ("busy").
  auto transient = [](const CommandResult& m) {
    return m.err.find("File exists") != std::string::npos || m.err.find("wrong fs type") != std::string::npos ||
           m.err.find("failed to setup loop device") != std::string::npos ||
           m.err.find("already mounted or mount point busy") != std::string::npos;
  };
  for (int i = 0; i < 5 && !r.ok() && transient(r); ++i) {
    (void)RunCommand({"btrfs", "device", "scan", "--forget"});
    usleep(200000);
    r = RunCommand({"mount", "-t", "btrfs", "-o", opts, image, mountpoint});
  }
  if (!r.ok()) {
    // A failed mount may still have left a loop device attached.
    CommandResult lo = RunCommand({"losetup", "-j", image});
    if (lo.ok() && !lo.out.empty()) {
      std::string dev = lo.out.substr(0, lo.out.find(':'));
      if (!dev.empty()) (void)RunCommand({"losetup", "-d", dev});
    }
    return fmt::format("{} failed: {}", ShellJoin({"mount", "-t", "btrfs", "-o", opts, image, mountpoint}),
                       r.Describe());
  }
  image_ = image;
  mountpoint_ = mountpoint;
  mounted_ = true;
  return "";
}

std::string LoopMount::Unmount() {
  if (!mounted_) return "";
  std::string problems;
  sync();
  CommandResult r = RunCommand({"umount", mountpoint_});
  if (!r.ok()) {
    problems += fmt::format("umount {}: {}; ", mountpoint_, r.Describe());
    for (int i = 0; i < 20 && !r.ok(); ++i) {  // briefly busy? retry, then lazy
      usleep(100000);
      r = RunCommand({"umount", mountpoint_});
    }
    if (!r.ok()) {
      CommandResult l = RunCommand({"umount", "-l", mountpoint_});
      if (!l.ok()) problems += fmt::format("umount -l: {}; ", l.Describe());
    }
  }
  mounted_ = false;
  // mount -o loop sets autoclear, but detach explicitly anything left over.
  CommandResult lo = RunCommand({"losetup", "-j", image_});
  if (lo.ok()) {
    size_t pos = 0;
    while (pos < lo.out.size()) {
      size_t end = lo.out.find('\n', pos);
      if (end == std::string::npos) end = lo.out.size();
      std::string line = lo.out.substr(pos, end - pos);
      std::string dev = line.substr(0, line.find(':'));
      if (!dev.empty()) {
        CommandResult d = RunCommand({"losetup", "-d", dev});
        if (!d.ok()) problems += fmt::format("losetup -d {}: {}; ", dev, d.Describe());
      }
      pos = end + 1;
    }
  }
  return r.ok() ? "" : problems;
}

bool LoopMountsAvailable(std::string* reason) {
  static std::once_flag once;
  static bool available = false;
  static std::string why;
  std::call_once(once, [] {
    if (geteuid() != 0) {
      why = "not running as root";
      return;
    }
    if (FindProgram("mkfs.btrfs").empty()) {
      why = "mkfs.btrfs not installed";
      return;
    }
    char templ[] = "/tmp/ubtrfs-loopprobe-XXXXXX";
    if (!mkdtemp(templ)) {
      why = fmt::format("mkdtemp: {}", strerror(errno));
      return;
    }
    std::string dir = templ;
    std::string img = dir + "/probe.img", mnt = dir + "/mnt";
    mkdir(mnt.c_str(), 0755);
    std::string err;
    if (!MakeSparseFile(img, 128ull << 20, &err)) {
      why = err;
    } else {
      CommandResult mk = RunCommand({"mkfs.btrfs", "-q", "-f", img});
      if (!mk.ok()) {
        why = "mkfs.btrfs failed: " + mk.Describe();
      } else {
        LoopMount m;
        std::string e = m.Mount(img, mnt);
        if (!e.empty()) {
          why = e;
        } else {
          e = m.Unmount();
          if (!e.empty()) why = "unmount failed: " + e;
          else available = true;
        }
      }
    }
    RemoveTree(dir);
  });
  if (reason) *reason = why;
  return available;
}

}  // namespace ubtrfs_test
