// The inline back references of an extent item (EXTENT_ITEM / METADATA_ITEM
// body after struct ExtentItem, and TreeBlockInfo for non-skinny tree
// blocks): finding, adding and removing them in the order the kernel keeps
// (types ascending; within a type the sort value descending: the hash of
// (root, objectid, offset) for EXTENT_DATA_REF, the offset for the others).
#ifndef UBTRFS_TXN_EXTENT_REFS_H_
#define UBTRFS_TXN_EXTENT_REFS_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "tree/cursor.h"
#include "tree/tree_block.h"

#include "format/key.h"
#include "format/ondisk.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {

// The key offset and sort value of an EXTENT_DATA_REF (the kernel's
// hash_extent_data_ref: two crc32c halves of root and of objectid+offset).
uint64_t ExtentDataRefHash(uint64_t root, uint64_t objectid, uint64_t offset);

// One inline reference, decoded.
struct InlineRef {
  uint8_t type = 0;
  uint64_t offset = 0;  // root (TREE_BLOCK_REF) or parent (SHARED_*); unused for EXTENT_DATA_REF
  uint64_t root = 0, objectid = 0, data_offset = 0;  // EXTENT_DATA_REF
  uint32_t count = 1;                                 // data refs
  size_t pos = 0, size = 0;                           // where in the item
  uint64_t SortValue() const;
};

// What an EXTENT_ITEM or METADATA_ITEM says before its inline refs: whether
// it is a tree block's (FLAG_TREE_BLOCK), that block's level (a
// METADATA_ITEM's key offset, an EXTENT_ITEM's TreeBlockInfo; 0 for data),
// and where the inline refs begin. EUCLEAN when the item is too short.
struct ExtentItemHead {
  bool tree_block = false;
  int level = 0;
  size_t refs_start = 0;
};
Result<ExtentItemHead> ParseExtentItemHead(const format::Key& k, std::span<const uint8_t> d);

// The inline refs of an extent item; refs_start is where they begin
// (sizeof(ExtentItem), plus sizeof(TreeBlockInfo) for an EXTENT_ITEM of a
// tree block). EUCLEAN on a truncated or unknown ref.
Result<std::vector<InlineRef>> ParseInlineRefs(const std::vector<uint8_t>& item, size_t refs_start,
                                               const format::Key& key);
// Every reference the extent tree holds for extent `bytenr`: those inline
// in its EXTENT_ITEM / METADATA_ITEM and the keyed ones after it, the keyed
// ones decoded into InlineRef too (offset: the root or parent of a block
// ref and the parent of a SHARED_DATA_REF; pos and size unused), in tree
// order. `items` counts the extent items (a converted image may hold two
// forms of one tree block); `head`, `item` and `key` are the last one's.
// EUCLEAN on a short item, EOPNOTSUPP on an unknown inline ref type.
struct StoredRefs {
  int items = 0;
  format::Key key;
  ExtentItemHead head;
  format::ExtentItem item{};  // refs, generation, flags
  std::vector<InlineRef> refs;
};
Result<StoredRefs> ReadStoredRefs(tree::BlockSource* src, const tree::RootPtr& extent_root, uint64_t bytenr);

// The first ref of `type` that matches (offset for keyed-by-offset types;
// root/objectid/data_offset for EXTENT_DATA_REF), if any.
std::optional<InlineRef> FindInlineRef(const std::vector<InlineRef>& refs, const InlineRef& want);
// Inserts `ref` where the kernel's order puts it (its size from its type).
void InsertInlineRef(std::vector<uint8_t>& item, const std::vector<InlineRef>& refs, size_t refs_start,
                     const InlineRef& ref);
// Removes the ref at r.pos.
void EraseInlineRef(std::vector<uint8_t>& item, const InlineRef& r);
// Writes a new count into a data ref (EXTENT_DATA_REF or SHARED_DATA_REF).
void SetInlineCount(std::vector<uint8_t>& item, const InlineRef& r, uint32_t count);

// The body of an EXTENT_DATA item when it references a data extent
// (regular or prealloc, not a hole; inline extents reference none), else null.
inline const format::FileExtentItem* DataExtentItem(std::span<const uint8_t> d) {
  if (d.size() < sizeof(format::FileExtentItem)) return nullptr;
  const auto* fe = reinterpret_cast<const format::FileExtentItem*>(d.data());
  if (fe->type != format::kFileExtentReg && fe->type != format::kFileExtentPrealloc) return nullptr;
  return fe->disk_bytenr.get() == 0 ? nullptr : fe;
}

// Calls fn(key, item) for each file extent item of leaf b that references a
// data extent (DataExtentItem).
template <typename Fn>
void ForEachDataExtent(const tree::TreeBlock& b, Fn&& fn) {
  for (int i = 0; i < b.nritems(); ++i) {
    const format::Key k = b.key(i);
    if (k.type != format::kExtentDataKey) continue;
    if (const auto* fe = DataExtentItem(b.item_data(i))) fn(k, *fe);
  }
}

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_EXTENT_REFS_H_
