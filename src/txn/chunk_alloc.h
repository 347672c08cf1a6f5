// New chunks on the devices when a kind of space (DATA, METADATA, SYSTEM)
// runs out, as the kernel's btrfs_alloc_chunk does, and ENOSPC once the
// devices are full.
//
// Two phases, like the kernel since 5.x (btrfs_create_pending_block_groups):
//
//  1. In memory (NewChunk, called from SpaceManager's new-chunk hook, which may
//     fire deep inside a tree operation, e.g. while the extent tree is being
//     split): pick device space and a logical address, add the chunk to the
//     chunk map and a block group to the SpaceManager, exclude superblock
//     stripes, mark the group dirty. No tree is touched, so this is safe
//     anywhere and never allocates tree blocks itself: there is no
//     re-entrancy, whichever kind ran out.
//  2. Items (FinishPending, run by TxnManager::Commit before the block group
//     items are updated): CHUNK_ITEM and DEV_ITEM.bytes_used in the chunk
//     tree, DEV_EXTENTs in the dev tree, BLOCK_GROUP_ITEM in the extent tree,
//     the superblock's dev_item and, for SYSTEM chunks, sys_chunk_array. The
//     free space tree entries follow from the dirty group. Tree blocks these
//     inserts need come from the groups registered in phase 1; running out
//     there adds more pending chunks, which the same loop finishes.
//
// Sizes (per chunk, logical length; device total T = DEV_ITEM total_bytes):
//   DATA      min(1 GiB, T/10)          profile as the image's data chunks (single)
//   METADATA  min(256 MiB, T/10)        (1 GiB above 50 GiB devices; DUP)
//   SYSTEM    min(32 MiB, T/10)         (DUP)
// rounded down to 1 MiB, never below what the allocation asked for (T:
// all present devices together; a striped chunk's stripes share it). When
// the device has less room the chunk shrinks to what fits (multiples of
// 64 KiB, at least the request); when not even that fits: ENOSPC. DUP puts
// both stripes in one hole when it can (as the kernel does), else in two.
// Stripes start on 64 KiB boundaries in [1 MiB, T); logical addresses start
// 1 MiB-aligned above the highest chunk.
//
// Several devices (as the kernel's gather_device_info): the profile is the
// most redundant one the existing chunks of that kind use, reduced as the
// kernel's btrfs_reduce_alloc_profile when fewer devices are present than
// it needs (a degraded RAID1 with one device left gets single chunks).
// Devices are ranked by their largest free range; the profile takes as many
// as it may (RAID1: 2, RAID1C3: 3, RAID0/RAID10/RAID5/RAID6: all, RAID10 in
// pairs), each stripe as long as the smallest of those ranges allows. SINGLE
// and DUP go on the device with the largest free range.
//
// Metadata reserve: a transaction must stay committable after an operation
// got ENOSPC, and committing needs metadata (extent items for every block
// the transaction touched, block group items, the free space tree, root
// items). So outside a commit, tree block allocation keeps
//   CommitReserve() = nodesize * (64 + blocks dirtied by this transaction)
//                     + kCommitBytesPerRef * extent references still to apply
//                     + the tree changes the layers above queued for it
// free: when free metadata would drop below it a metadata chunk is added
// early, and when the device has no room for one the allocation fails with
// ENOSPC while the reserve is still there for Commit() to use. Before a DATA
// chunk is made, a metadata chunk is added first when metadata is below
// twice the reserve, so data cannot take the last device space from under
// the metadata the data extents will need. ReserveMetadata(items) lets an
// operation ask up front (kernel style: 2 * kMaxLevel blocks per item) and
// get ENOSPC before it changes anything; ordinary changes also leave the
// global reserve (txn/space_reserve.h) free, deletions may use it.
//
// If a commit still runs out (the reserve is an estimate), Commit() fails
// with ENOSPC before anything is written: the last committed image stays.
//
// Single-threaded like TxnManager; mu_ only orders hook calls (which arrive
// with SpaceManager's chunk mutex held) against direct calls.
#ifndef UBTRFS_TXN_CHUNK_ALLOC_H_
#define UBTRFS_TXN_CHUNK_ALLOC_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "alloc/chunk_map.h"
#include "format/ondisk.h"
#include "txn/space_reserve.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {

class TxnManager;

