#include "support/fuse_mount.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/host_files.h"
#include "support/mkfs_util.h"

namespace ubtrfs_test {
namespace {

pid_t Spawn(const std::string& image, const std::string& mountpoint, const std::string& log,
            const std::vector<std::string>& extra) {
  std::vector<std::string> args = {UBTRFS_CLI_PATH, "mount", "-f", image, mountpoint};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

bool IsUbtrfsMount(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string id, parent, devno, root, mp;
    ls >> id >> parent >> devno >> root >> mp;
    if (mp != dir) continue;
    const size_t dash = line.find(" - ");
    if (dash != std::string::npos && line.compare(dash + 3, 12, "fuse.ubtrfs ") == 0) return true;
  }
  return false;
}

std::string FuseUnavailableReason() {
  if (access("/dev/fuse", F_OK) != 0) return "/dev/fuse is missing (no FUSE in this kernel or container)";
  if (geteuid() != 0 && FindProgram("fusermount3").empty()) {
    return "not root and fusermount3 is missing (install fuse3)";
  }
  if (std::string r = MkfsMissingReason(); !r.empty()) return r;
  return "";
}

bool MountProcess::Start(const std::string& image, const std::string& mountpoint, const std::string& log,
                         const std::vector<std::string>& extra, std::string* skip, std::string* error) {
  mountpoint_ = mountpoint;
  log_ = log;
  pid_ = Spawn(image, mountpoint, log, extra);
  if (pid_ < 0) return *error = "fork failed", false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (IsUbtrfsMount(mountpoint)) return true;
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      const std::string out = ReadHostFile(log);
      for (const char* s : {"Operation not permitted", "No such device", "device not found",
                            "failed to open /dev/fuse", "Permission denied"}) {
        if (out.find(s) != std::string::npos) return *skip = "FUSE mounts are refused here: " + out, false;
      }
      return *error = "ubtrfs mount exited (status " + std::to_string(status) + "): " + out, false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return *error = "the mount did not appear within 30 s; log: " + ReadHostFile(log), false;
}

int MountProcess::Unmount(std::string* error) {
  auto r = FindProgram("fusermount3").empty() ? RunCommand({"umount", mountpoint_})
                                              : RunCommand({"fusermount3", "-u", mountpoint_});
  if (!r.ok()) *error = r.Describe();
  return Wait(60);
}

int MountProcess::Wait(int seconds) {
  if (pid_ < 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::string MountProcess::Log() const { return ReadHostFile(log_); }

std::map<std::string, uint64_t> MountProcess::Counters() const {
  std::map<std::string, uint64_t> out;
  const std::string log = Log();
  const size_t at = log.rfind("requests: ");
  if (at == std::string::npos) return out;
  std::istringstream in(log.substr(at + 10, log.find('\n', at) - at - 10));
  std::string item;
  while (std::getline(in, item, ',')) {
    std::istringstream is(item);
    std::string name;
    uint64_t n = 0;
    if (is >> name >> n) out[name] = n;
  }
  return out;
}

void MountProcess::Cleanup() {
  if (!mountpoint_.empty() && IsUbtrfsMount(mountpoint_)) {
    if (!RunCommand({"fusermount3", "-u", "-z", mountpoint_}).ok()) RunCommand({"umount", "-l", mountpoint_});
  }
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    if (Wait(15) == -1 && pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
}

std::string Scratch::Make(uint64_t size) {
  if (mkdir(mnt.c_str(), 0755) != 0) return std::string("mkdir: ") + strerror(errno);
  return RunMkfs(img, "", 0, "", size);
}

}  // namespace ubtrfs_test
