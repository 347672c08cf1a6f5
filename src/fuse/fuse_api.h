// The one place that picks the libfuse API level: 3.12 (libfuse 3.14 is
// installed), for fuse_loop_cfg_* and the current fuse_lowlevel_ops.
#ifndef UBTRFS_FUSE_FUSE_API_H_
#define UBTRFS_FUSE_FUSE_API_H_

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

#endif  // UBTRFS_FUSE_FUSE_API_H_
