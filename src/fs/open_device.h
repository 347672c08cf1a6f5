// Opening a Filesystem on a library device the caller built (recording and
// fault devices in crash tests, memory devices in fuzz targets). Library
// users have Filesystem::Open(std::unique_ptr<ubtrfs::BlockDevice>) instead.
#ifndef UBTRFS_FS_OPEN_DEVICE_H_
#define UBTRFS_FS_OPEN_DEVICE_H_

#include <memory>
#include <vector>

#include "io/block_device.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs {

Result<std::unique_ptr<Filesystem>> OpenOnDevice(std::unique_ptr<io::BlockDevice> dev, const OpenOptions& options);
// The devices of one filesystem, in any order (txn::Volume::Open matches
// them by devid).
Result<std::unique_ptr<Filesystem>> OpenOnDevices(std::vector<std::unique_ptr<io::BlockDevice>> devs,
                                                  const OpenOptions& options);

}  // namespace ubtrfs

#endif  // UBTRFS_FS_OPEN_DEVICE_H_
