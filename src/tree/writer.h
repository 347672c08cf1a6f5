// The write side of the B-tree engine for one tree: copy-on-write searches,
// batched item insertion, deletion, item resize, leaf and node splits,
// merges of underfull blocks, and root growth and shrink.
//
// Every block on a write path is made writable (copied on write) on the way
// down, so a change never touches a block of the last committed tree.
//
// Concurrency (when DirtyBlocks is in concurrent mode; otherwise no lock is
// taken and the caller serializes everything): an operation takes intent
// locks top-down along its path, starting with the tree's root pointer, and
// lets go of every ancestor as soon as it holds a block the operation cannot
// propagate a change out of ("safe": already copied, room for the insert or
// no underflow after the delete, not changing its first key). So updaters of
// different parts of one tree run in parallel, and an updater excludes
// others only from the blocks it may still change. A block's bytes change
// only under its write lock, held just for the change; write locks are taken
// parent before child and left sibling before right, and never while a write
// lock on a lower block is held. Readers (Cursor) continue under intent.
// The leaf is unlocked as soon as its change is made, before the low-key
// fix-ups, merges and frees that follow.
#ifndef UBTRFS_TREE_WRITER_H_
#define UBTRFS_TREE_WRITER_H_

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "tree/cursor.h"
#include "tree/dirty_blocks.h"

namespace ubtrfs::tree {

// One operation's path from the root to a leaf slot, and the intent locks it
// holds on it.
struct WritePath {
  std::array<std::shared_ptr<TreeBlock>, format::kMaxLevel> nodes{};
  std::array<int, format::kMaxLevel> slots{};
  int root_level = -1;             // the root's level when the search began
  bool locking = false;            // concurrent mode: the locks below are taken
  uint32_t held = 0;               // bit l: intent held on nodes[l]
  NodeLock* root_lock = nullptr;   // intent held on the tree's root pointer

  WritePath() = default;
  WritePath(const WritePath&) = delete;
  WritePath& operator=(const WritePath&) = delete;
  ~WritePath() { Release(); }

  TreeBlock& leaf() { return *nodes[0]; }
  int slot() const { return slots[0]; }
  // Puts b at `level`, moving this path's intent lock from the old block.
  void Set(int level, std::shared_ptr<TreeBlock> b);
  // The same for a new block whose intent lock the caller took before any
  // other thread could reach it (before its parent pointed at it).
  void Adopt(int level, std::shared_ptr<TreeBlock> b);
  // Lets go of the intent locks above `level` (and of the root pointer).
  void ReleaseAbove(int level);
  void Release();
};

struct WriterStats {
  std::atomic<uint64_t> leaf_splits{0};
  std::atomic<uint64_t> leaf_pushes{0};  // room made by moving items to sibling leaves
  std::atomic<uint64_t> node_splits{0};
  std::atomic<uint64_t> merges{0};
  std::atomic<uint64_t> root_grows{0};
  std::atomic<uint64_t> root_shrinks{0};
  // Counted only while one thread changes the trees (not in concurrent
  // mode, where every insert would write this shared line):
  std::atomic<uint64_t> batch_inserts{0};  // InsertEmptyItems calls
  std::atomic<uint64_t> items_inserted{0};
  // Concurrent searches are counted in the process stats instead:
  // tree.search.leaf_only (shared locks above an intent-locked leaf) and
  // tree.search.full_path (intent from the root pointer down).
};

class TreeWriter {
 public:
  // `root` is updated in place when the root moves (COW, growth, shrink).
  // root_copy_mu: a mutex under which others copy *root (Volume's root
  // map); root changes take it too. May be null.
  TreeWriter(DirtyBlocks* blocks, RootPtr* root, uint64_t owner, std::mutex* root_copy_mu = nullptr)
      : blocks_(blocks), root_(root), owner_(owner), root_copy_mu_(root_copy_mu), live_{root, &root_lock_} {}

  // The root for readers: cursors made with it follow the root as this
  // writer moves it, under its lock.
  RootPtr LiveRef() const { return RootPtr{0, 0, 0, owner_, &live_}; }
  // A copy of the root pointer, read under its lock.
  RootPtr CurrentRoot() const;

  // COWs the path to the leaf slot where `key` is or would go. With
  // ins_len > 0 the leaf is guaranteed ins_len free bytes (item headers
  // included) unless the key exists. Returns whether the key exists.
  Result<bool> SearchForWrite(const Key& key, uint32_t ins_len, WritePath* path);

