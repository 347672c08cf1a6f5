// Reference counting of `ubtrfs check`: what the trees say every tree block
// and data extent should be referenced by, against what the extent tree
// records (refs count, inline and keyed backrefs, FULL_BACKREF).
//
// The walk in checker.cc reads each tree block once (memoized by bytenr in a
// bitmap) and, for each pointer a block holds, appends one compact record:
// a block reached through a shared parent is walked once per path, but its
// references are counted per parent block. After the walk the records are
// sorted by address and merged with the extent tree, read again in key
// order one extent at a time, so neither side is held as a map: memory is
// about 16 bytes per tree block, 16 per pointer, 40 per file extent item and
// a bit per sector of metadata space.
#ifndef UBTRFS_CHECK_BACKREFS_H_
#define UBTRFS_CHECK_BACKREFS_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "alloc/chunk_map.h"
#include "check/report.h"
#include "format/key.h"
#include "tree/block_reader.h"
#include "tree/cursor.h"

namespace ubtrfs::check {

// A set of sector-aligned addresses: one bit per sector of the metadata and
// system chunks (where tree blocks live), a hash set for anything else (only
// damaged images point elsewhere).
class BlockBits {
 public:
  void Init(const alloc::ChunkMap& chunks, uint32_t sectorsize);
  bool Test(uint64_t bytenr) const;
  // True when the address was not in the set before.
  bool Set(uint64_t bytenr);
  size_t bytes() const { return words_.size() * sizeof(uint64_t) + other_.size() * 32; }

 private:
  struct Span {
    uint64_t start, end, first_bit;
  };
  const Span* Find(uint64_t bytenr) const;
  std::vector<Span> spans_;  // sorted by start
  std::vector<uint64_t> words_;
  std::unordered_set<uint64_t> other_;
  uint32_t shift_ = 12;
};

// A backref as the extent tree states it (inline in the extent item, or a
// keyed item after it).
struct DeclRef {
  uint8_t type = 0;  // TREE_BLOCK_REF, SHARED_BLOCK_REF, EXTENT_DATA_REF, SHARED_DATA_REF
  uint64_t a = 0;    // root or parent
  uint64_t ino = 0, offset = 0;
  uint64_t count = 1;
  bool keyed = false;
};

// One EXTENT_ITEM / METADATA_ITEM with all of its backrefs.
struct ExtentRec {
  format::Key key{};
  uint64_t start = 0, len = 0;
  uint64_t refs = 0, generation = 0, flags = 0;
  int level = -1;
  bool tree_block = false;
  uint64_t owner_ref = 0;  // simple quotas: the EXTENT_OWNER_REF when it is the first inline ref
  std::vector<DeclRef> decl;
};

class RefTally {
 public:
  RefTally(const alloc::ChunkMap& chunks, uint32_t sectorsize, uint32_t nodesize, uint64_t super_generation,
           Report* report);

  // ---- during the walk

  // True the first time a tree block is read: its pointers are then counted.
  bool FirstVisit(uint64_t bytenr) { return visited_.Set(bytenr); }
  // An extent tree item seen by the walk: tree-block extents and their
  // FULL_BACKREF flag are remembered, for deciding how a block's children
  // are referenced before the extent tree has been compared.
  void NoteExtentItem(const format::Key& k, std::span<const uint8_t> d);
  // -1: no tree-block extent item was seen for the block; else its flag.
  int ExtentFullBackref(uint64_t bytenr) const;
  // The block as read on its first visit.
  void Block(uint64_t bytenr, int level, uint64_t owner, bool full_backref, bool bad_full_reported);
  // Some walk from the block's owner tree went through it.
  void OwnerReached(uint64_t bytenr) { owner_reached_.Set(bytenr); }
  // One pointer to a tree block: by a FULL_BACKREF parent (parent != 0) or
  // by tree `root` (a parent referencing by tree, or a ROOT_ITEM).
  void TreeRef(uint64_t bytenr, uint64_t parent, uint64_t root);
  // One file extent item pointing at data extent `disk`.
  void DataRef(uint64_t disk, uint64_t disk_num_bytes, bool reg, uint64_t leaf_parent, uint64_t root, uint64_t ino,
               uint64_t offset);

  // ---- after the walk

  // Reads the extent tree (every readable block; unreadable ones were
  // reported by the walk) in key order and compares each extent with the
  // references found; `each` sees every extent too (placement, free space),
  // with the owner of the tree block the walk read there (0: none).
  void Compare(tree::BlockReader* reader, const tree::RootPtr& extent_root,
               const std::function<void(const ExtentRec&, uint64_t owner)>& each);

  // Some REG (not PREALLOC) file extent item points at `disk` (after Compare).
  bool HasRegularRef(uint64_t disk) const;
  uint64_t tree_blocks() const { return blocks_.size(); }
  uint64_t file_extent_refs() const { return data_.size(); }
  uint64_t extent_items() const { return extent_items_; }
  uint64_t data_extents() const { return data_extents_; }
  // What the tally holds, for the statistics.
  uint64_t memory_bytes() const;

 private:
  struct BlockRec {
    uint64_t bits;  // bytenr | level (bits 0-2) | FULL_BACKREF (3) | flag already reported (4)
    uint64_t owner;
  };
  struct TreeRefRec {
    uint64_t bits;  // bytenr | 1 when `who` is a parent block (SHARED_BLOCK_REF)
    uint64_t who;   // root or parent
  };
  struct DataRefRec {
    uint64_t disk;
    uint64_t who;  // root, or the leaf for SHARED_DATA_REF
    uint64_t ino, offset;
    uint64_t len_bits;  // disk_num_bytes << 2 | SHARED_DATA_REF (bit 1) | REG (bit 0)
  };

  void Stream(tree::BlockReader* reader, const tree::BlockCheck& bc, ExtentRec* cur, bool* have,
              const std::function<void(ExtentRec&)>& done);
  bool ParseExtentItem(const format::Key& k, std::span<const uint8_t> d, ExtentRec* e);
  void AddKeyedRef(const format::Key& k, std::span<const uint8_t> d, ExtentRec* cur, bool have);
  void CompareTreeBlock(const ExtentRec& e, size_t tb, size_t te, const BlockRec* b);
  void CompareData(const ExtentRec& e, size_t db, size_t de);
  void Unmatched(uint64_t below, const ExtentRec* prev);
  void Error(std::string s) { report_->Error(std::move(s)); }

  uint32_t ss_, nodesize_;
  uint64_t super_gen_;
  Report* report_;
  BlockBits visited_, owner_reached_, tree_extents_, full_extents_;
  std::vector<BlockRec> blocks_;
  std::vector<TreeRefRec> trefs_;
  std::vector<DataRefRec> data_;
  size_t ti_ = 0, bi_ = 0, di_ = 0;  // merge positions
  uint64_t extent_items_ = 0, data_extents_ = 0;
};

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_BACKREFS_H_
