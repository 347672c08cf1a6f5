// Transactions over an opened Volume: one running transaction at a time that
// every change joins, delayed extent-reference updates, block group and free
// space tree accounting, root items, and the commit that makes it durable.
//
// Commit order (nothing of the last committed state is overwritten first):
// run delayed refs, block group items and the free space tree, and root items
// until nothing changes; write every dirty tree block to space that was free
// in the committed state; then (txn/commit_tail.h, possibly while the next
// transaction runs) flush; write the superblocks; flush; only then release
// the space this transaction freed (the sealed clone bitmaps dropped).
#ifndef UBTRFS_TXN_TRANSACTION_H_
#define UBTRFS_TXN_TRANSACTION_H_

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <memory>
#include <memory_resource>
#include <set>
#include <tuple>
#include <unordered_map>

#include "alloc/space_manager.h"
#include "mem/few_map.h"
#include "tree/writer.h"
#include "txn/alloc_mutex.h"
#include "txn/chunk_alloc.h"
#include "txn/commit_tail.h"
#include "txn/volume.h"

namespace ubtrfs::txn {

// m.lower_bound(key), without a search when key is the last key or past it:
// extents are mostly allocated, and then referenced, in ascending order.
template <typename Map>
typename Map::iterator AtOrAfter(Map& m, const typename Map::key_type& key) {
  if (m.empty()) return m.end();
  auto last = std::prev(m.end());
  if (last->first < key) return m.end();
  if (last->first == key) return last;
  return m.lower_bound(key);
}

struct TxnStats {
  uint64_t commits = 0;
  uint64_t blocks_written = 0;
  uint64_t commit_loops = 0;  // refs/accounting rounds of the last commit
  uint64_t data_bytes_written = 0;
};

// Data the calling thread is about to write that also lies in a host file
// (import with reflink): while one is in scope, TxnManager::WriteData puts
// the sectors of any buffer inside [base, base + len) onto the device with
// BlockDevice::CloneFrom from `fd` at `offset` + their place in the buffer,
// sharing the host file's extents where its file system can. The bytes are
// still in the buffer, so checksums come from them as for any write.
struct CloneSource {
  int fd = -1;
  uint64_t offset = 0;
  const uint8_t* base = nullptr;
  size_t len = 0;
};
class ScopedCloneSource {
 public:
  explicit ScopedCloneSource(const CloneSource& s);
  ~ScopedCloneSource();
  ScopedCloneSource(const ScopedCloneSource&) = delete;
  ScopedCloneSource& operator=(const ScopedCloneSource&) = delete;

 private:
  CloneSource saved_;
};

// The calling thread's clone source, or null.
const CloneSource* CurrentCloneSource();

// One back reference of an extent: TREE_BLOCK_REF (a = root),
// SHARED_BLOCK_REF (a = parent), EXTENT_DATA_REF (a = root, ino, off) or
// SHARED_DATA_REF (a = parent).
struct RefId {
  uint8_t type = 0;
  uint64_t a = 0, ino = 0, off = 0;
  auto operator<=>(const RefId&) const = default;
};

class TxnManager final : public tree::BlockAllocator {
 public:
  using RefId = txn::RefId;

  // Checks that the image is one we can change safely (skinny metadata, a
  // free space tree that matches the extent tree, no log) and loads its
  // block groups.
  // allow_log: the image may carry an unreplayed tree log (only the log
  // replay, src/log/, opens it so; it pins the log's space first and clears
  // the superblock's log_root before its commit).
  static Result<std::unique_ptr<TxnManager>> Open(Volume* vol, bool allow_log = false);
  ~TxnManager() override;

  uint64_t transid() const { return dirty_->transid(); }
  // The tree that holds block group items: the extent tree, or the block
  // group tree on images with the block-group-tree feature.
  uint64_t block_group_tree() const { return bg_tree_; }
  Volume* volume() { return vol_; }
  tree::BlockSource* source() { return dirty_.get(); }

  // The writer of tree `objectid` (the root tree is kRootTreeObjectid).
  Result<tree::TreeWriter*> Writer(uint64_t objectid);

