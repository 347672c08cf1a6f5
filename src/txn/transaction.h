// Transactions over an opened Volume: one running transaction at a time that
// every change joins, delayed extent-reference updates, block group and free
// space tree accounting, root items, and the commit that makes it durable.
//
// Commit order (nothing of the last committed state is overwritten first):
// run delayed refs, block group items and the free space tree, and root items
// until nothing changes; write every dirty tree block to space that was free
// in the committed state; flush; write the superblocks; flush; only then
// release the space this transaction freed (clone bitmaps dropped).
#ifndef UBTRFS_TXN_TRANSACTION_H_
#define UBTRFS_TXN_TRANSACTION_H_

#include <atomic>
#include <map>
#include <mutex>
#include <memory>
#include <set>
#include <tuple>

#include "alloc/space_manager.h"
#include "tree/writer.h"
#include "txn/chunk_alloc.h"
#include "txn/volume.h"

namespace ubtrfs::txn {

struct TxnStats {
  uint64_t commits = 0;
  uint64_t blocks_written = 0;
  uint64_t commit_loops = 0;  // refs/accounting rounds of the last commit
  uint64_t data_bytes_written = 0;
};

class TxnManager final : public tree::BlockAllocator {
 public:
  // Checks that the image is one we can change safely (skinny metadata, a
  // free space tree that matches the extent tree, no log, no shared tree
  // blocks) and loads its block groups.
  static Result<std::unique_ptr<TxnManager>> Open(Volume* vol);
  ~TxnManager() override;

  uint64_t transid() const { return dirty_->transid(); }
  Volume* volume() { return vol_; }
  tree::BlockSource* source() { return dirty_.get(); }

  // The writer of tree `objectid` (the root tree is kRootTreeObjectid).
  Result<tree::TreeWriter*> Writer(uint64_t objectid);

  // Data: allocate, write (with checksums into the csum tree), reference.
  Result<uint64_t> AllocData(uint64_t len);
  Status WriteData(uint64_t logical, std::span<const uint8_t> data, bool csum);
  Status AddDataRef(uint64_t bytenr, uint64_t num_bytes, uint64_t root, uint64_t ino, uint64_t offset);
  Status DropDataRef(uint64_t bytenr, uint64_t num_bytes, uint64_t root, uint64_t ino, uint64_t offset);

  Status Commit();

  // tree::BlockAllocator
  Result<uint64_t> AllocTreeBlock(uint64_t owner, int level) override;
  Status FreeTreeBlock(uint64_t bytenr, uint64_t owner, int level, bool created_here) override;
  // A committed block with full backrefs leaves its tree: its children's
  // references keyed by it as parent move to references keyed by the tree
  // (full_backref.cc).
  Status RetireCommitted(const tree::TreeBlock& b, uint64_t owner) override;

  const TxnStats& stats() const { return stats_; }
  // Whether the running transaction holds anything a commit would write or
  // release (dirty tree blocks, reference changes, new data extents).
  bool HasChanges();
  // Bytes of tree blocks the running transaction holds in memory.
  uint64_t dirty_bytes() const { return dirty_->count() * uint64_t{vol_->nodesize()}; }
  // Several threads change the trees at once (tree::DirtyBlocks concurrent
  // mode): readers and writers take node locks. Commit turns it off.
  void set_concurrent(bool on) { dirty_->set_concurrent(on); }
  // Serializes the allocation calls of threads that change trees at once
  // (tree blocks, data, writers, the metadata reservation).
  std::unique_lock<std::recursive_mutex> AllocLock() { return std::unique_lock(alloc_mu_); }
  alloc::SpaceManager& space() { return *space_; }
  // New chunks when space runs out, ENOSPC, the metadata reserve (chunk_alloc.h).
  ChunkAllocator& chunk_alloc() { return *chunk_alloc_; }

 private:
  explicit TxnManager(Volume* vol) : vol_(vol) {}
  Status Load();
  Status LoadBlockGroups();
  Status ExcludeSuperStripes();
  Status CheckFreeSpaceTree();
  Status RunDelayedRefs(bool* changed);
  Status ApplyTreeRef(uint64_t bytenr, int delta, uint64_t owner, int level);
  Status ApplyDataRef(const std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>& ref, int delta);
  // full_backref.cc: a SHARED_DATA_REF (bytenr, num_bytes, parent) dropped
  // `-delta` times; a tree block's SHARED_BLOCK_REF moved to a TREE_BLOCK_REF.
  Status ApplySharedDataRef(const std::tuple<uint64_t, uint64_t, uint64_t>& ref, int delta);
  struct RefMove {
    uint64_t parent = 0;  // the SHARED_BLOCK_REF's parent
    uint64_t root = 0;    // the TREE_BLOCK_REF's root
    int level = 0;
  };
  Status MoveTreeRef(uint64_t bytenr, const RefMove& move);
  // Deletes a tree block's METADATA_ITEM and any keyed ref items of it.
  Status DeleteTreeBlockItems(uint64_t bytenr, int level);
  Status NoteExtentItemForCow(const format::Key& k, uint64_t flags);
  Status UpdateBlockGroups(bool* changed);
  Status UpdateRootItems(bool* changed);
  Status DeleteCsums(uint64_t start, uint64_t len);
  Status WriteDirtyBlocks(std::vector<uint64_t>* written);
  uint64_t ExcludedIn(uint64_t group_start) const;
  std::vector<std::pair<uint64_t, uint64_t>> TreeFreeExtents(const alloc::BlockGroup& g) const;
  void MarkGroupDirty(uint64_t logical);

  Volume* vol_;
  std::recursive_mutex alloc_mu_;  // see AllocLock()
  std::unique_ptr<alloc::SpaceManager> space_;
  std::unique_ptr<tree::DirtyBlocks> dirty_;
  std::map<uint64_t, std::unique_ptr<tree::TreeWriter>> writers_;
  // Net reference changes since the last commit. Tree blocks by bytenr:
  // (delta, owner, level). Data by (bytenr, num_bytes, root, ino, offset).
  struct TreeRef {
    int delta = 0;
    uint64_t owner = 0;
    int level = 0;
  };
  std::map<uint64_t, TreeRef> tree_refs_;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>, int> data_refs_;
  std::map<uint64_t, uint64_t> new_data_;     // data extents allocated this transaction: bytenr -> length
  std::set<uint64_t> dirty_groups_;           // starts of groups whose space changed
  std::map<uint64_t, uint64_t> excluded_;     // group start -> superblock-stripe bytes in it
  std::vector<std::pair<uint64_t, uint64_t>> excluded_ranges_;
  std::vector<uint64_t> freed_blocks_;        // tree blocks freed this transaction (cache invalidation)
  // Committed tree blocks with the FULL_BACKREF flag (relocation leaves
  // them): their children are referenced by parent (full_backref.cc).
  std::set<uint64_t> full_backref_;
  std::atomic<bool> any_full_backref_{false};
  // Tree blocks whose references are items of their own (not inline).
  std::map<uint64_t, std::vector<format::Key>> tree_ref_items_;
  // This transaction's moves of children's references (bytenr -> move) and
  // dropped shared data refs ((bytenr, num_bytes, parent) -> delta).
  std::map<uint64_t, RefMove> tree_ref_moves_;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, int> shared_data_refs_;
  TxnStats stats_;
  friend class ChunkAllocator;
  std::unique_ptr<ChunkAllocator> chunk_alloc_;
};

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_TRANSACTION_H_
