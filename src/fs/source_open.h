// Opening the files and directories of a host tree being imported.
#ifndef UBTRFS_FS_SOURCE_OPEN_H_
#define UBTRFS_FS_SOURCE_OPEN_H_

#include <fcntl.h>

#include <cerrno>

namespace ubtrfs::fs {

// openat without changing the atime (O_NOATIME) where this process may
// (the owner, or CAP_FOWNER), else as usual. The import records atimes: a
// build that set them by reading its source would make the next build of
// the same tree differ (a reproducible build clamps times to
// SOURCE_DATE_EPOCH, and older atimes are kept as they are).
inline int OpenSource(int dirfd, const char* path, int flags) {
  int fd = ::openat(dirfd, path, flags | O_NOATIME);
  if (fd < 0 && errno == EPERM) fd = ::openat(dirfd, path, flags);
  return fd;
}

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_SOURCE_OPEN_H_