// Where the stripes of a new chunk go. holes: free device ranges (start,
// length), ascending, 64 KiB aligned. Wants `want` bytes per stripe, accepts
// down to `min_len` (both multiples of 64 KiB). Returns the stripe starts and
// sets *len, or ENOSPC. Exposed for tests.
Result<std::vector<uint64_t>> PlaceStripes(const std::vector<std::pair<uint64_t, uint64_t>>& holes, int nstripes,
                                           uint64_t want, uint64_t min_len, uint64_t* len);

struct ChunkAllocStats {
  uint64_t chunks[3] = {0, 0, 0};  // created, by kind bit (data, system, metadata)
  uint64_t early_metadata_chunks = 0;  // added for the reserve, not because space ran out
  uint64_t enospc = 0;                 // times no chunk fitted on the device
  uint64_t finished = 0;               // chunks whose items are in the trees
  uint64_t removed = 0;                // chunks deleted with their emptied block group
};

class ChunkAllocator {
 public:
  static constexpr uint64_t kDeviceStart = 1ull << 20;  // the kernel leaves the first MiB alone
  static constexpr uint64_t kStripeLen = 64 * 1024;
  static constexpr uint64_t kLogicalAlign = 1ull << 20;
  static constexpr uint64_t kCommitReserveBlocks = 64;
  // What the commit's tree changes take per extent reference still to be
  // applied (an entry of the pending or new-data maps: its extent item,
  // the csum and free space tree entries it changes, their leaves' splits).
  // Measured: a transaction of 2,833 pending references (fsstress writes
  // and truncates, 4 KiB nodes, mixed groups) took 386 new tree blocks to
  // commit, about 280 bytes per entry of the two maps.
  static constexpr uint64_t kCommitBytesPerRef = 384;
  static constexpr uint64_t kBlocksPerItem = 2 * format::kMaxLevel;

  explicit ChunkAllocator(TxnManager* txn) : txn_(txn) {}
  ChunkAllocator(const ChunkAllocator&) = delete;
  ChunkAllocator& operator=(const ChunkAllocator&) = delete;

  // Reads the DEV_ITEM and the dev extents, and the profile of each kind.
  Status Load();

  // Phase 1 (the SpaceManager new-chunk hook): a chunk of `kind` (exactly one
  // of DATA, METADATA, SYSTEM) with a free run of at least min_len bytes.
  Status NewChunk(uint64_t kind, uint64_t min_len);
  // Phase 2: items for every chunk made since the last call.
  Status FinishPending(bool* changed);
  bool HasPending() const;

  // Bytes of free metadata kept back for committing the running transaction:
  // a base, the blocks it dirtied so far, and what applying its pending
  // extent references will take. Callers hold the transaction's allocation
  // lock (the reference maps change under it).
  uint64_t CommitReserve() const;
  // Makes sure metadata has `items` insertions' worth of room on top of the
  // commit reserve and, for an ordinary change, the global reserve
  // (txn/space_reserve.h), adding chunks as needed; ENOSPC when the device
  // is full.
  Status ReserveMetadata(uint64_t items, ReserveFor who = ReserveFor::kChange);
  // ReserveMetadata's common case (an ordinary change) without a lock: true
  // when the metadata space free at the last full check, less every metadata
  // block allocated since, still covers `items` (with the commit and global
  // reserves and room to spare). False says nothing: take the locks and call
  // ReserveMetadata.
  bool MetadataSurelyFree(uint64_t items) const;
  // The global reserve as of the last full check (GlobalReserveBytes of the
  // metadata chunks then).
  uint64_t GlobalReserve() const { return global_reserve_.load(std::memory_order_acquire); }
  // Mixed groups (incompat MIXED_GROUPS): data and metadata share every
  // chunk, so data must leave free what metadata keeps back (MixedKeepBack:
  // the commit reserve, the global reserve, the running changes' holds).
  bool mixed() const { return mixed_; }
  // What a change reserved with ReserveMetadata(items) stays held while it
  // runs: with mixed groups its own data allocations (a write's extents,
  // fallocate's) leave it free too, else data takes the room the change's
  // tree edits were promised and one of those fails half way (an abort).
  // Twice the items' blocks: each tree block the change takes also grows the
  // commit reserve by one. The change's own tree blocks, as it takes them
  // (on its thread), come off the hold. Nothing on other filesystems.
  class OpHold {
   public:
    OpHold(ChunkAllocator& ca, uint64_t items)
        : ca_(ca), left_(ca.mixed_ ? 2 * items * kBlocksPerItem * ca.NodeSize() : 0), outer_(current_) {
      if (left_ == 0) return;
      ca_.ops_reserved_.fetch_add(left_, std::memory_order_relaxed);
      current_ = this;
    }
    ~OpHold() {
      if (current_ == this) current_ = outer_;
      if (left_ + data_left_) ca_.ops_reserved_.fetch_sub(left_ + data_left_, std::memory_order_relaxed);
    }
    OpHold(const OpHold&) = delete;
    OpHold& operator=(const OpHold&) = delete;