  // Data: allocate, write (with checksums into the csum tree), reference.
  // first_fit: the lowest free run (SpaceManager::Allocate), for relocation.
  Result<uint64_t> AllocData(uint64_t len, bool first_fit = false);
  Status WriteData(uint64_t logical, std::span<const uint8_t> data, bool csum);
  Status AddDataRef(uint64_t bytenr, uint64_t num_bytes, uint64_t root, uint64_t ino, uint64_t offset);
  Status DropDataRef(uint64_t bytenr, uint64_t num_bytes, uint64_t root, uint64_t ino, uint64_t offset);
  // Whether data extent `bytenr` belongs to file `ino` of tree `root` alone,
  // so that a write may go into it in place (a NODATACOW file, a
  // preallocated extent) as the kernel's can_nocow_extent allows: every
  // reference is an EXTENT_DATA_REF of that file with `offset` (the file
  // offset of the extent's start: the pieces of one extent that earlier
  // writes split share it, a clone within the file does not), and a
  // committed extent is younger than the tree's last snapshot (a snapshot
  // shares the leaves that reference an older one without a reference of
  // its own). Any doubt is a no, and the write copies (txn/nocow.cc).
  Result<bool> DataExtentOnlyOf(uint64_t bytenr, uint64_t root, uint64_t ino, uint64_t offset);
  // Growing a data extent of this transaction instead of starting another
  // (sequential writes of a file as one extent of up to 128 MiB, as the
  // kernel's delayed allocation gives): AllocDataAt takes exactly
  // [logical, +len) if it is free (not pinned) within the block group the
  // extent ending at `logical` is in (false at a group's start), as a
  // data extent of its own (so that nothing is lost if it is never merged:
  // unreferenced, it is freed at the commit); MergeData then folds that
  // extent into the one that ends at `logical`, if that one is still of this
  // transaction with `root`/`ino`/`offset` its only reference, and says
  // whether it did (if not, the caller references the extent on its own).
  Result<bool> AllocDataAt(uint64_t logical, uint64_t len);
  Result<bool> MergeData(uint64_t prev, uint64_t prev_len, uint64_t next, uint64_t root, uint64_t ino,
                         uint64_t offset);

  // The whole commit, or with `tail` its first half only: the caller runs
  // tail->Finish() (txn/commit_tail.h), and may let changes of the next
  // transaction run before. Nothing that writes a superblock (the next
  // commit, a tree log's sync) gets ahead of Finish().
  Status Commit(CommitTail* tail = nullptr);

  // ---- Tree-log replay (src/log/) ----
  // A block of a log tree: it has no extent item and is free in the free
  // space tree, but must not be handed out before the replay is committed
  // (the kernel pins it). It is free again after the commit.
  Status PinLogBlock(uint64_t bytenr);
  // A data extent a log tree's file extent item points at. If the extent
  // tree has it (committed before the crash), returns false; otherwise its
  // space is taken from now on and it becomes a data extent of this
  // transaction (its EXTENT_ITEM is made from the refs added with
  // AddDataRef; none: it is freed again), and true is returned. EUCLEAN when
  // an extent item of another length is there or the space is in use.
  Result<bool> AdoptLoggedExtent(uint64_t bytenr, uint64_t num_bytes);
  // Replaces the checksums of [logical, logical + sectors) with `sums`
  // (one checksum per sector, CsumSize bytes each).
  Status ReplaceCsums(uint64_t logical, std::span<const uint8_t> sums);
  // The next commit writes the superblock even if no tree changed (the
  // replay's commit clears log_root whatever the log held).
  void ForceSuperblockWrite() { force_super_ = true; }

  // ---- Tree-log writing (src/log/tree_log.cc) ----
  // A block for an fsync's log tree: metadata space that was free at the
  // last commit, with no extent item (log blocks never get one), pinned
  // until the next commit so nothing else takes it; free in the free space
  // tree that commit writes. ENOSPC rather than a new chunk: a log must lie
  // in chunks the committed chunk tree has.
  Result<uint64_t> AllocLogBlock();
  // New chunks made in the running transaction: a log may not point into
  // them (a replay maps addresses through the committed chunk tree).
  bool HasNewChunks() const { return chunk_alloc_->HasPending(); }
  const tree::HeaderTemplate& header_template() const { return dirty_->header_template(); }

