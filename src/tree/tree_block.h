// A verified, immutable tree block (node or leaf). Every accessor is safe for
// any index below nritems(): Parse() has checked all bounds before a block
// can be used.
#ifndef UBTRFS_TREE_TREE_BLOCK_H_
#define UBTRFS_TREE_TREE_BLOCK_H_

#include <array>
#include <cstdint>
#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "format/key.h"
#include "tree/block_buffer.h"
#include "tree/node_lock.h"
#include "format/ondisk.h"
#include "ubtrfs/status.h"

namespace ubtrfs::tree {

using format::Key;

// What every block of this filesystem must carry.
struct TreeParams {
  uint32_t nodesize = 0;
  uint16_t csum_type = 0;
  uint8_t fsid[format::kFsidSize] = {};  // the metadata fsid
  // A filesystem sprouted from seed devices also reads the blocks the seeds
  // wrote, which carry the seed's fsid (as the kernel's check_tree_block_fsid).
  std::vector<std::array<uint8_t, format::kFsidSize>> seed_fsids;
  // Checked unless a rescue read takes a block whose checksum fails
  // (BlockReader::AcceptBadChecksums).
  bool verify_csum = true;
};

// What the referrer (a parent pointer or the superblock) says the block is.
struct BlockCheck {
  uint64_t bytenr = 0;
  int level = -1;                  // -1: not known
  uint64_t generation = 0;         // 0: not known
  std::optional<Key> first_key;    // the parent's key for this child
};

// Verifies raw block bytes: checksum, bytenr, fsid, level, generation, item
// count, item offsets and sizes inside the block, and key order. The error
// names the block (logical bytenr) and what is wrong.
Status VerifyTreeBlock(std::span<const uint8_t> bytes, const TreeParams& params, const BlockCheck& check);

class TreeBlock : public std::enable_shared_from_this<TreeBlock> {
 public:
  // Verifies `bytes` (see VerifyTreeBlock) and wraps them.
  static Result<std::shared_ptr<const TreeBlock>> Parse(BlockBuffer bytes, const TreeParams& params,
                                                        const BlockCheck& check);

  const format::Header& header() const { return *reinterpret_cast<const format::Header*>(bytes_.data()); }
  uint64_t bytenr() const { return header().bytenr.get(); }
  uint64_t generation() const { return header().generation.get(); }
  uint64_t owner() const { return header().owner.get(); }
  int level() const { return header().level; }
  bool is_leaf() const { return level() == 0; }
  int nritems() const { return static_cast<int>(header().nritems.get()); }
  std::span<const uint8_t> bytes() const { return bytes_.span(); }

  Key key(int slot) const { return Key::From(is_leaf() ? item(slot)->key : ptr(slot)->key); }
  // Leaf items.
  std::span<const uint8_t> item_data(int slot) const;
  uint32_t item_size(int slot) const { return item(slot)->size.get(); }
  uint32_t item_offset(int slot) const { return item(slot)->offset.get(); }
  // Node pointers.
  uint64_t child_bytenr(int slot) const { return ptr(slot)->blockptr.get(); }
  uint64_t child_generation(int slot) const { return ptr(slot)->generation.get(); }

  // Bytes of a leaf not taken by item headers and data.
  uint32_t LeafFreeSpace() const;
  // Most pointers a node of this size holds.
  int MaxPtrs() const { return static_cast<int>((bytes_.size() - sizeof(format::Header)) / sizeof(format::KeyPtr)); }
  uint32_t LeafSpace() const { return static_cast<uint32_t>(bytes_.size() - sizeof(format::Header)); }

  // ---- Write side: blocks owned by a running transaction ----
  static std::shared_ptr<TreeBlock> NewBlank(uint32_t nodesize);
  std::shared_ptr<TreeBlock> Clone() const;
  TreeBlock(const TreeBlock&) = delete;
  TreeBlock& operator=(const TreeBlock&) = delete;
  format::Header& mutable_header() { return *reinterpret_cast<format::Header*>(bytes_.data()); }
  uint8_t* mutable_bytes() { return bytes_.data(); }
  format::Item* mutable_item(int slot) {
    return reinterpret_cast<format::Item*>(bytes_.data() + sizeof(format::Header)) + slot;
  }
  format::KeyPtr* mutable_ptr(int slot) {
    return reinterpret_cast<format::KeyPtr*>(bytes_.data() + sizeof(format::Header)) + slot;
  }
  uint8_t* mutable_item_data(int slot) {
    return bytes_.data() + sizeof(format::Header) + item(slot)->offset.get();
  }
  void set_nritems(int n) { mutable_header().nritems = static_cast<uint32_t>(n); }
  void SetKey(int slot, const Key& k) {
    if (is_leaf()) k.To(&mutable_item(slot)->key); else k.To(&mutable_ptr(slot)->key);
  }

  // Slot of the last key <= k (nodes), or -1 if k precedes every key.
  int LastSlotAtOrBefore(const Key& k) const;
  // Slot of the first key >= k (leaves); nritems() if none.
  int FirstSlotAtOrAfter(const Key& k) const;

  // The node lock of a block a running transaction changes while other
  // threads read it (tree/node_lock.h). Committed blocks are immutable and
  // are never locked.
  mutable NodeLock lock;
  // Set when a running transaction drops a block it created (DirtyBlocks::
  // Free): a lock-free lookup that finds it knows it is not the block at that
  // address any more.
  std::atomic<bool> dropped{false};

 private:
  explicit TreeBlock(BlockBuffer bytes) : bytes_(std::move(bytes)) {}
  const format::Item* item(int slot) const {
    return reinterpret_cast<const format::Item*>(bytes_.data() + sizeof(format::Header)) + slot;
  }
  const format::KeyPtr* ptr(int slot) const {
    return reinterpret_cast<const format::KeyPtr*>(bytes_.data() + sizeof(format::Header)) + slot;
  }
  BlockBuffer bytes_;
};

using BlockRef = std::shared_ptr<const TreeBlock>;

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_TREE_BLOCK_H_
