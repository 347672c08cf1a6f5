// The importer's declarations moved to the public API (ubtrfs/import.h);
// the library's own code keeps naming them fs::.
#ifndef UBTRFS_FS_IMPORT_H_
#define UBTRFS_FS_IMPORT_H_

#include "ubtrfs/import.h"

namespace ubtrfs::fs {
using ubtrfs::ImportContents;
using ubtrfs::ImportOptions;
using ubtrfs::ImportStats;
using ubtrfs::ImportTree;
}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_IMPORT_H_