  // Makes tree `new_id` a snapshot of tree `src`, whose root must be
  // committed (snapshot.cc): its root item (uuid given, parent uuid the
  // source's, read-only or not), its own copy of the source's root block.
  // Root refs, the directory entry and the UUID tree are the caller's.
  Status SnapshotTree(uint64_t src, uint64_t new_id, bool read_only, const uint8_t (&uuid)[format::kUuidSize]);
  // A new tree `id` of one empty leaf with `item` as its ROOT_ITEM at
  // (id, ROOT_ITEM, item_offset); bytenr, level and generations are set here.
  Result<tree::TreeWriter*> CreateTree(uint64_t id, format::RootItem item, uint64_t item_offset);
  // Subvolume deletion, in steps a crash cannot break (drop_tree.cc).
  // MarkTreeDead makes committed tree `root` unreachable (NotFound from now
  // on) and records that it is to be dropped: ROOT_ITEM refs 0 and an
  // ORPHAN_ITEM. DropTreeStep drops up to `max_blocks` more of its blocks
  // (adding them to *freed): every block and data extent only it held is
  // freed, shared ones lose its reference. It records where it stopped in
  // the ROOT_ITEM and returns false, or, done, removes the ROOT_ITEM and the
  // orphan item and returns true. Commit after each call.
  Status MarkTreeDead(uint64_t root);
  Result<bool> DropTreeStep(uint64_t root, uint64_t max_blocks, uint64_t* freed);
  // Trees that are dead and not yet dropped (by us or the kernel): the
  // root tree's orphan items.
  Result<std::vector<uint64_t>> DeadTrees();

  // tree::BlockAllocator
  Result<uint64_t> AllocTreeBlock(uint64_t owner, int level) override;
  Status FreeTreeBlock(uint64_t bytenr, uint64_t owner, int level, bool created_here) override;
  // Tree `owner` stops pointing at committed block b (copied, or its
  // pointers merged into another block): the references of b's children
  // follow the kernel's rules for shared blocks (shared_cow.cc).
  Status RetireCommitted(const tree::TreeBlock& b, uint64_t owner) override;

  // ---- Quotas (qgroups.cc): exact at every commit where the image has them ----
  bool quotas_on() const { return quotas_ != nullptr; }
  // EDQUOT when `bytes` more data in subvolume `root` would pass a limit of
  // its qgroups (counting what this transaction has written so far).
  Status CheckQuota(uint64_t root, uint64_t bytes);
  // Counts every qgroup anew from the committed state (txn/qgroup_recount.h)
  // and clears the status's INCONSISTENT and RESCAN flags, as the kernel's
  // rescan does; this transaction's own changes are counted at its commit
  // as always. ENOENT without quotas; EINVAL for simple quotas, or after a
  // snapshot in this transaction (commit first).
  Status RescanQuotas();
  // The qgroup of a new subvolume; of a snapshot (just made by
  // SnapshotTree) when inherit_from is its source: the source's numbers are
  // inherited at the next commit. dir_root is the subvolume whose directory
  // gets the new entry (simple quotas: its higher-level qgroups are joined).
  Status NewQgroup(uint64_t root, uint64_t inherit_from, uint64_t dir_root);

  TxnStats stats() const {
    TxnStats s = stats_;
    s.data_bytes_written = data_bytes_written_.load(std::memory_order_relaxed);
    return s;
  }
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
  std::unique_lock<AllocMutex> AllocLock() { return std::unique_lock(alloc_mu_); }
  alloc::SpaceManager& space() { return *space_; }
  // New chunks when space runs out, ENOSPC, the metadata reserve (chunk_alloc.h).
  ChunkAllocator& chunk_alloc() { return *chunk_alloc_; }
  // Superblock-stripe bytes of the block group at group_start that the
  // space manager counts as used (its block group item leaves them out).
  uint64_t ExcludedIn(uint64_t group_start) const;
  // Relocation (txn/extent_relocation.h): while `on`, the block group at
  // `start` hands out no space, and the commit that leaves it with nothing
  // in use deletes it with its chunk, read-only as it is (unused_groups.cc).
  Status SetRelocating(uint64_t start, bool on);
  // One committed tree block for MoveTreeBlocks: all its back references
  // (by tree, by parent), the blocks that point at it, the trees whose root
  // it is.
  struct BlockMove {
    uint64_t bytenr = 0;
    int level = 0;
    std::vector<RefId> refs;
    std::vector<uint64_t> parents;
    std::vector<uint64_t> root_of;
  };
  // Copies each block to a new address once, however many trees share it,
  // and points every parent and root at the copy (txn/block_move.cc); file
  // extent items of the moved leaves that map a key of `data` map its value
  // instead. The parents of each block must be among `moves` (the closure up
  // to the roots), all unchanged in this transaction. The moved trees keep
  // their ctransid and ctime (nothing in them changed for their users).
  Status MoveTreeBlocks(const std::vector<BlockMove>& moves, const std::map<uint64_t, uint64_t>& data);
  // Simple quotas: the tree a moved data extent's copy is charged to (and
  // its EXTENT_OWNER_REF names), the original's owner rather than whichever
  // reference comes first; after MoveTreeBlocks queued the copy's refs.
  void SetDataOwner(uint64_t bytenr, uint64_t owner);
  // Whether tree block `bytenr` references its children by parent
  // (FULL_BACKREF), as copy on write and MoveTreeBlocks take it.
  bool FullBackref(uint64_t bytenr);

