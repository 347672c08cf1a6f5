// The tree log of an image the kernel left with one (superblock log_root !=
// 0): every block of the log root tree and of each subvolume's log tree is
// read and verified, and each item the replay would use is checked for shape
// (sizes, names inside their items, checksums a whole number of sectors,
// data extents inside data chunks). Read only: the log is not replayed.
#ifndef UBTRFS_CHECK_LOG_CHECK_H_
#define UBTRFS_CHECK_LOG_CHECK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "txn/volume.h"

namespace ubtrfs::check {

struct LogCheckCounts {
  uint64_t log_trees = 0;
  uint64_t blocks = 0;
  uint64_t items = 0;
  // [start, end) of each data extent a log file extent refers to: the replay
  // adds its extent item if the extent tree lacks it, so checksums there are
  // not orphans.
  std::vector<std::pair<uint64_t, uint64_t>> data_extents;
  // The data of each regular log file extent of an inode with checksums
  // (no NODATASUM), which the replay needs checksums for, in the log or in
  // the csum tree; and the ranges the logs' own EXTENT_CSUM items cover.
  struct NeedsCsum {
    uint64_t subvol = 0, ino = 0, file_offset = 0, start = 0, len = 0;
  };
  std::vector<NeedsCsum> needs_csum;
  std::vector<std::pair<uint64_t, uint64_t>> log_csums;
};

// Errors go to `error`, one line each; things that are not damage (a log of
// a subvolume that no longer exists, which the replay skips) to `warning`.
LogCheckCounts CheckTreeLog(txn::Volume& vol, const std::function<void(std::string)>& error,
                            const std::function<void(std::string)>& warning);

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_LOG_CHECK_H_
