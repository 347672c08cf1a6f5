// Offline repairs for an image the kernel refuses to mount, as `btrfs
// rescue` makes them (`ubtrfs rescue`, src/rescue/). Each changes as little
// as it can and nothing may have the image open meanwhile (no mount; the
// image is locked as for any writable open). A damaged image is read
// without changing it with OpenOptions::rescue instead.
#ifndef UBTRFS_RESCUE_H_
#define UBTRFS_RESCUE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

struct ZeroLogResult {
  uint64_t log_root = 0;  // the tree log's root block before (0: there was none)
  int log_level = 0;
  std::vector<std::string> warnings;  // about the open
};
// Drops the tree log (`btrfs rescue zero-log`): the superblock of every
// device says there is none, so a mount no longer replays it -- for a log
// whose replay fails. What was fsynced after the last commit and is only in
// the log is lost; the last commit is kept whole (the log's blocks were
// never in the extent tree). Every device must be there (EINVAL otherwise):
// one left behind would still name the log. Nothing is written when there
// is no log.
UBTRFS_API Result<ZeroLogResult> ZeroLog(const std::string& image, const OpenOptions& where);

// One superblock copy of one device, as SuperRecover found it.
struct SuperCopy {
  uint64_t devid = 0;
  std::string device;       // the path it was opened by
  int mirror = 0;           // 0 (the primary at 64 KiB), 1 (64 MiB), 2 (256 GiB)
  uint64_t bytenr = 0;
  uint64_t generation = 0;  // 0 when the copy does not read or validate
  std::string problem;      // why it is bad; empty for a good copy
};
struct SuperRecoverResult {
  std::vector<SuperCopy> copies;  // every copy each present device has room for, before any rewrite
  uint64_t generation = 0;        // of the copy the others were (or would be) rewritten from
  size_t bad = 0;
  bool rewritten = false;
  std::vector<std::string> warnings;  // about the open (a device missing)
};
// `btrfs rescue super-recover`: every superblock copy of every device is
// held to the newest valid one (checksum, magic, this filesystem's fsid,
// this device's devid, the newest generation); with `rewrite`, bad copies
// are written again from it, each device's with its own DEV_ITEM, as a
// commit writes them. The newest copy must lead to a filesystem that opens
// (its chunk tree reads). Devices that are missing are left alone (a
// warning says so). Without `rewrite` nothing is written.
UBTRFS_API Result<SuperRecoverResult> SuperRecover(const std::string& image, const OpenOptions& where, bool rewrite);

struct DeviceSizeChange {
  uint64_t devid = 0;
  uint64_t old_bytes = 0, new_bytes = 0;
};
struct FixDeviceSizeResult {
  std::vector<DeviceSizeChange> devices;  // DEV_ITEMs whose total_bytes changed
  uint64_t old_super_bytes = 0, new_super_bytes = 0;
  bool changed() const { return !devices.empty() || old_super_bytes != new_super_bytes; }
  std::vector<std::string> warnings;
};
// `btrfs rescue fix-device-size`: each device's total_bytes rounded down to
// the sector size, or, where it is larger than the device (or image file)
// and no chunk reaches past the device's end, cut to the device's size;
// then the superblock's total_bytes set to the devices' sum, which the
// kernel (since 4.11) refuses to mount below. Every device must be there.
// EINVAL, nothing written, when a chunk lies past the end of its device.
UBTRFS_API Result<FixDeviceSizeResult> FixDeviceSize(const std::string& image, const OpenOptions& where);

struct ClearUuidTreeResult {
  bool had_tree = false;
  uint64_t blocks_freed = 0;
  std::vector<std::string> warnings;
};
// `btrfs rescue clear-uuid-tree`: the UUID tree removed (its root item, and
// every tree block the extent tree says it owns, so its blocks go back to
// free space even where they no longer read), for a UUID tree that keeps
// the kernel from mounting. The kernel builds a new one at its next
// writable mount; ubtrfs itself never needs one (receive finds subvolumes
// by uuid in their root items) and keeps none it finds missing.
UBTRFS_API Result<ClearUuidTreeResult> ClearUuidTree(const std::string& image, const OpenOptions& where);

}  // namespace ubtrfs

#endif  // UBTRFS_RESCUE_H_
