// The half of a commit that waits for the device: writing the
// transaction's tree blocks, the flush that makes them durable, its
// superblocks, the flush that makes those durable, and only then the space
// it freed free again.
//
// TxnManager::Commit(&tail) does the first half -- references, block
// groups, root items, every tree block checksummed, the superblocks filled
// in, the next transaction opened -- and leaves this one
// to the caller, which runs Finish() once it has let go of what keeps other
// threads from changing the file system. So they go on with the next
// transaction while the device catches up, as with the kernel, whose
// writers join a new transaction once the old one is unblocked.
//
// Why that is safe:
//   - the next transaction never writes over a block of the committing one
//     or of the one before: it copies on write any block it changes, and
//     what the committing transaction freed stays pinned in the block
//     groups' sealed clones (alloc/block_group.h) until Finish() is done;
//   - the superblocks were made while the commit still held everything, so
//     they point at the committing transaction's trees whatever the next
//     one changes;
//   - the blocks are not changed after they are sealed (the next
//     transaction copies them too), and until they are written the node
//     cache holds them for readers (tree::BlockReader::HoldUnwritten);
//     blocks in RAID5/6 chunks, whose rows are read back to compute their
//     parity, are written in the first half;
//   - until Finish() returns, the volume's SuperLock() is held: the next
//     commit, a tree log's superblock and device changes wait for it, so
//     superblocks reach the devices in order.
// If Finish() fails, the superblock may not be on disk and the transaction
// after it is built on one that never committed: the caller must stop
// writing (the file system aborts), and nothing the failed commit freed is
// handed out again.
#ifndef UBTRFS_TXN_COMMIT_TAIL_H_
#define UBTRFS_TXN_COMMIT_TAIL_H_

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "alloc/chunk_map.h"
#include "tree/tree_block.h"
#include "txn/volume.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {

class TxnManager;

// A transaction's tree blocks, checksummed and placed, ready to be written.
struct SealedBlocks {
  std::vector<std::pair<uint64_t, tree::BlockRef>> blocks;  // by address
  std::vector<std::vector<alloc::Piece>> phys;  // each block's pieces, every copy (none in RAID5/6 chunks)
  std::vector<char> in_parity_chunk;  // per block: written row by row with its parity instead
  bool written = false;  // by the first half (RAID5/6 rows)
  bool any_parity() const {
    return std::any_of(in_parity_chunk.begin(), in_parity_chunk.end(), [](char c) { return c != 0; });
  }
};

class CommitTail {
 public:
  CommitTail() = default;
  CommitTail(CommitTail&&) = default;
  CommitTail& operator=(CommitTail&&) = delete;
  CommitTail(const CommitTail&) = delete;
  CommitTail& operator=(const CommitTail&) = delete;
  // A tail nobody finished is finished here; its error is lost, so callers
  // call Finish().
  ~CommitTail() { (void)Finish(); }

  // Whether there is a second half left to run.
  bool pending() const { return txn_ != nullptr; }
  // Runs it (Ok when there is none) and lets the next commit go ahead.
  Status Finish();

 private:
  friend class TxnManager;
  TxnManager* txn_ = nullptr;
  std::unique_lock<std::mutex> super_lock_;  // Volume::SuperLock(), from the commit's start
  SealedBlocks blocks_;
  Volume::SealedSupers supers_;
};

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_COMMIT_TAIL_H_
