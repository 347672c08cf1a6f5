// Tree-log replay: what the kernel's mount does with an image whose
// superblock has a log_root (fsync wrote a log tree and a superblock, then
// the kernel crashed or lost power before the next commit). The fsynced
// inodes, names, xattrs, extents and checksums in the per-subvolume log
// trees are copied into the subvolumes' trees with the kernel's rules
// (fs/btrfs/tree-log.c: replay_one_buffer and its helpers), the logged data
// extents get their EXTENT_ITEMs, the log's blocks are freed, and the
// superblock's log_root is cleared in one commit.
//
// Below fs/ and beside txn/: it works on a Volume through a TxnManager.
#ifndef UBTRFS_LOG_REPLAY_H_
#define UBTRFS_LOG_REPLAY_H_

#include <cstdint>

#include "txn/volume.h"
#include "ubtrfs/status.h"

namespace ubtrfs::log {

struct ReplayStats {
  uint64_t log_trees = 0;       // per-subvolume log trees replayed
  uint64_t log_blocks = 0;      // blocks of the log root tree and the log trees
  uint64_t items = 0;           // log items looked at
  uint64_t new_extents = 0;     // logged data extents that got their EXTENT_ITEM
  uint64_t names_removed = 0;   // directory entries the log's ranges deleted
  uint64_t inodes_removed = 0;  // inodes left with no name (the kernel's orphans)
};

// Replays the tree log of `vol` (opened writable; super().log_root != 0) and
// commits: the superblock then has log_root 0. On an error nothing has been
// committed and the image is as it was; a damaged log block is found before
// anything changes. EOPNOTSUPP where the image is one ubtrfs cannot write
// (the message says why). `vol` should be opened afresh afterwards.
Status ReplayLog(txn::Volume* vol, ReplayStats* stats = nullptr);

}  // namespace ubtrfs::log

#endif  // UBTRFS_LOG_REPLAY_H_
