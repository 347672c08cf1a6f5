// A path from a tree root to one leaf item: search by key, then step forward
// or backward across leaves. One cursor serves one thread.
//
// Over a running transaction's blocks in concurrent mode (BlockSource::
// Locking()) a cursor holds a shared node lock on each block of its path
// that the transaction may change, taken parent before child, and lets go of
// a block only to move to another child of a block it still holds. Writers
// therefore never change a block under a reader. A thread must not change a
// tree while it holds a cursor on it.
#ifndef UBTRFS_TREE_CURSOR_H_
#define UBTRFS_TREE_CURSOR_H_

#include <array>
#include <optional>
#include <vector>

#include "tree/block_reader.h"
#include "tree/node_lock.h"

namespace ubtrfs::tree {

struct RootPtr;

// A tree's root pointer as a running transaction changes it, with the lock
// that guards it: writers hold it in intent mode while they may move the
// root and in write mode while they do; readers take it shared just long
// enough to lock the root block (tree/writer.h).
struct LiveRoot {
  const RootPtr* ptr = nullptr;
  NodeLock* lock = nullptr;
};

struct RootPtr {
  uint64_t bytenr = 0;
  int level = 0;
  uint64_t generation = 0;  // 0: not known
  uint64_t id = 0;          // tree objectid, for messages
  // When set, cursors read the root from here instead of the fields above.
  const LiveRoot* live = nullptr;
};

class Cursor {
 public:
  Cursor(BlockSource* reader, const RootPtr& root) : reader_(reader), root_(root) {}
  ~Cursor() { ReleaseAll(); }
  Cursor(const Cursor&) = delete;
  Cursor& operator=(const Cursor&) = delete;

  // Positions at the first item whose key is >= k. Valid() is false when no
  // such item exists.
  Status Seek(const Key& k);
  // Positions at the last item whose key is <= k.
  Status SeekAtOrBefore(const Key& k);
  Status SeekFirst() { return Seek(Key::Min()); }
  Status SeekLast() { return SeekAtOrBefore(Key::Max()); }
  Status Next();
  Status Prev();

  // Salvage reads of a damaged tree: a child block that does not read is
  // stepped over with everything under it (its key range and the error are
  // appended to `out`) instead of ending the walk. The root must read.
  struct Skipped {
    Key from, to;  // the keys the lost subtree held lie in [from, to)
    Status why;
  };
  void SkipUnreadable(std::vector<Skipped>* out) { skipped_ = out; }

  bool Valid() const { return valid_; }
  Key key() const { return leaf().key(slot_[0]); }
  std::span<const uint8_t> data() const { return leaf().item_data(slot_[0]); }
  const TreeBlock& leaf() const { return *nodes_[0]; }
  int slot() const { return slot_[0]; }

 private:
  Status Step(int level, bool forward);
  Status LoadChild(int level);
  Status LoadRoot();
  // A failed LoadChild(level): true when the child is to be stepped over.
  bool Skip(int level, const Status& why);
  // Puts b at `level` of the path, locking it if it must be.
  void Hold(int level, BlockRef b);
  void ReleaseAll();

  BlockSource* reader_;
  RootPtr root_;
  std::array<BlockRef, format::kMaxLevel> nodes_{};
  std::array<int, format::kMaxLevel> slot_{};
  std::array<bool, format::kMaxLevel> locked_{};
  bool valid_ = false;
  std::vector<Skipped>* skipped_ = nullptr;
};

// Finds the item with exactly key k.
Result<std::optional<std::vector<uint8_t>>> LookupItem(BlockSource* reader, const RootPtr& root, const Key& k);

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_CURSOR_H_
