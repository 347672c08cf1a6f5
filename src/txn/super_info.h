// What a superblock says of its filesystem, as the public FsInfo: for
// `Filesystem::Info` of an opened filesystem and for a member device read
// alone (ubtrfs/inspect.h ReadMemberInfo), so both say the same things.
#ifndef UBTRFS_TXN_SUPER_INFO_H_
#define UBTRFS_TXN_SUPER_INFO_H_

#include "format/ondisk.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::txn {

// Every field but devices_missing, which takes knowing the devices at hand.
// `mirror`: which superblock copy `sb` is.
FsInfo InfoFromSuperblock(const format::SuperBlock& sb, int mirror);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_SUPER_INFO_H_