  // Makes room for items at path->slot(): keys ascending and all between the
  // slot's neighbours; the leaf must have the room (SearchForWrite with the
  // total). Item data is copied from `data` (one span per item) if given,
  // else left zeroed for the caller to fill (single-threaded use only).
  Status InsertEmptyItems(WritePath* path, std::span<const Key> keys, std::span<const uint32_t> sizes,
                          std::span<const std::span<const uint8_t>> data = {});

  Status Insert(const Key& key, std::span<const uint8_t> data);
  // Inserts ascending keys that fit in one leaf with one search and one
  // InsertEmptyItems; falls back to single inserts if they would not.
  // nothing_between: the caller knows no key lies between the first and the
  // last (a new inode's items), which spares the check.
  Status InsertBatch(std::span<const Key> keys, std::span<const std::vector<uint8_t>> data,
                     bool nothing_between = false);
  // The same with the items' bytes as spans (no copies into vectors).
  Status InsertBatch(std::span<const Key> keys, std::span<const std::span<const uint8_t>> data,
                     bool nothing_between = false);
  // Inserts ascending keys, none of which may exist, that may fall between
  // existing items anywhere in the tree (delayed DIR_ITEMs sorted by hash):
  // leaf by leaf, one search per leaf and one in-place merge of every key
  // that lands inside it and fits in its free space, instead of a search
  // and a shift of the leaf's tail per key. An existing key fails with
  // EEXIST; the keys before it are in the tree then.
  Status InsertSorted(std::span<const Key> keys, std::span<const std::span<const uint8_t>> data);
  // The old kernel's delayed-item insertion, kept as a benchmark baseline:
  // inserts the longest prefix of ascending `keys` that fits in the free
  // space of the leaf where keys[0] lands (at least one item; a split makes
  // room for that one if needed). Returns how many were inserted.
  Result<size_t> InsertPrefixInLeaf(std::span<const Key> keys, std::span<const std::vector<uint8_t>> data);
  // For items that are runs of fixed-size entries, each covering `stride`
  // of the key's offset (checksum items: one checksum per sector): appends
  // `data` to the item just before `key` in its leaf when that item has
  // key's objectid and type and its run ends at key.offset, and the result
  // stays within max_size bytes; else inserts `key` as Insert does. The
  // choice and the change are made under the leaf's locks, so concurrent
  // callers on neighbouring runs see each other's appends. Returns whether
  // it appended.
  Result<bool> InsertOrAppendRun(const Key& key, std::span<const uint8_t> data, uint32_t entry_size,
                                 uint64_t stride, uint32_t max_size);
  // Replaces an item's data (resizing it as needed).
  Status Update(const Key& key, std::span<const uint8_t> data);
  // Update of existing ascending keys (a commit's delayed inode items):
  // one search per leaf, and the items of that leaf whose size stays the
  // same rewritten in place under one write lock; others as Update does.
  // A key that does not exist fails with ENOENT; the keys before it are
  // updated then.
  Status UpdateSorted(std::span<const Key> keys, std::span<const std::span<const uint8_t>> data);
  Status Delete(const Key& key);
  // Deletes nr items from `slot` of the path's leaf. The path is invalid afterwards.
  Status DeleteItems(WritePath* path, int slot, int nr);
  // Grows or shrinks the item at the path's slot, keeping its leading bytes.
  // Growing needs the room (SearchForWrite with the growth).
  Status ResizeItem(WritePath* path, uint32_t new_size);

  uint32_t MaxItemSize() const;
  const WriterStats& stats() const { return stats_; }
  uint64_t owner() const { return owner_; }

 private:
  // Write locks on path blocks for one change, taken in the order added
  // (parent before child, left before right), released together.
  class WriteLocks {
   public:
    explicit WriteLocks(bool on) : on_(on) {}
    ~WriteLocks() { Unlock(); }
    WriteLocks(const WriteLocks&) = delete;
    WriteLocks& operator=(const WriteLocks&) = delete;
    void Add(NodeLock& l) {
      if (!on_) return;
      l.LockWrite();
      held_[n_++] = &l;
    }
    void Unlock() {
      while (n_ > 0) held_[--n_]->UnlockWrite();
    }

