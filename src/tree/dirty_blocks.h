// The tree blocks a running transaction has created or copied-on-write.
// Readers inside the transaction see these first, then committed blocks.
#ifndef UBTRFS_TREE_DIRTY_BLOCKS_H_
#define UBTRFS_TREE_DIRTY_BLOCKS_H_

#include <array>
#include <atomic>
#include <map>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>
#include <memory>

#include "tree/block_reader.h"

namespace ubtrfs::tree {

// What the tree engine needs from the transaction layer to place blocks.
class BlockAllocator {
 public:
  virtual ~BlockAllocator() = default;
  // A nodesize-aligned address for a new tree block of tree `owner`.
  virtual Result<uint64_t> AllocTreeBlock(uint64_t owner, int level) = 0;
  // The new tree no longer references this block. Its space may be reused
  // only after the transaction commits (a block created in this same
  // transaction was never committed: `created_here` says so).
  virtual Status FreeTreeBlock(uint64_t bytenr, uint64_t owner, int level, bool created_here) = 0;
  // A committed block leaves tree `owner` (copied on write, or freed); told
  // before FreeTreeBlock. The references its children hold may have to move
  // with it (blocks with full backrefs name their parent, not their tree).
  virtual Status RetireCommitted(const TreeBlock& b, uint64_t owner) {
    (void)b, (void)owner;
    return Status::Ok();
  }
};

struct HeaderTemplate {
  uint8_t fsid[format::kFsidSize] = {};
  uint8_t chunk_tree_uuid[format::kUuidSize] = {};
};

class DirtyBlocks final : public BlockSource {
 public:
  DirtyBlocks(BlockSource* clean, const TreeParams& params, const HeaderTemplate& tmpl, BlockAllocator* alloc,
              uint64_t transid)
      : clean_(clean), params_(params), tmpl_(tmpl), alloc_(alloc), transid_(transid) {}

  // This transaction's block at the address (found with Peek, Get when
  // Peek misses), else the clean source's.
  Result<BlockRef> Read(const BlockCheck& check) override;
  const HeaderTemplate& header_template() const { return tmpl_; }
  bool Locking() const override { return concurrent_.load(std::memory_order_relaxed); }
  bool NeedsLock(const TreeBlock& b) const override { return Locking() && b.generation() == transid_; }
  // Concurrent mode: several threads read and change the trees at once, so
  // readers and writers take node locks on this transaction's blocks. Off
  // while one thread has the trees to itself (commit, exclusive operations).
  void set_concurrent(bool on) { concurrent_.store(on, std::memory_order_relaxed); }

  uint64_t transid() const { return transid_; }
  const TreeParams& params() const { return params_; }
  bool IsDirty(uint64_t bytenr) const { return Get(bytenr) != nullptr; }
  size_t count() const { return count_.load(std::memory_order_relaxed); }
  // The writable block at bytenr, if this transaction created it.
  std::shared_ptr<TreeBlock> Get(uint64_t bytenr) const;
  // The same without a lock or a reference count, for the hot descent of
  // concurrent writers: lock-free, and the block stays in memory until the
  // transaction ends (dropped blocks are kept until Reset). May miss a block
  // added a moment ago, and may return a dropped one (check `dropped` while
  // holding the parent that points at bytenr): callers treat both as "not
  // known" and take the slow path.
  TreeBlock* Peek(uint64_t bytenr) const;

  // A new empty block (header filled, no items) for tree `owner`.
  Result<std::shared_ptr<TreeBlock>> New(uint64_t owner, int level);
  // A writable version of `b`: b itself when created in this transaction,
  // else a copy at a new address (the old one is freed after commit).
  Result<std::shared_ptr<TreeBlock>> Cow(const BlockRef& b, uint64_t owner);
  // A copy of `b` at a new address for tree `owner`, b itself untouched and
  // still referenced (a snapshot's own root block).
  Result<std::shared_ptr<TreeBlock>> CopyToNew(const BlockRef& b, uint64_t owner);
  // Drops a block from the tree (the caller has unlinked it).
  Status Free(const TreeBlock& b, uint64_t owner);

  // Every block to write at commit, by address. Only while no other thread
  // changes the trees.
  std::vector<std::pair<uint64_t, std::shared_ptr<TreeBlock>>> All() const;
  // Starts the next transaction: nothing is dirty.
  void Reset(uint64_t transid) {
    for (Shard& s : shards_) {
      std::unique_lock lock(s.mu);
      s.blocks.clear();
      s.table.store(nullptr, std::memory_order_relaxed);
      s.tables.clear();
      s.used = 0;
      s.dropped.clear();
    }
    count_.store(0, std::memory_order_relaxed);
    transid_ = transid;
  }

 private:
  BlockSource* clean_;
  TreeParams params_;
  HeaderTemplate tmpl_;
  BlockAllocator* alloc_;
  uint64_t transid_;
  std::atomic<bool> concurrent_{false};
  // The blocks by address, in shards with their own locks (on cache lines of
  // their own) so that threads looking up different blocks do not contend.
  // Next to each shard's map, an open-addressing table of the same blocks
  // (address -> pointer) that Peek reads without locking: slots are filled
  // key last and never emptied (a dropped block's slot points nowhere); a
  // full table is replaced by a bigger one and kept until Reset, so a
  // reader still probing it stays safe.
  struct Slot {
    std::atomic<uint64_t> key{0};  // bytenr + 1; 0: empty
    std::atomic<TreeBlock*> block{nullptr};
  };
  struct Table {
    explicit Table(size_t n) : mask(n - 1), slots(new Slot[n]) {}
    size_t mask;
    std::unique_ptr<Slot[]> slots;
  };
  struct alignas(64) Shard {
    mutable std::shared_mutex mu;  // guards all below but `table`'s readers
    std::unordered_map<uint64_t, std::shared_ptr<TreeBlock>> blocks;
    std::atomic<Table*> table{nullptr};
    std::vector<std::unique_ptr<Table>> tables;  // the current one last
    size_t used = 0;  // slots of the current table with a key
    std::vector<std::shared_ptr<TreeBlock>> dropped;  // freed blocks, kept for Peek until Reset
  };
  static void TableStore(Shard& s, uint64_t bytenr, TreeBlock* b);  // s.mu held
  static constexpr size_t kShards = 64;
  Shard& ShardOf(uint64_t bytenr) { return shards_[(bytenr / params_.nodesize) % kShards]; }
  const Shard& ShardOf(uint64_t bytenr) const { return shards_[(bytenr / params_.nodesize) % kShards]; }
  void Put(uint64_t bytenr, std::shared_ptr<TreeBlock> b);
  std::array<Shard, kShards> shards_;
  alignas(64) std::atomic<size_t> count_{0};
};

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_DIRTY_BLOCKS_H_
