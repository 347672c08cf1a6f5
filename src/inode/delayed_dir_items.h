// Delayed DIR_ITEM insertions for busy directories, behind an exact index
// of the directory's name hashes.
//
// A create must know that its name is new, and a DIR_ITEM is keyed by the
// name's hash, so in a large directory every create used to descend to a
// random, cold leaf, search it and shift half of it to make room (about 40%
// of a create's time in a 100,000-entry directory). A directory that takes
// many creates gets an index instead: every DIR_ITEM hash it has in the tree
// or pending (built once by a scan of its DIR_ITEM keys). A new name whose
// hash the index does not hold cannot exist: its DIR_ITEM is queued, and
// the queue is inserted in hash order when it reaches a batch, so that
// neighbouring inserts find their leaf hot in the cache. A hash the index
// holds (a collision, or a name that exists or existed) sends the caller to
// the immediate path after a flush of the directory.
//
// The index also answers lookups: a hash it does not hold is a negative
// lookup without a tree search; a pending hash is answered from the queue.
// It only grows (removed names stay in it, which costs a fallback, never a
// wrong answer). Memory: 16 bytes per entry of an indexed directory (an
// open-addressing table at most half full), plus the queued items (kept in
// one buffer per directory, as large as its largest queue).
//
// Counters (ubtrfs stats): dir_items.indexes (directories indexed),
// dir_items.queued, dir_items.flushed (queued items inserted by flushes),
// dir_items.fallbacks (adds whose hash the index held), dir_items.negative
// (lookups answered "absent" by an index).
//
// Thread safety: all calls may come from any thread. Changes to one
// directory (Add, NoteInserted, SetIndex, FlushDir, Forget) come from the
// holder of the directory (the file system's per-directory lock) or from a
// commit that has the file system to itself; Find may run beside them.
// FlushDir keeps items visible in the queue until they are in the tree.
#ifndef UBTRFS_INODE_DELAYED_DIR_ITEMS_H_
#define UBTRFS_INODE_DELAYED_DIR_ITEMS_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "format/ondisk.h"
#include "inode/dir_shard.h"
#include "mem/huge_pages.h"
#include "ubtrfs/status.h"

namespace ubtrfs::inode {

// A set of 32-bit name hashes, each with a 32-bit value (open addressing,
// linear probing, at most half full).
class HashSlots {
 public:
  // Whether hash is present; its value in *value.
  bool Find(uint32_t hash, uint32_t* value = nullptr) const;
  // Sets hash's value, inserting hash if absent.
  void Set(uint32_t hash, uint32_t value);
  // Inserts hash with value unless present (one probe for both); whether it
  // inserted.
  bool Insert(uint32_t hash, uint32_t value);
  size_t size() const { return used_; }

 private:
  struct Slot {
    uint32_t hash = 0;
    uint32_t tag = 0;  // value + 1; 0: empty
  };
  size_t SlotOf(uint32_t hash) const;
  // The slot holding hash, or the empty one where it goes (room made first).
  Slot& SlotFor(uint32_t hash);
  void Grow();
  // A directory of a million names has a table of 16 MB, doubled as it
  // grows: in huge pages, its faults are a few hundred, not thousands.
  std::vector<Slot, mem::HugePageAllocator<Slot>> slots_;
  size_t used_ = 0;
};

class DelayedDirItems {
 public:
  // A directory is indexed after index_after creates in it (then every
  // index_after more) once the scan is worth it: creates * 128 >= its size
  // in bytes (entries cost 2 x name length of directory size; a scan reads
  // ~100 bytes per entry). A directory's queue is flushed at dir_batch items,
  // or whenever all queues together hold total_limit.
  struct Options {
    uint32_t index_after = 1024;
    size_t dir_batch = 16384;
    size_t total_limit = 131072;
  };
  DelayedDirItems() : DelayedDirItems(Options{}) {}
  explicit DelayedDirItems(const Options& o)
      : options_(o), total_step_(std::clamp<size_t>(o.total_limit / 64, 1, 256)) {}

  bool HasIndex(uint64_t root, uint64_t dir) const;
  // Installs the index of dir: every DIR_ITEM hash its tree items have.
  void SetIndex(uint64_t root, uint64_t dir, std::span<const uint64_t> hashes);

