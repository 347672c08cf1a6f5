// Naming the devices of a filesystem, for programs that take a device list
// from their user as ubtrfs's own commands do.
#ifndef UBTRFS_DEVICES_H_
#define UBTRFS_DEVICES_H_

#include <string>
#include <vector>

#include "ubtrfs/export_macros.h"

namespace ubtrfs {

// The devices a name gives, as Filesystem::Open reads its `path`:
// "a.img,b.img" names two, unless a file of that whole name exists.
UBTRFS_API std::vector<std::string> SplitDeviceList(const std::string& spec);

}  // namespace ubtrfs

#endif  // UBTRFS_DEVICES_H_
