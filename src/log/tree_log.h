// Writing a tree log: what fsync(2) makes durable without a transaction
// commit. The kernel's format (fs/btrfs/tree-log.c): a log root tree (owner
// TREE_LOG_OBJECTID) with one ROOT_ITEM per subvolume that has a log, each
// pointing at that subvolume's log tree, which holds copies of the fsynced
// inodes' items (inode, references, xattrs, file extents, directory index
// entries with DIR_LOG_INDEX ranges) and the checksums of their new data.
// The superblock's log_root points at it; its generation stays the last
// committed one, the log's blocks carry the next. A replay (log/replay.h,
// or the kernel's mount) applies it.
//
// This class keeps what the running transaction has logged so far (the fs
// layer decides what: src/fs/fsync.cc) and writes it out at Sync(): the
// blocks that differ from the last written log go to space pinned for the
// log, then a flush, the primary superblock, a flush. Blocks that did not
// change are kept (an append rewrites the leaves at its inode item and at
// its end, not the whole log). The next commit ends the log (its superblock
// has log_root 0): Reset().
//
// Not thread-safe: the caller holds the filesystem's exclusive lock.
#ifndef UBTRFS_LOG_TREE_LOG_H_
#define UBTRFS_LOG_TREE_LOG_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "format/key.h"
#include "txn/transaction.h"
#include "txn/volume.h"
#include "ubtrfs/status.h"

namespace ubtrfs::log {

struct TreeLogStats {
  uint64_t syncs = 0;
  uint64_t blocks_written = 0;  // by all syncs
  uint64_t blocks_kept = 0;     // unchanged since the previous sync, not rewritten
};

class TreeLog {
 public:
  explicit TreeLog(txn::Volume* vol) : vol_(vol) {}

  // ---- What the log holds, per subvolume tree ----
  void Put(uint64_t root, const format::Key& k, std::vector<uint8_t> data);
  // Removes the logged items in [from, to] (keys inclusive).
  void Erase(uint64_t root, const format::Key& from, const format::Key& to);
  // The logged items in [from, to].
  std::vector<std::pair<format::Key, const std::vector<uint8_t>*>> Items(uint64_t root, const format::Key& from,
                                                                         const format::Key& to) const;
  // The logged item of `key`'s objectid and type at or before `key`, if any.
  std::optional<std::pair<format::Key, const std::vector<uint8_t>*>> ItemAtOrBefore(uint64_t root,
                                                                                     const format::Key& key) const;
  // Checksums of the data sectors from `logical` (one CsumSize entry each),
  // replacing what the log had for them.
  void PutCsums(uint64_t root, uint64_t logical, std::span<const uint8_t> sums);
  // Bytes of items logged (what a sync writes at most, before block
  // overhead).
  uint64_t bytes() const { return bytes_; }
  bool empty() const { return trees_.empty(); }
  // Whether two logged file extent items name the same data extent (the
  // two ends of an extent overwritten in its middle, a reflink). The
  // kernel's replay on a filesystem with mixed groups takes every logged
  // extent out of the free space cache once per item, and the second time
  // fails (EINVAL, the mount refused) where that space is kept as a bitmap.
  bool NamesADataExtentTwice() const;

  // Writes the log and makes it durable: blocks, flush, the primary
  // superblock with log_root, flush. ENOSPC when the log's blocks would need
  // space the committed chunks do not have (the caller commits instead). On
  // an error the superblock on the device still points at the previous log,
  // whose blocks were not touched.
  Status Sync(txn::TxnManager* txn);
  // The running transaction committed (its superblock has no log_root): the
  // log is forgotten and its space was released by the commit.
  void Reset();

  const TreeLogStats& stats() const { return stats_; }

 private:
  struct Leaf {
    format::Key first;  // the leaf holds the logged keys from here to the next leaf's first
    uint64_t bytenr = 0;
  };
  struct Tree {
    std::map<format::Key, std::vector<uint8_t>> items;
    // Keys changed since the last sync: the leaves they fall in are packed
    // again, every other leaf of the durable log is kept as it is.
    std::set<format::Key> dirty;
    std::vector<Leaf> leaves;  // of the durable log, in key order
  };
  struct Built {
    uint64_t bytenr = 0;
    uint64_t generation = 0;
    int level = 0;
  };
  void Touch(Tree& t, const format::Key& k) { t.dirty.insert(k); }
  // One leaf from items [from, to) of `items`.
  Result<uint64_t> WriteLeaf(txn::TxnManager* txn,
                             std::span<const std::pair<format::Key, std::span<const uint8_t>>> items);
  // Leaves for every item of `t`, keeping the clean leaves of the durable
  // log; then nodes up to one root.
  Result<std::vector<Leaf>> BuildLeaves(txn::TxnManager* txn, const Tree& t);
  Result<Built> BuildNodes(txn::TxnManager* txn, std::vector<Leaf> leaves);
  // A node's bytes: the same as a node of the durable log keep its address.
  Result<uint64_t> Place(txn::TxnManager* txn, std::vector<uint8_t> bytes, bool reuse);
  Result<uint64_t> TakeBlock(txn::TxnManager* txn);
  std::vector<uint8_t> Blank(txn::TxnManager* txn, int level) const;
  static uint64_t HashOf(std::span<const uint8_t> b);

  txn::Volume* vol_;
  uint64_t transid_ = 0;  // the transaction the log belongs to (0: none yet)
  std::map<uint64_t, Tree> trees_;  // by subvolume id
  uint64_t bytes_ = 0;
  // Blocks: every block the log took in this transaction (pinned until the
  // commit), the blocks of the log the superblock on the device points at,
  // and the durable nodes' contents (bytenr and checksum zeroed) for reuse.
  std::set<uint64_t> owned_;
  std::set<uint64_t> live_;
  std::unordered_multimap<uint64_t, std::pair<uint64_t, std::vector<uint8_t>>> live_nodes_;  // hash -> (bytenr, bytes)
  std::unordered_multimap<uint64_t, std::pair<uint64_t, std::vector<uint8_t>>> new_nodes_;
  // Writes of the sync in progress: bytenr -> sealed bytes.
  std::map<uint64_t, std::vector<uint8_t>> pending_;
  std::set<uint64_t> taken_;  // blocks of the sync in progress (kept or new)
  TreeLogStats stats_;
};

}  // namespace ubtrfs::log

#endif  // UBTRFS_LOG_TREE_LOG_H_
