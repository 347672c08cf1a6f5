// Whether the kernel has an image file or block device mounted.
#ifndef UBTRFS_IO_MOUNTED_H_
#define UBTRFS_IO_MOUNTED_H_

#include <string>

namespace ubtrfs::io {

// A mount whose source is `path` (after realpath), or a loop device backed
// by it (/sys/block/loopN/loop/backing_file), in /proc/self/mounts. Writing
// under such a mount would corrupt what the kernel caches.
bool MountedByKernel(const std::string& path);

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_MOUNTED_H_