   private:
    friend class ChunkAllocator;
    ChunkAllocator& ca_;
    uint64_t left_;
    // Data the change found room for up front (ReserveData) and has not
    // taken yet: other changes' data leaves it free, this change's takes it.
    uint64_t data_left_ = 0;
    OpHold* outer_;
    static thread_local OpHold* current_;
  };
  // ReserveData found room for `bytes` of data: the calling thread's change
  // holds them until its AllocData takes them (TakeHeldData) or it ends.
  void HoldData(uint64_t bytes);
  void TakeHeldData(uint64_t bytes);
  // What data allocations of the calling thread keep free: MixedKeepBack
  // less the data its own change holds.
  uint64_t MixedKeepBackForCaller() const;
  // What the global reserve is sized by (GlobalReserveBytes) for metadata
  // chunks of `metadata_total` bytes.
  uint64_t ReserveBase(uint64_t metadata_total) const;
  uint64_t MixedKeepBack() const {
    return mixed_ ? CommitReserve() + GlobalReserve() + ops_reserved_.load(std::memory_order_relaxed) : 0;
  }
  // TxnManager::AllocTreeBlock counts each metadata block it hands out.
  void NoteMetadataAlloc();
  // The calling thread's change queued `bytes` of commit work (what
  // SetQueuedWork reports grew by that much): it comes off the change's
  // hold, so that the change's own data still finds the room it was
  // promised (with mixed groups the hold and the reserve keep data out
  // alike).
  void NoteQueuedWork(uint64_t bytes) { TakeFromHold(bytes); }
  // TxnManager::AllocTreeBlock asks this before taking a metadata block.
  Status BeforeMetadataBlock();

  // Commit() runs inside one: its allocations may use the reserve.
  class CommitScope {
   public:
    explicit CommitScope(ChunkAllocator* a) : a_(a) { a_->committing_ = true; }
    ~CommitScope() { a_->committing_ = false; }
    CommitScope(const CommitScope&) = delete;
    CommitScope& operator=(const CommitScope&) = delete;

   private:
    ChunkAllocator* a_;
  };
  // Tree changes the layers above keep queued for the commit (delayed
  // dir items and dir-index batches, delayed inode updates) are part of
  // the commit's work, done at the commit or earlier: `bytes` says what
  // the reserve keeps for them (read at every reserve check, from any
  // thread: lock-free and cheap). Set before any change runs.
  void SetQueuedWork(std::function<uint64_t()> bytes) { queued_work_ = std::move(bytes); }
  // Applying queued work (on the calling thread, while one lives): its
  // tree blocks come out of the reserve that was kept for it, as the
  // commit's own do. Without this an early or commit-time flush could fail
  // half way on the very room it was promised (an abort).
  class QueuedWorkScope {
   public:
    QueuedWorkScope() { ++depth_; }
    ~QueuedWorkScope() { --depth_; }
    QueuedWorkScope(const QueuedWorkScope&) = delete;
    QueuedWorkScope& operator=(const QueuedWorkScope&) = delete;

   private:
    friend class ChunkAllocator;
    static thread_local int depth_;
  };

  // ---- Chunks of emptied block groups (txn/unused_groups.cc) ----
  // Whether chunk `c` may be deleted: not a system chunk (the superblock's
  // array holds those), not made in the running transaction (a chunk added
  // early for the reserve would come and go with every commit), and every
  // stripe on a present device of ours (a missing or seed device's
  // DEV_ITEM is left as it is).
  bool Removable(const alloc::ChunkInfo& c) const;
  // Deletes its CHUNK_ITEM and DEV_EXTENTs and lowers bytes_used of its
  // devices (DEV_ITEMs, superblock). Its device space stays taken until
  // ReleaseRemoved(): until this commit is on disk, the committed chunk
  // tree still maps it there. Its logical range is never handed out again
  // in this process (blocks are cached by logical address).
  Status RemoveChunk(const alloc::ChunkInfo& c);
  // The commit that deleted chunks is on disk: their device space is free.
  void ReleaseRemoved();
  // The running transaction's commit is sealed: its chunks are old now.
  void TransactionSealed();

