#include "txn/super_info.h"

#include <cstring>

#include "format/checksum.h"
#include "format/superblock.h"

namespace ubtrfs::txn {

FsInfo InfoFromSuperblock(const format::SuperBlock& sb, int mirror) {
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
  i.superblock_mirror = mirror;
  i.devid = sb.dev_item.devid.get();
  return i;
}

}  // namespace ubtrfs::txn
