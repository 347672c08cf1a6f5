// Quota group numbers counted from scratch, as the kernel's quota rescan
// counts them: every extent of the extent tree, the subvolumes that reach
// it (txn/root_walk.h), and each qgroup's referenced bytes (the extents
// one of its subvolumes reaches) and exclusive bytes (those only its
// subvolumes reach). A tree block counts nodesize bytes, a data extent its
// bytes on disk. Used by a rescan (TxnManager::RescanQuotas) and by
// `ubtrfs check` to verify the numbers the quota tree holds.
#ifndef UBTRFS_TXN_QGROUP_RECOUNT_H_
#define UBTRFS_TXN_QGROUP_RECOUNT_H_

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "txn/root_walk.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {

struct QgroupCount {
  uint64_t rfer = 0, excl = 0;
  bool operator==(const QgroupCount&) const = default;
};

// `parents`: each qgroup's parents (QGROUP_RELATION, child to parent);
// `qgroups`: the ids to count (level 0 is a subvolume's, 0/id == id).
// Reads the state `walk` was made for, in the extent tree `extent_root`.
Result<std::map<uint64_t, QgroupCount>> RecountQgroups(tree::BlockSource* src, tree::RootPtr extent_root,
                                                       uint32_t nodesize, RootWalk* walk,
                                                       const std::map<uint64_t, std::vector<uint64_t>>& parents,
                                                       const std::set<uint64_t>& qgroups);

// The qgroup tree as stored: status flags, and each qgroup's numbers and
// parents.
struct StoredQgroups {
  uint64_t status_flags = 0;
  uint64_t status_generation = 0;
  std::map<uint64_t, QgroupCount> counts;
  std::map<uint64_t, std::vector<uint64_t>> parents;
};
Result<StoredQgroups> ReadQgroups(tree::BlockSource* src, tree::RootPtr quota_root);

// "0/257", "1/100".
std::string QgroupName(uint64_t id);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_QGROUP_RECOUNT_H_
