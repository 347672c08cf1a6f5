// Emptying a block group by moving what it holds to new logical addresses,
// as the kernel's relocation does for `btrfs balance start -dusage=N
// -musage=N`: the way to give back the device space of groups that are
// partly used (deleting files frees scattered extents, and a group goes
// only once nothing in it is used: txn/unused_groups.cc).
//
// Where the chunk moves of txn/relocate.cc keep logical addresses and copy
// whole stripes, this moves each extent: a data extent is copied to a new
// extent elsewhere (its checksums with it) and the file extent items that
// map it are pointed at the copy; a tree block is copied to a new address.
// The back references say which blocks hold the pointers
// (RootWalk::Backrefs); those blocks, and theirs up to the roots, are
// copied once each however many snapshots share them, every pointer
// following (TxnManager::MoveTreeBlocks, txn/block_move.cc), so what was
// shared stays shared. Freed, the old extents leave the group empty, and
// the commit deletes it with its chunk.
//
// Crash safety is that of any transaction: the copies go to space that was
// free in the committed state, and the group's space is not reused before
// the commit that deletes it is on disk.
#ifndef UBTRFS_TXN_EXTENT_RELOCATION_H_
#define UBTRFS_TXN_EXTENT_RELOCATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::txn {

class TxnManager;

struct RelocationStats {
  uint64_t data_extents = 0;  // data extents copied to new places
  uint64_t data_bytes = 0;    // their bytes
  uint64_t tree_blocks = 0;   // tree blocks copied on write
  // What stayed behind, and why (an extent no tree reaches, a data extent
  // that did not read back verified).
  std::vector<std::string> notes;
};

// Moves everything in the block group at `start` elsewhere, committing as
// it goes (the running transaction must have no changes), and returns
// whether the group is gone. It hands out no space meanwhile; if something
// stays in it (named in stats->notes), it serves allocations again. ENOSPC
// when there is no room for a batch of moves: what was moved before is
// committed, and so is the transaction. Any other error may leave the
// running transaction half changed: it must not be committed.
Result<bool> RelocateGroup(TxnManager& txn, uint64_t start, RelocationStats* stats);

class Volume;
// EINVAL when the kernel left relocation trees of a balance it did not
// finish: it merges them at its next mount (which needs room), and their
// blocks are its to account for. Balance and resize --shrink leave such an
// image alone.
Status RefuseKernelRelocation(Volume& vol);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_EXTENT_RELOCATION_H_
