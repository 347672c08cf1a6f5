// What member devices' own superblocks say (ubtrfs/inspect.h), for `ubtrfs
// info` of a filesystem that cannot be opened from the devices given, and
// the feature flags as text.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "format/superblock.h"
#include "txn/devices.h"
#include "txn/super_info.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs {

Result<FsInfo> ReadMemberInfo(const std::string& image, const OpenOptions& where) {
  UB_ASSIGN_OR_RETURN(auto devs,
                      txn::OpenDevices(txn::DeviceSpec::Of(image, where.offset, where.partition, where.scan_dirs)));
  std::vector<uint64_t> have;
  std::optional<txn::SuperChoice> first;
  for (auto& d : devs) {
    UB_ASSIGN_OR_RETURN(txn::SuperChoice sc, txn::ReadSuperblock(*d));
    if (!first) first = sc;
    have.push_back(sc.sb.dev_item.devid.get());
  }
  if (!first) return Status::Error(ENOENT, image + ": no device");
  FsInfo i = txn::InfoFromSuperblock(first->sb, first->mirror);
  // The superblock does not list the devices: every devid up to
  // num_devices that none of the given ones has (at most 64 named).
  for (uint64_t id = 1; id <= i.num_devices && i.devices_missing.size() < 64; ++id) {
    if (std::find(have.begin(), have.end(), id) == have.end()) i.devices_missing.push_back(id);
  }
  return i;
}

std::string IncompatFeatureNames(uint64_t flags) { return format::IncompatNames(flags); }
std::string CompatRoFeatureNames(uint64_t flags) { return format::CompatRoNames(flags); }

}  // namespace ubtrfs