 private:
  explicit TxnManager(Volume* vol) : vol_(vol) {}
  friend class CommitTail;
  // ---- The commit (commit.cc) ----
  Status CommitFirstHalf(CommitTail& t);
  Status CommitSecondHalf(CommitTail& t);
  Status Load(bool allow_log);
  // ---- Block groups (block_groups.cc) ----
  Status LoadBlockGroups();
  Status NoteBlockGroupItem(const format::Key& k, std::set<uint64_t>* seen);
  Status ExcludeSuperStripes();
  // ---- The free space tree (free_space_tree.cc) ----
  Status CheckFreeSpaceTree();
  // An image without a valid free space tree gets one built from the
  // extent tree, and its v1 space cache dropped, as the kernel's mount with
  // space_cache=v2 does; the open commits it at once.
  Status RebuildFreeSpaceTree();
  Status DropStaleFreeSpaceItems();
  // Every free space tree item of [start, start + len) (a group cut or deleted).
  Status DeleteFreeSpaceEntries(uint64_t start, uint64_t len);
  // ---- Unused block groups (unused_groups.cc) ----
  // Deletes every block group the running transaction left empty that may
  // go, with its chunk; sets *changed if any did.
  Status DeleteUnusedGroups(bool* changed);
  Result<bool> GroupItemsPresent(const alloc::ChunkInfo& c);
  Status DeleteGroup(const alloc::ChunkInfo& c);
  std::set<uint64_t> relocating_;  // block groups being emptied (SetRelocating)
  std::set<uint64_t> moved_only_;  // trees whose roots only MoveTreeBlocks moved this transaction
  // Mixed groups: room for len bytes of data beyond what metadata keeps
  // back, adding chunks as needed; ENOSPC when the device is full. Under the
  // allocation lock.
  Status KeepMixedMetadataRoom(uint64_t len);
  std::vector<format::Key> stale_fst_keys_;  // items of block groups that do not exist
  Result<int> DropSpaceCacheV1();
  // ---- Delayed references (delayed_refs.cc) ----
  // The net reference changes of one extent in the running transaction.
  struct PendingExtent {
    bool tree = false;
    bool fresh = false;       // allocated in this transaction: no extent item yet
    int64_t base_refs = -1;   // committed tree block: its refs when first touched (-1: not known)
    uint64_t num_bytes = 0;   // data: the EXTENT_ITEM's length
    int level = 0;            // tree: the METADATA_ITEM's level
    uint64_t set_flags = 0;
    // Simple quotas charge it: data, the tree of the first reference added;
    // a new tree block, the tree that allocated it (its header owner).
    uint64_t owner = 0;
    mem::FewMap<RefId, int64_t> refs;
  };
  void QueueRef(uint64_t bytenr, bool tree, uint64_t size_or_level, const RefId& r, int64_t delta);
  Status RunDelayedRefs(bool* changed);
  // Writes one extent's changes into its EXTENT_ITEM/METADATA_ITEM and its
  // keyed ref items; an extent left with no reference is deleted (and a data
  // extent's space and checksums released).
  Status ApplyExtent(uint64_t bytenr, const PendingExtent& p);
  Status CreateExtent(uint64_t bytenr, const PendingExtent& p);
  // Images without skinny-metadata (mkfs.btrfs before 3.18) keep a tree
  // block's references in an EXTENT_ITEM (bytenr, nodesize) whose body has
  // a TreeBlockInfo before the inline refs; converted ones may hold both forms.
  bool skinny_metadata() const { return vol_->super().incompat_flags.get() & format::kIncompatSkinnyMetadata; }
  format::Key OldTreeBlockKey(uint64_t bytenr) const {
    return format::Key{bytenr, format::kExtentItemKey, vol_->nodesize()};
  }
  // Deletes a tree block's METADATA_ITEM and any keyed ref items of it.
  Status DeleteTreeBlockItems(uint64_t bytenr, int level);
  // A committed tree block shared between trees or referenced by parent:
  // its reference count and flags now (shared_cow.cc).
  struct BlockInfo {
    int64_t refs = 1;
    uint64_t flags = 0;
  };
  BlockInfo InfoOf(uint64_t bytenr) const;
  void ChangeCommittedRef(uint64_t bytenr, int level, const RefId& r, int delta);
  // References for every pointer of committed block b (child blocks, or the
  // data extents of its file extent items): keyed by `root`, or by b as
  // parent when root is 0.
  void ChangeChildRefs(const tree::TreeBlock& b, uint64_t root, int delta);
  // A shared block its owner lets go of: its children gain references by
  // parent (b) and b turns FULL_BACKREF, as update_ref_for_cow does.
  void ReferenceChildrenByParent(const tree::TreeBlock& b);
  Status NoteExtentItemForCow(const format::Key& k, uint64_t refs, uint64_t flags);
  // One block of tree `root` (made at transaction `created`) being dropped,
  // reached through `via`, and all of it the tree alone holds (drop_tree.cc).
  Status DropBlock(uint64_t root, uint64_t created, uint64_t bytenr, int level, uint64_t generation, const RefId& via,
                   uint64_t* freed);
  // Every block tree `root` owns from b down turns to references by parent.
  Status HandOverOwned(uint64_t root, uint64_t created, const tree::TreeBlock& b);
  Status FreeDroppedBlock(uint64_t bytenr, int level, const RefId& via, uint64_t* freed);
  Status UpdateBlockGroups(bool* changed);
  // ---- Quotas (qgroups.cc) ----
  struct Qgroup {
    uint64_t rfer = 0, excl = 0;
    uint64_t rfer_cmpr = 0, excl_cmpr = 0;  // as loaded (simple quotas never change them)
    uint64_t reserved = 0;  // data written this transaction (for limits)
    format::QgroupLimitItem limit{};
    bool dirty = false;
    std::vector<uint64_t> parents;
  };
  struct Touched {
    uint64_t bytenr = 0, len = 0;
    std::set<uint64_t> old_roots;
  };
  struct QuotaState {
    bool simple = false;                  // simple quotas (simple_quota.cc)
    uint64_t enable_gen = 0;              // simple: extents older than this are nobody's
    std::map<uint64_t, Qgroup> groups;    // by qgroup id
    tree::RootPtr committed_extent;       // the extent tree as last committed
    std::map<uint64_t, uint64_t> extra;   // extents to account beyond the refs changed (drops)
    struct Inherit {
      uint64_t src = 0, dst = 0;
      uint64_t src_root = 0, dst_root = 0;  // their root blocks when the snapshot was taken
    };
    std::vector<Inherit> inherits;
    std::vector<Touched> touched;         // this commit's extents
    std::vector<uint64_t> dropped;        // simple: subvolumes whose drop finished this transaction
    // Simple: owners of the tree blocks whose items this transaction
    // inserted. A later commit round may free one again (a global tree's
    // block emptied), and by then it is in no tree and not on disk to read.
    std::map<uint64_t, uint64_t> new_blocks;
    bool rescan_at_open = false;     // the kernel's rescan was not finished
    bool mark_inconsistent = false;  // set INCONSISTENT in the status at the next write
    bool status_written = false;     // the status item has this transaction's generation
  };
  Status LoadQuotas();
  std::set<uint64_t> QgroupsOf(const std::set<uint64_t>& roots) const;
  Status TraceDroppedSubtree(uint64_t bytenr, int level, uint64_t generation);
  Status PrepareQuotaAccounting();
  Status AccountQuotas();
  Status WriteQgroupItems();
  Status WriteQgroupStatus();
  bool QgroupsDirty() const;
  void QuotasCommitted();
  // ---- Simple quotas (simple_quota.cc) ----
  bool simple_quotas() const { return quotas_ && quotas_->simple; }
  Status NewSimpleQgroup(uint64_t root, uint64_t dir_root);
  Status SquotaDelta(uint64_t root, uint64_t num_bytes, uint64_t generation, bool add);
  // The owner ref a new data extent's item starts with, and its charge.
  Result<uint64_t> NewDataOwner(const PendingExtent& p);
  // The qgroups of fully dropped subvolumes that own nothing any more go,
  // as the kernel's btrfs_qgroup_cleanup_dropped_subvolume removes them.
  Status RemoveDroppedQgroups();
  // A committed extent's item goes: the owner gets its bytes back.
  Status SquotaExtentDeleted(uint64_t bytenr, bool tree, int level, uint64_t num_bytes,
                             const std::vector<uint8_t>* item);
  Status UpdateRootItems(bool* changed);
  Status DeleteCsums(uint64_t start, uint64_t len);
  // Checksums, verifies and places every dirty block (commit.cc); writes
  // them.
  Status SealDirtyBlocks(SealedBlocks* out);
  Status WriteSealedBlocks(const SealedBlocks& sealed);
  std::vector<std::pair<uint64_t, uint64_t>> TreeFreeExtents(const alloc::BlockGroup& g) const;
  void MarkGroupDirty(uint64_t logical);