  enum class Verdict { kNoIndex, kConsiderIndex, kMayExist, kQueued };
  // kQueued: the hash was unknown, the item (DIR_ITEM bytes) is queued and
  // *flush says whether the caller should flush dir now. kMayExist: nothing
  // changed; the caller flushes dir and takes the immediate path. kNoIndex:
  // the directory has no index; the caller uses the tree.
  // With `creates` given, the call first counts a create in dir (one lookup
  // of the directory for both). An unindexed directory then answers
  // kConsiderIndex every index_after creates, with their count in *creates:
  // the caller may build the index (SetIndex) and Add again, not counting.
  Verdict Add(uint64_t root, uint64_t dir, uint32_t hash, std::span<const uint8_t> item, bool* flush,
              uint64_t* creates = nullptr);
  // A DIR_ITEM with this hash goes into the tree directly (call before the
  // insert, so the index never misses a hash the tree has).
  void NoteInserted(uint64_t root, uint64_t dir, uint32_t hash);

  enum class Probe { kUnknown, kAbsent, kPending };
  // kAbsent: dir has no DIR_ITEM with this hash, queued or in the tree.
  // kPending: *item is the queued DIR_ITEM. kUnknown: ask the tree.
  Probe Find(uint64_t root, uint64_t dir, uint32_t hash, std::vector<uint8_t>* item) const;

  size_t PendingIn(uint64_t root, uint64_t dir) const;
  // The queued items' bytes in leaves (item headers included), as of each
  // directory's last published step: lock-free, for the commit reserve.
  uint64_t queued_bytes() const { return bytes_.load(std::memory_order_relaxed); }
  // Inserts one directory's queued items, ascending hashes (all new to the
  // tree), items[i] the DIR_ITEM of hashes[i].
  using InsertFn = std::function<Status(uint64_t root, uint64_t dir, std::span<const uint32_t> hashes,
                                        std::span<const std::span<const uint8_t>> items)>;
  // Hands dir's queue to `insert` in hash order, then empties it.
  Status FlushDir(uint64_t root, uint64_t dir, const InsertFn& insert);
  // Every directory's queue (commit).
  Status FlushAll(const InsertFn& insert);
  // Drops dir's index and counters (the directory is gone, or is filled by
  // another path). Its queue must be empty.
  void Forget(uint64_t root, uint64_t dir);

 private:
  struct Pending {
    uint32_t hash;
    uint32_t size;    // of the item's bytes
    uint64_t offset;  // in Node::bytes
  };
  struct Node {
    mutable std::mutex mu;  // guards all below
    uint64_t creates = 0;
    bool indexed = false;
    HashSlots index;        // hash -> 0 (in the tree) or position in queue + 1
    std::vector<Pending> queue;
    // The queued items' bytes, one after another: no allocation per item.
    // A flush empties it and keeps its capacity for the next batch.
    std::vector<uint8_t> bytes;
    size_t counted = 0;     // of queue, included in total_
    size_t counted_bytes = 0;  // of queue, included in bytes_
  };
  using NodeRef = std::shared_ptr<Node>;
  struct alignas(64) Shard {
    mutable std::mutex mu;  // guards nodes
    std::map<std::pair<uint64_t, uint64_t>, NodeRef> nodes;
  };
  NodeRef Get(uint64_t root, uint64_t dir) const;
  NodeRef GetOrMake(uint64_t root, uint64_t dir);
  Status FlushNode(uint64_t root, uint64_t dir, Node& n, const InsertFn& insert);
  static constexpr size_t kShards = kDirShards;
  static size_t ShardIndex(uint64_t root, uint64_t dir) { return DirShard(root, dir); }

  Options options_;
  std::array<Shard, kShards> shards_;
  // Queued items, all directories, added in steps of total_step_ per
  // directory so that threads queueing in their own directories do not
  // write one shared line on every create.
  std::atomic<size_t> total_{0};
  size_t total_step_ = 1;
  // The queues' bytes, published in steps of kBytesStep per directory.
  alignas(64) std::atomic<size_t> bytes_{0};
  static constexpr size_t kBytesStep = 1024;
  static size_t QueueBytes(const Node& n) { return n.bytes.size() + sizeof(format::Item) * n.queue.size(); }
};

}  // namespace ubtrfs::inode

#endif  // UBTRFS_INODE_DELAYED_DIR_ITEMS_H_