  // The size NewChunk aims for (before fitting it to the device).
  uint64_t TargetSize(uint64_t kind) const;
  uint64_t Profile(uint64_t kind) const;
  // Free device ranges as NewChunk sees them (every present device's, one
  // after the other).
  std::vector<std::pair<uint64_t, uint64_t>> FreeDeviceRanges() const;
  // Each present device's DEV_ITEM total_bytes and the bytes its dev
  // extents take now (new chunks included): what statfs counts from.
  std::vector<std::pair<uint64_t, uint64_t>> DeviceUsage() const;
  uint64_t device_bytes() const { return device_end_; }
  const ChunkAllocStats& stats() const { return stats_; }

 private:
  friend class DeviceLayout;  // relocate.cc moves and trims dev extents
  struct Pending {
    uint64_t logical = 0;
    uint64_t length = 0;
    uint64_t type = 0;
    uint64_t stripe_size = 0;  // each dev extent's length
    std::vector<std::pair<uint64_t, uint64_t>> stripes;  // (devid, physical)
    std::vector<uint8_t> item;  // the CHUNK_ITEM body
  };
  struct Dev {
    format::DevItem item{};                 // as loaded (devid, uuid, total_bytes)
    uint64_t end = 0;                       // usable bytes: min(total_bytes, device size)
    uint64_t bytes_used = 0;                // dev extents in the dev tree (incl. finished new ones)
    std::map<uint64_t, uint64_t> extents;   // physical start -> length, committed and new
  };

  std::vector<std::pair<uint64_t, uint64_t>> FreeRanges(const Dev& d) const;
  std::vector<std::pair<uint64_t, uint64_t>> FreeDeviceRangesLocked() const;
  // Picks devices and stripe places for a chunk of `profile`: fills
  // stripes (devid, physical) and *stripe_size, or ENOSPC.
  Status PlaceChunk(uint64_t profile, uint64_t want, uint64_t need, std::vector<std::pair<uint64_t, uint64_t>>* stripes,
                    uint64_t* stripe_size) const;
  Status NewChunkLocked(uint64_t kind, uint64_t min_len);
  // Metadata free space must reach `need` bytes; adds chunks (phase 1).
  Status EnsureMetadataFree(uint64_t need, const std::string& why);

  Status FinishOne(const Pending& p);
  // DEV_ITEM.bytes_used of these devices (from devs_) in the chunk tree,
  // the volume's copy and the superblock's.
  Status WriteBytesUsed(const std::set<uint64_t>& devids);

  TxnManager* txn_;
  mutable std::recursive_mutex mu_;  // NewChunk may be re-entered via EnsureMetadataFree
  std::map<uint64_t, Dev> devs_;     // present devices, by devid
  uint8_t chunk_tree_uuid_[format::kUuidSize] = {};
  uint64_t device_end_ = 0;          // all present devices' usable bytes
  uint64_t profile_[3] = {0, format::kBlockGroupDup, format::kBlockGroupDup};  // by kind bit
  std::vector<Pending> pending_;
  std::set<uint64_t> made_this_txn_;  // logical starts
  std::vector<std::pair<uint64_t, uint64_t>> removed_stripes_;  // (devid, physical) until ReleaseRemoved
  uint64_t logical_floor_ = 0;  // the end of the highest chunk removed
  bool committing_ = false;
  ChunkAllocStats stats_;
  // MetadataSurelyFree's figures. Free bytes are stored before the count
  // they go with, and read after it, so a reader that meets a newer free
  // figure with an older count only underestimates.
  alignas(64) std::atomic<uint64_t> meta_allocs_{0};
  alignas(64) std::atomic<uint64_t> checked_free_{0};
  std::atomic<uint64_t> checked_allocs_{0};
  std::atomic<uint64_t> global_reserve_{0};
  // The pending references CommitReserve counted last, for the lock-free
  // MetadataSurelyFree.
  mutable std::atomic<uint64_t> refs_seen_{0};
  std::atomic<uint64_t> ops_reserved_{0};  // OpHold
  std::function<uint64_t()> queued_work_;
  bool mixed_ = false;  // set by Load
  uint64_t NodeSize() const;
  void TakeFromHold(uint64_t bytes);
  // The calling thread's innermost hold, if it is on this allocator.
  OpHold* OwnHold() const;
  // CommitReserve with `refs` extent references still to apply.
  uint64_t CommitReserveFor(uint64_t refs) const;
};

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_CHUNK_ALLOC_H_