  Volume* vol_;
  uint64_t bg_tree_ = format::kExtentTreeObjectid;
  AllocMutex alloc_mu_;  // see AllocLock()
  std::unique_ptr<alloc::SpaceManager> space_;
  std::unique_ptr<tree::DirtyBlocks> dirty_;
  std::map<uint64_t, std::unique_ptr<tree::TreeWriter>> writers_;
  // The global trees' writers (the csum tree's with every data write),
  // found without the allocation lock. A writer lives as long as this.
  static constexpr uint64_t kFastWriters = 16;
  std::array<std::atomic<tree::TreeWriter*>, kFastWriters> fast_writers_{};
  // Reference changes since the last commit, by extent bytenr.
  // The two maps below take a node per extent a transaction changes (40,000
  // for 40,000 small files) and give them all back at its commit; from a
  // pool the next transaction gets them again, where glibc gave the heap's
  // top back to the system and faulted it in again (sysmalloc, 4-5% of a
  // 4 KiB create run on the VM of session 33). Under the allocation lock,
  // as the maps are.
  // Chunks of at most 256 nodes: the pool's doubling chunks would hold up
  // to twice a transaction's nodes, 0.3 MB of an image build's peak.
  std::pmr::unsynchronized_pool_resource ref_nodes_{std::pmr::pool_options{256, 0}};
  std::pmr::map<uint64_t, PendingExtent> pending_{&ref_nodes_};
  std::pmr::map<uint64_t, uint64_t> new_data_{&ref_nodes_};  // data extents allocated this transaction: bytenr -> length
  std::set<uint64_t> dirty_groups_;           // starts of groups whose space changed
  std::map<uint64_t, uint64_t> excluded_;     // group start -> superblock-stripe bytes in it
  std::vector<std::pair<uint64_t, uint64_t>> excluded_ranges_;
  std::vector<uint64_t> freed_blocks_;        // tree blocks freed this transaction (cache invalidation)
  // Committed tree blocks with more than one reference (snapshots) or the
  // FULL_BACKREF flag (snapshots, relocation), kept current as references
  // change; every other committed block has one reference, keyed by its
  // tree. any_shared_ is false while there are none: copy on write then
  // needs no lookup at all.
  std::unordered_map<uint64_t, BlockInfo> shared_info_;
  std::atomic<bool> any_shared_{false};
  // Data bytes written since the device was last told to start writing
  // back (WriteData): so that a commit's flush waits for the tail only.
  std::atomic<uint64_t> data_since_hint_{0};
  std::atomic<uint64_t> data_bytes_written_{0};  // stats(): counted without the allocation lock
  // Tree blocks whose references are items of their own (not inline).
  std::map<uint64_t, std::vector<format::Key>> tree_ref_items_;
  TxnStats stats_;
  bool force_super_ = false;
  // The superblock said the UUID tree was up to date (uuid_tree_generation
  // equal to the generation): every commit keeps saying so, since every
  // subvolume ubtrfs adds, receives into or deletes updates that tree.
  // Stale or 0 (mkfs.btrfs, or a kernel that had not finished its scan),
  // it stays stale and the kernel's next mount rescans.
  bool uuid_tree_current_ = false;
  friend class ChunkAllocator;
  friend class DeviceLayout;  // relocate.cc: offline layout changes
  std::unique_ptr<ChunkAllocator> chunk_alloc_;
  std::unique_ptr<QuotaState> quotas_;  // null: the image has no quotas
};

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_TRANSACTION_H_
