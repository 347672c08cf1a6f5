// `ubtrfs mount`: serves an image through FUSE until it is unmounted.
#ifndef UBTRFS_FUSE_MOUNT_H_
#define UBTRFS_FUSE_MOUNT_H_

#include <string>
#include <vector>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::fuse {

struct MountConfig {
  std::string image;
  std::string mountpoint;
  // -o arguments, each a comma-separated list. Ours:
  //   ro / rw, commit=SECONDS (default 30; 0 = only at fsync and unmount),
  //   attr_timeout= / entry_timeout= / negative_timeout= (seconds, default 1),
  //   threads=N (request threads; 1 = single-threaded loop), noreaddirplus,
  //   writeback_cache, notreelog (fsync commits in full instead of writing a
  //   tree log), stats (request counters on stderr at unmount),
  //   nodefault_permissions (no permission checks by the kernel;
  //   refused with allow_other on a read-write mount), debug,
  //   subvol=PATH / subvolid=ID (where the mount starts, as btrfs's),
  //   device=PATH (another device of the filesystem), degraded (write
  //   although devices are missing), as the kernel's; rescue=A:B (with ro:
  //   RescueOptions' names, as the kernel's).
  // Anything else goes to libfuse (allow_other, auto_unmount, max_read=, ...).
  std::vector<std::string> options;
  bool foreground = false;
  bool debug = false;
  // Where the filesystem lies in the image (OpenOptions::offset, partition).
  uint64_t offset = 0;
  int partition = 0;
  // More devices of a multi-device filesystem (OpenOptions::devices,
  // scan_dirs, degraded); -o device=PATH and -o degraded add to them.
  std::vector<std::string> devices;
  std::vector<std::string> scan_dirs;
  bool degraded = false;
  // Read-only rescue (OpenOptions::rescue); -o rescue=A:B adds to it.
  RescueOptions rescue;
};

// Opens, locks and mounts the image; without `foreground`, daemonizes once
// the mount is in place. Returns the exit code: 0 after a clean unmount
// (fusermount3 -u, umount, SIGTERM/SIGINT/SIGHUP) whose final commit
// succeeded, 1 on errors, 2 on bad options.
int RunMount(const MountConfig& config);

}  // namespace ubtrfs::fuse

#endif  // UBTRFS_FUSE_MOUNT_H_
