// `ubtrfs check` of quota groups (not simple ones: check/simple_quota.h):
// every qgroup's numbers counted anew as the kernel's rescan counts them
// (txn/qgroup_recount.h) and held against the quota tree's. A difference
// is an error, as btrfs check reports it, unless the status says the
// numbers are known to be off (INCONSISTENT, or a rescan not finished):
// then it is a warning that a rescan mends them.
#ifndef UBTRFS_CHECK_QGROUPS_H_
#define UBTRFS_CHECK_QGROUPS_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "check/report.h"
#include "tree/block_reader.h"
#include "tree/cursor.h"

namespace ubtrfs::check {

// `generation`: of the commit the trees are (the root tree's); the quota
// status must be of it too.
void CheckQgroups(tree::BlockReader* reader, const tree::RootPtr& extent_root, const tree::RootPtr& quota_root,
                  uint32_t nodesize, uint64_t generation, std::function<std::optional<tree::RootPtr>(uint64_t)> root_of,
                  Report* report);

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_QGROUPS_H_
