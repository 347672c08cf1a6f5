// Which trees reach an extent, by walking its back references up, as the
// kernel's backref walk (btrfs_find_all_roots) answers it: used by the
// qgroup accounting at each commit (txn/qgroups.cc) and by a full recount
// (txn/qgroup_recount.h).
#ifndef UBTRFS_TXN_ROOT_WALK_H_
#define UBTRFS_TXN_ROOT_WALK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "tree/block_reader.h"
#include "tree/cursor.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {

// The subvolumes whose trees reach extent `bytenr` in one state of the
// filesystem (the committed one, or the one being committed): a reference
// by parent leads to that block; a reference by tree (TREE_BLOCK_REF,
// EXTENT_DATA_REF) names the tree that holds the pointer, so the tree is
// searched for the block that holds it, and that block's own references
// are followed in turn (it may be shared with snapshots). A tree's root
// block is reached by that tree. Memoized per walk: parents are shared by
// many children.
class RootWalk {
 public:
  using TreeRootOf = std::function<std::optional<tree::RootPtr>(uint64_t)>;
  RootWalk(tree::BlockSource* src, tree::RootPtr ext, TreeRootOf root_of)
      : src_(src), ext_(ext), root_of_(std::move(root_of)) {}

  // The trees (every kind: callers keep the subvolumes) that reach it.
  Result<std::set<uint64_t>> Roots(uint64_t bytenr, int depth = 0);

  // One back reference of an extent, and the blocks that hold the pointers
  // it stands for.
  struct Backref {
    uint8_t type = 0;                   // TREE_BLOCK_REF, SHARED_BLOCK_REF, EXTENT_DATA_REF, SHARED_DATA_REF
    uint64_t a = 0, ino = 0, off = 0;   // root or parent; EXTENT_DATA_REF's inode and offset
    uint32_t count = 1;                 // data refs
    std::vector<uint64_t> blocks;       // the parent (by parent, or found in the tree); the leaves (data by tree)
    bool root = false;                  // TREE_BLOCK_REF: the block is that tree's root (or not found in it)
  };
  // Every back reference of extent `bytenr`; *level is a tree block's.
  Status Backrefs(uint64_t bytenr, std::vector<Backref>* out, int* level);

 private:
  // The block of tree `t` that points at block `bytenr` (level `level`), or
  // nothing when it is t's root block.
  Result<std::optional<uint64_t>> ParentInTree(uint64_t t, uint64_t bytenr, int level);
  // The leaves of tree `root` whose file extent items of inode `ino` map
  // data extent `bytenr` (`bytes` long on disk) at file offset - extent
  // offset == `off`.
  Status LeavesInTree(uint64_t root, uint64_t ino, uint64_t off, uint64_t bytenr, uint64_t bytes,
                      std::vector<uint64_t>* leaves);

  tree::BlockSource* src_;
  tree::RootPtr ext_;
  TreeRootOf root_of_;
  std::map<uint64_t, std::set<uint64_t>> memo_;
  std::set<uint64_t> on_path_;  // the blocks Roots is inside of
  uint64_t loops_cut_ = 0;
};

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_ROOT_WALK_H_
