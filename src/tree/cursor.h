// A path from a tree root to one leaf item: search by key, then step forward
// or backward across leaves. One cursor serves one thread.
#ifndef UBTRFS_TREE_CURSOR_H_
#define UBTRFS_TREE_CURSOR_H_

#include <array>
#include <optional>

#include "tree/block_reader.h"

namespace ubtrfs::tree {

struct RootPtr {
  uint64_t bytenr = 0;
  int level = 0;
  uint64_t generation = 0;  // 0: not known
  uint64_t id = 0;          // tree objectid, for messages
};

class Cursor {
 public:
  Cursor(BlockSource* reader, const RootPtr& root) : reader_(reader), root_(root) {}

  // Positions at the first item whose key is >= k. Valid() is false when no
  // such item exists.
  Status Seek(const Key& k);
  // Positions at the last item whose key is <= k.
  Status SeekAtOrBefore(const Key& k);
  Status SeekFirst() { return Seek(Key::Min()); }
  Status SeekLast() { return SeekAtOrBefore(Key::Max()); }
  Status Next();
  Status Prev();

  bool Valid() const { return valid_; }
  Key key() const { return leaf().key(slot_[0]); }
  std::span<const uint8_t> data() const { return leaf().item_data(slot_[0]); }
  const TreeBlock& leaf() const { return *nodes_[0]; }
  int slot() const { return slot_[0]; }

 private:
  // Loads the child at slot_[level] of nodes_[level] into nodes_[level - 1],
  // then follows the first (leftmost) or last (rightmost) pointers down.
  Status Descend(int level, bool leftmost);
  Status LoadChild(int level);
  Status LoadRoot();

  BlockSource* reader_;
  RootPtr root_;
  std::array<BlockRef, format::kMaxLevel> nodes_{};
  std::array<int, format::kMaxLevel> slot_{};
  bool valid_ = false;
};

// Finds the item with exactly key k.
Result<std::optional<std::vector<uint8_t>>> LookupItem(BlockSource* reader, const RootPtr& root, const Key& k);

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_CURSOR_H_
