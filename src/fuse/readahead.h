// The kernel reads ahead on a FUSE mount 128 KiB at a time (the default of
// every new backing device), one READ request per 128 KiB; kernel btrfs sets
// 4 MiB on its own mounts. A sequential read of a large file through the
// mount went twice as fast with 4 MiB here (and its requests grow to the
// 1 MiB the mount accepts). Only root may change it, through sysfs.
#ifndef UBTRFS_FUSE_READAHEAD_H_
#define UBTRFS_FUSE_READAHEAD_H_

#include <string>

namespace ubtrfs::fuse {

// Sets read_ahead_kb of the FUSE mount on `mountpoint` (an absolute path
// without symlinks, as /proc/self/mountinfo names it; the most recent mount
// there). Returns "" or why it could not (not root, no sysfs, no such mount):
// the mount works either way, with the kernel's default.
std::string SetMountReadahead(const std::string& mountpoint, unsigned kib);

}  // namespace ubtrfs::fuse

#endif  // UBTRFS_FUSE_READAHEAD_H_
