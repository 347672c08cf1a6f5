// The write side of the B-tree engine for one tree: copy-on-write searches,
// batched item insertion, deletion, item resize, leaf and node splits,
// merges of underfull blocks, and root growth and shrink.
//
// Every block on a write path is made writable (copied on write) on the way
// down, so a change never touches a block of the last committed tree. One
// writer per tree at a time; the caller serializes writers.
#ifndef UBTRFS_TREE_WRITER_H_
#define UBTRFS_TREE_WRITER_H_

#include <array>
#include <memory>
#include <span>
#include <vector>

#include "tree/cursor.h"
#include "tree/dirty_blocks.h"

namespace ubtrfs::tree {

struct WritePath {
  std::array<std::shared_ptr<TreeBlock>, format::kMaxLevel> nodes{};
  std::array<int, format::kMaxLevel> slots{};
  TreeBlock& leaf() { return *nodes[0]; }
  int slot() const { return slots[0]; }
};

struct WriterStats {
  uint64_t leaf_splits = 0;
  uint64_t leaf_pushes = 0;  // room made by moving items to sibling leaves
  uint64_t node_splits = 0;
  uint64_t merges = 0;
  uint64_t root_grows = 0;
  uint64_t root_shrinks = 0;
  uint64_t batch_inserts = 0;  // InsertEmptyItems calls
  uint64_t items_inserted = 0;
};

class TreeWriter {
 public:
  // `root` is updated in place when the root moves (COW, growth, shrink).
  TreeWriter(DirtyBlocks* blocks, RootPtr* root, uint64_t owner) : blocks_(blocks), root_(root), owner_(owner) {}

  // COWs the path to the leaf slot where `key` is or would go. With
  // ins_len > 0 the leaf is guaranteed ins_len free bytes (item headers
  // included) unless the key exists. Returns whether the key exists.
  Result<bool> SearchForWrite(const Key& key, uint32_t ins_len, WritePath* path);

  // Makes room for items at path->slot(): keys ascending and all between the
  // slot's neighbours; the leaf must have the room (SearchForWrite with the
  // total). Item data is left zeroed for the caller to fill.
  Status InsertEmptyItems(WritePath* path, std::span<const Key> keys, std::span<const uint32_t> sizes);

  Status Insert(const Key& key, std::span<const uint8_t> data);
  // Inserts ascending keys that fit in one leaf with one search and one
  // InsertEmptyItems; falls back to single inserts if they would not.
  Status InsertBatch(std::span<const Key> keys, std::span<const std::vector<uint8_t>> data);
  // The old kernel's delayed-item insertion, kept as a benchmark baseline:
  // inserts the longest prefix of ascending `keys` that fits in the free
  // space of the leaf where keys[0] lands (at least one item; a split makes
  // room for that one if needed). Returns how many were inserted.
  Result<size_t> InsertPrefixInLeaf(std::span<const Key> keys, std::span<const std::vector<uint8_t>> data);
  // Replaces an item's data (resizing it as needed).
  Status Update(const Key& key, std::span<const uint8_t> data);
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
  Status CowChild(WritePath* path, int level, int slot);
  Status InsertNewRoot(WritePath* path, int level);
  Status SplitNode(WritePath* path, int level);
  Result<bool> PushLeaf(WritePath* path, uint32_t ins_len);
  Status SplitLeaf(WritePath* path, const Key& key, uint32_t ins_len);
  Status InsertPtr(TreeBlock& node, int slot, const Key& key, uint64_t bytenr, uint64_t generation);
  Status DelPtr(WritePath* path, int level, int slot);
  Status MaybeMerge(WritePath* path, int level);
  void FixupLowKeys(WritePath* path, const Key& key, int level);
  bool IsRootLevel(int level) const { return level == root_->level; }

  DirtyBlocks* blocks_;
  RootPtr* root_;
  uint64_t owner_;
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

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_WRITER_H_