   private:
    bool on_;
    int n_ = 0;
    std::array<NodeLock*, 6> held_{};
  };
  // The leaf slot's change needs no block above the leaf (see the class
  // comment); `ins_len` as in SearchForWrite.
  static bool Safe(const TreeBlock& b, int slot, bool found, uint32_t ins_len);
  // kLeafCommitted: all that stops the leaf-only path is a leaf still to be
  // copied under a parent of this transaction (TryCopyLeaf can do it).
  enum class Optimistic { kFound, kNotFound, kNo, kRetry, kLeafCommitted };
  Result<Optimistic> TryLeafOnly(const Key& key, uint32_t ins_len, WritePath* path);
  // The leaf's parent alone in intent (shared coupling above it), the leaf
  // copied, and the change kept to the leaf: for the first change of a
  // committed leaf, which otherwise takes intent from the root down.
  Result<Optimistic> TryCopyLeaf(const Key& key, uint32_t ins_len, WritePath* path);
  // Sets the root pointer (under its write lock when locking).
  void SetRoot(WritePath* path, const RootPtr& r);
  // A sibling of a path block at `level`, as it is now: a committed block is
  // read as is (copied only if it is to change); one of this transaction is
  // locked (intent) first, as another thread may be changing it. Unlocks on
  // destruction.
  struct Sibling {
    BlockRef clean;
    std::shared_ptr<TreeBlock> mine;
    bool locked = false;
    const TreeBlock& block() const { return mine ? *mine : *clean; }
    Sibling() = default;
    Sibling(const Sibling&) = delete;
    Sibling& operator=(const Sibling&) = delete;
    ~Sibling() {
      if (locked) mine->lock.UnlockIntent();
    }
  };
  Status OpenSibling(WritePath* path, int level, int slot, Sibling* sib);
  // Copies a committed sibling on write and points the parent at the copy.
  Status MakeWritable(WritePath* path, int level, int slot, Sibling* sib);
  Status CowChild(WritePath* path, int level, int slot);
  // Puts keys[k] (sizes[k] bytes, from data[k] if given, else zeroed)
  // between the leaf's items pos[k]-1 and pos[k] (pos as FirstSlotAtOrAfter,
  // ascending) in one pass; the leaf has the room.
  void MergeIntoLeaf(WritePath* path, std::span<const Key> keys, std::span<const uint32_t> sizes,
                     std::span<const std::span<const uint8_t>> data, std::span<const int> pos);
  Status InsertNewRoot(WritePath* path, int level);
  Status SplitNode(WritePath* path, int level);
  Result<bool> PushLeaf(WritePath* path, const Key& key, uint32_t ins_len);
  Status SplitLeaf(WritePath* path, const Key& key, uint32_t ins_len);
  Status InsertPtr(TreeBlock& node, int slot, const Key& key, uint64_t bytenr, uint64_t generation);
  Status DelPtr(WritePath* path, int level, int slot);
  Status AfterPtrRemoved(WritePath* path, int level, int slot);
  Status MaybeMerge(WritePath* path, int level);
  void FixupLowKeys(WritePath* path, const Key& key, int level);
  // Whether `level` is the root's: valid for the levels the path holds.
  static bool IsRootLevel(const WritePath* path, int level) { return level == path->root_level; }

  DirtyBlocks* blocks_;
  RootPtr* root_;
  uint64_t owner_;
  std::mutex* root_copy_mu_;
  mutable NodeLock root_lock_;  // guards *root_ (see LiveRoot)
  LiveRoot live_;
  WriterStats stats_;
};

// Leaf surgery shared by the writer and tests.
struct LeafItem {
  Key key;
  std::vector<uint8_t> data;
};
std::vector<LeafItem> ExtractItems(const TreeBlock& leaf, int from, int to);
// Rewrites a leaf to hold exactly `items` (which must fit).
void WriteLeafItems(TreeBlock& leaf, std::span<const LeafItem> items);
// The same without a copy per item: views into a block that stays unchanged
// while they are used (the hot paths view a snapshot Clone() of the leaf).
struct ItemRef {
  Key key;
  const uint8_t* data;
  uint32_t size;
};
void RefItems(const TreeBlock& leaf, int from, int to, std::vector<ItemRef>* out);
void WriteLeafRefs(TreeBlock& leaf, std::span<const ItemRef> items);
uint32_t LeafUsed(const TreeBlock& leaf);

// The calling thread's copies of blocks being split or merged (a few block
// buffers kept from call to call) are given back: a filesystem closing on
// this thread, before TrimBlockBuffers.
void DropThreadScratch();

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_WRITER_H_
