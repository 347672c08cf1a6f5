// A window of another device: a filesystem that starts `offset` bytes into
// a disk image (a partition) sees a device of `size` bytes from 0, and no
// read or write can reach outside the window.
#ifndef UBTRFS_IO_OFFSET_DEVICE_H_
#define UBTRFS_IO_OFFSET_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/block_device.h"

namespace ubtrfs::io {

// Where a filesystem lies in its image: an explicit offset, or partition N
// (1-based) of a GPT or MBR partition table, found with libblkid.
struct Placement {
  uint64_t offset = 0;
  uint64_t size = 0;  // 0: to the end of the image
  int partition = 0;
  // The image's path, for libblkid to read the partition table from (MBR
  // logical partitions sit anywhere on the disk). Empty: the table is read
  // through the device, from its first and last MiB.
  std::string path;
};

// The window of `inner` that `where` names (the partition table is read from
// `inner`); EINVAL / ENOENT naming what is wrong when it does not fit.
Result<std::unique_ptr<BlockDevice>> OpenWindow(std::unique_ptr<BlockDevice> inner, const Placement& where);

// An image file or block device, and within it the window `where` names.
Result<std::unique_ptr<BlockDevice>> OpenImage(const std::string& path, OpenFlags flags, const Placement& where);

// The partitions libblkid finds on `inner`: (number, start byte, size bytes).
struct PartitionEntry {
  int number = 0;
  uint64_t start = 0, size = 0;
  std::string type;  // the table's type name or GUID, as libblkid gives it
};
Result<std::vector<PartitionEntry>> ListPartitions(BlockDevice& inner, const std::string& path = "");

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_OFFSET_DEVICE_H_
