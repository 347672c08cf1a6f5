// Inside the library: a public ubtrfs::BlockDevice as an io::BlockDevice
// (the library's own device unwrapped, a caller's adapted).
#ifndef UBTRFS_FS_BLOCK_DEVICE_API_H_
#define UBTRFS_FS_BLOCK_DEVICE_API_H_

#include <memory>

#include "io/block_device.h"
#include "ubtrfs/block_device.h"

namespace ubtrfs {

std::unique_ptr<io::BlockDevice> FromPublicDevice(std::unique_ptr<ubtrfs::BlockDevice> d);

}  // namespace ubtrfs

#endif  // UBTRFS_FS_BLOCK_DEVICE_API_H_
