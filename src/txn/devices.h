// Finding the devices of a filesystem: the superblock each one carries, the
// list a user names ("IMG1,IMG2,..."), and a scan of directories for the
// other members (same fsid).
#ifndef UBTRFS_TXN_DEVICES_H_
#define UBTRFS_TXN_DEVICES_H_

#include <memory>
#include <string>
#include <vector>

#include "format/ondisk.h"
#include "io/block_device.h"
#include "io/offset_device.h"

namespace ubtrfs::txn {

struct SuperChoice {
  format::SuperBlock sb{};
  int mirror = 0;       // which copy: the primary unless it is damaged
  std::string warning;  // why a mirror was used
};
// The superblock a device carries: a valid primary always wins, else the
// newest valid copy (as the kernel's btrfs_read_dev_super). With
// `only_mirror` (0-2) that copy or an error (EINVAL past the device's end);
// with kNewestValidSuper the newest valid copy even behind a valid primary
// (super-recover: a commit that reached only some copies).
inline constexpr int kNewestValidSuper = -2;
Result<SuperChoice> ReadSuperblock(io::BlockDevice& dev, int only_mirror = -1);

// "a.img,b.img" names two devices, unless a file of that whole name exists.
std::vector<std::string> SplitDeviceList(const std::string& spec);

struct DeviceSpec {
  std::vector<std::string> paths;      // named devices, the first one's fsid rules
  std::vector<std::string> scan_dirs;  // look here for the others
  io::Placement where;                 // applied to every device
  bool writable = false;

  // What a user's IMAGE names (IMG1,IMG2,...) with the placement options
  // every command takes (--offset, --partition, --scan).
  static DeviceSpec Of(const std::string& image, uint64_t offset, int partition,
                       const std::vector<std::string>& scan_dirs, bool writable = false) {
    DeviceSpec s;
    s.paths = SplitDeviceList(image);
    s.scan_dirs = scan_dirs;
    s.where.offset = offset;
    s.where.partition = partition;
    s.writable = writable;
    return s;
  }
};
// Opens the named devices and, from each scan directory, every file or
// block device whose superblock has the first device's fsid and a devid not
// taken yet.
Result<std::vector<std::unique_ptr<io::BlockDevice>>> OpenDevices(const DeviceSpec& spec);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_DEVICES_H_
