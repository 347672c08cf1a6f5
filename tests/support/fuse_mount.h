// `ubtrfs mount` from the suites that go through a real FUSE mount
// (fuse_test, fuse_posix_test, fuse_e2e_test).
#ifndef UBTRFS_TESTS_SUPPORT_FUSE_MOUNT_H_
#define UBTRFS_TESTS_SUPPORT_FUSE_MOUNT_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace ubtrfs_test {

// Whether `dir` is the mount point of a fuse.ubtrfs file system.
bool IsUbtrfsMount(const std::string& dir);

// Why FUSE mounts cannot work here at all (no /dev/fuse, no fusermount3 for
// a non-root user, no mkfs.btrfs), or "".
std::string FuseUnavailableReason();

// `ubtrfs mount -f` in a child process, its stdout and stderr in a log file.
// The destructor never leaves a mount behind: lazy unmount, then kill.
class MountProcess {
 public:
  MountProcess() = default;
  MountProcess(const MountProcess&) = delete;
  MountProcess& operator=(const MountProcess&) = delete;
  ~MountProcess() { Cleanup(); }

  // Starts the mount and waits until it is in place. On failure sets *skip
  // when the environment refuses FUSE mounts (EPERM, ENODEV), else *error.
  bool Start(const std::string& image, const std::string& mountpoint, const std::string& log,
             const std::vector<std::string>& extra, std::string* skip, std::string* error);
  // Unmounts as a user would (fusermount3 -u, else umount) and returns the
  // process's exit code (-1 if it did not exit within a minute).
  int Unmount(std::string* error);
  // Waits for the process; its exit code, 128+signal, or -1 on timeout.
  int Wait(int seconds);
  pid_t pid() const { return pid_; }
  std::string Log() const;
  // "requests: lookup 3, ..." from -o stats, as a map.
  std::map<std::string, uint64_t> Counters() const;
  void Cleanup();

 private:
  std::string mountpoint_, log_;
  pid_t pid_ = -1;
};

// A fresh image made by mkfs.btrfs (1 GiB unless told) and a mount point,
// in one TempDir.
struct Scratch {
  TempDir dir{"ubtrfs-fuse"};
  std::string img = dir.Sub("img"), mnt = dir.Sub("mnt"), log = dir.Sub("mount.log");
  // "" or what failed.
  std::string Make(uint64_t size = 1ull << 30);
};

}  // namespace ubtrfs_test

#define SKIP_IF_NO_FUSE()                                                                    \
  do {                                                                                       \
    if (std::string r = ubtrfs_test::FuseUnavailableReason(); !r.empty()) GTEST_SKIP() << r; \
  } while (0)

// Mounts scratch's image on its mount point with the extra arguments, or
// skips (FUSE refused here) / fails the test.
#define START_MOUNT(proc, scratch, ...)                                                              \
  do {                                                                                               \
    std::string skip_, error_;                                                                       \
    if (!(proc).Start((scratch).img, (scratch).mnt, (scratch).log, {__VA_ARGS__}, &skip_, &error_)) { \
      if (!skip_.empty()) GTEST_SKIP() << skip_;                                                     \
      FAIL() << error_;                                                                              \
    }                                                                                                \
  } while (0)

#endif  // UBTRFS_TESTS_SUPPORT_FUSE_MOUNT_H_
