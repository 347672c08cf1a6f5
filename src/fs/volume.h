// Transitional: Volume moved to txn/ (transactions commit to it). Code that
// still names fs::Volume keeps building.
#ifndef UBTRFS_FS_VOLUME_H_
#define UBTRFS_FS_VOLUME_H_

#include "txn/volume.h"

namespace ubtrfs::fs {
using txn::Volume;
using txn::VolumeOptions;
}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_VOLUME_H_
