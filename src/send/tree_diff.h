// The comparison of two trees that an incremental send starts from, as the
// kernel's btrfs_compare_trees: both trees are walked together in key order,
// and where both point at the same block (same address and generation) the
// whole subtree below is shared by the two and skipped unread. What is left
// is reported item by item: in the new tree only, in the old tree only, or
// under the same key with different bytes.
#ifndef UBTRFS_SEND_TREE_DIFF_H_
#define UBTRFS_SEND_TREE_DIFF_H_

#include <cstdint>
#include <functional>
#include <span>

#include "tree/block_reader.h"
#include "tree/cursor.h"

namespace ubtrfs::send {

enum class DiffKind { kNew, kDeleted, kChanged };

struct DiffStats {
  uint64_t blocks_read = 0;      // tree blocks the walk read (both trees)
  uint64_t shared_skipped = 0;   // subtrees found shared and not read
  uint64_t items_compared = 0;   // item pairs under equal keys compared byte for byte
};

// `old_item` is empty for kNew, `new_item` for kDeleted.
using DiffFn = std::function<Status(DiffKind kind, const format::Key& key, std::span<const uint8_t> old_item,
                                    std::span<const uint8_t> new_item)>;

// Calls `fn` for every difference between the trees at `old_root` and
// `new_root`, in key order. Blocks are verified as the cursors verify them
// (level, generation and first key from the parent pointer).
Status CompareTrees(tree::BlockSource* source, const tree::RootPtr& old_root, const tree::RootPtr& new_root,
                    const DiffFn& fn, DiffStats* stats);

}  // namespace ubtrfs::send

#endif  // UBTRFS_SEND_TREE_DIFF_H_
