// btrfs balance's filters applied to block groups and chunks (the parsing
// and the structs are public: ubtrfs/resize.h).
#ifndef UBTRFS_TXN_BALANCE_FILTERS_H_
#define UBTRFS_TXN_BALANCE_FILTERS_H_

#include <cstdint>

#include "alloc/chunk_map.h"
#include "ubtrfs/resize.h"

namespace ubtrfs::txn {

// The kernel's chunk_usage_filter and chunk_usage_range_filter: a group is
// taken when min% of its length <= used < max% of it (max 0: used < 1 byte).
bool TakesUsage(const UsageFilter& f, uint64_t used, uint64_t length);
// Whether chunk `c` passes the filters other than usage and limit (devid,
// drange, vrange).
bool PassesGroups(const GroupFilter& f, const alloc::ChunkInfo& c);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_BALANCE_FILTERS_H_
