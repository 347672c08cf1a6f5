// Delayed dir-index items: creating an entry does not touch the tree's
// DIR_INDEX items; it queues the item on its directory. A flush takes the
// first pending item and every following item whose index is the immediate
// successor, up to what one leaf holds, and inserts that batch with one
// insert_empty_items. Entries removed before a flush never reach the tree.
//
// Thread safety: the map of queues is guarded inside, in shards by
// directory (each with its own lock on its own cache line, so threads adding
// to different directories do not meet); one directory's queue
// (Add, Cancel, Pending, FlushDir for that directory) belongs to whoever holds
// the directory (the file system's per-directory lock), and Flush() needs
// the whole thing to itself (commit).
// Batches are recorded in the stats as delayed_index.batch_items (a log2
// histogram of items per batch) and the delayed_index.* counters.
#ifndef UBTRFS_INODE_DELAYED_INDEX_H_
#define UBTRFS_INODE_DELAYED_INDEX_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "inode/dir_shard.h"
#include "tree/writer.h"

namespace ubtrfs::inode {

struct DelayedIndexStats {
  uint64_t queued = 0;
  uint64_t cancelled = 0;   // removed while pending: never written
  uint64_t batches = 0;     // insert_empty_items calls
  uint64_t full_batches = 0;  // batches that ended because the next item would not fit the leaf
  uint64_t items = 0;       // items inserted by flushes
  std::array<uint64_t, 16> batch_size_log2{};  // batches of [2^i, 2^(i+1)) items
};

// How a flush sizes its batches.
enum class BatchPolicy {
  // Each batch is a run of successors up to what an empty leaf holds
  // (node size minus the leaf header); the tree makes the room.
  kFullLeaf,
  // The kernel's behaviour before the batching fix, kept as the benchmark
  // baseline: a batch stops at the free space of the leaf the first item
  // lands in.
  kLeafFreeSpace,
};

class DelayedDirIndex {
 public:
  explicit DelayedDirIndex(uint32_t nodesize, BatchPolicy policy = BatchPolicy::kFullLeaf)
      : leaf_space_(nodesize - sizeof(format::Header)), policy_(policy) {}

  // Returns how many items the directory has queued now.
  size_t Add(uint64_t root, uint64_t dir, uint64_t index, std::vector<uint8_t> item);
  // True if the item was still pending (and is now gone without a trace).
  bool Cancel(uint64_t root, uint64_t dir, uint64_t index);
  // One directory's queue: (index, item) ascending by index. Creates append
  // (indexes only grow), so a sorted vector takes them without a tree node
  // per item.
  using Queue = std::vector<std::pair<uint64_t, std::vector<uint8_t>>>;
  // Pending items of one directory by index, or nullptr.
  const Queue* Pending(uint64_t root, uint64_t dir) const;
  size_t pending_count() const;
  // The queued items' bytes in leaves (item headers included), as of the
  // last step each directory shard published (kBytesStep): lock-free, for
  // the commit reserve to keep room for them.
  uint64_t queued_bytes() const { return static_cast<uint64_t>(std::max<int64_t>(0, bytes_.load(std::memory_order_relaxed))); }

  using WriterFn = std::function<Result<tree::TreeWriter*>(uint64_t root)>;
  Status Flush(const WriterFn& writer);
  // Flushes one directory. With full_batches_only (the early flush of a
  // directory whose queue grew past a threshold) a trailing run too short to
  // fill a leaf stays queued, so early flushes never write a partial batch
  // that later items could have filled.
  Status FlushDir(uint64_t root, uint64_t dir, const WriterFn& writer, bool full_batches_only = false);

  DelayedIndexStats stats() const;

 private:
  struct Shard;
  Status InsertRun(Shard& sh, tree::TreeWriter* w, std::vector<format::Key>& keys,
                   std::vector<std::vector<uint8_t>>& data, bool full);
  Status InsertRunLegacy(Shard& sh, tree::TreeWriter* w, std::vector<format::Key>& keys,
                         std::vector<std::vector<uint8_t>>& data);
  using Queues = std::map<std::pair<uint64_t, uint64_t>, Queue>;
  struct alignas(64) Shard {
    mutable std::mutex mu;  // guards the map of queues (not a queue's items), count and stats
    Queues pending;
    size_t count = 0;  // queued items
    int64_t unpublished = 0;  // bytes queued or flushed, not yet in bytes_
    DelayedIndexStats stats;
  };
  static constexpr size_t kShards = kDirShards;
  static size_t ShardIndex(uint64_t root, uint64_t dir) { return DirShard(root, dir); }
  Shard& ShardOf(uint64_t root, uint64_t dir) { return shards_[ShardIndex(root, dir)]; }
  const Shard& ShardOf(uint64_t root, uint64_t dir) const { return shards_[ShardIndex(root, dir)]; }
  void RecordBatch(Shard& sh, size_t items, bool full);
  // sh.mu held. Threads queueing in their own directories share bytes_'s
  // line only once per step, not on every create.
  void CountBytes(Shard& sh, int64_t delta);
  static constexpr int64_t kBytesStep = 1024;

  uint32_t leaf_space_;
  BatchPolicy policy_;
  std::array<Shard, kShards> shards_;
  alignas(64) std::atomic<int64_t> bytes_{0};
};

}  // namespace ubtrfs::inode

#endif  // UBTRFS_INODE_DELAYED_INDEX_H_
