// What member devices' own superblocks say (ubtrfs/inspect.h), for `ubtrfs
// info` of a filesystem that cannot be opened from the devices given, and
// the feature flags as text.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "txn/devices.h"
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
  const format::SuperBlock& sb = first->sb;
  FsInfo i;
  i.label.assign(sb.label, strnlen(sb.label, format::kLabelSize));
  i.fsid = format::UuidToString(sb.fsid);
  i.generation = sb.generation.get();
  i.sectorsize = sb.sectorsize.get();
  i.nodesize = sb.nodesize.get();
  i.csum_type = format::CsumTypeName(sb.csum_type.get());
  i.total_bytes = sb.total_bytes.get();
  i.bytes_used = sb.bytes_used.get();
  i.num_devices = sb.num_devices.get();
  i.incompat_flags = sb.incompat_flags.get();
  i.compat_ro_flags = sb.compat_ro_flags.get();
  i.superblock_mirror = first->mirror;
  i.devid = sb.dev_item.devid.get();
  // The superblock does not list the devices: every devid up to
  // num_devices that none of the given ones has (at most 64 named).
  for (uint64_t id = 1; id <= sb.num_devices.get() && i.devices_missing.size() < 64; ++id) {
    if (std::find(have.begin(), have.end(), id) == have.end()) i.devices_missing.push_back(id);
  }
  return i;
}

std::string IncompatFeatureNames(uint64_t flags) { return format::IncompatNames(flags); }
std::string CompatRoFeatureNames(uint64_t flags) { return format::CompatRoNames(flags); }

}  // namespace ubtrfs
