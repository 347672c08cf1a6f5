// Offline repairs for an image the kernel refuses to mount, as `btrfs
// rescue` makes them (`ubtrfs rescue`). Each changes as little as it can
// and nothing may have the image open meanwhile (no mount). The repairs
// btrfs rescue also names live elsewhere here: superblock copies are
// rewritten from the best one by `ubtrfs scrub` (super-recover), and a
// damaged image is read without changing it with OpenOptions::rescue.
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

}  // namespace ubtrfs

#endif  // UBTRFS_RESCUE_H_
