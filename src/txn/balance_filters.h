// btrfs balance's filters applied to block groups and chunks (the parsing
// and the structs are public: ubtrfs/resize.h).
#ifndef UBTRFS_TXN_BALANCE_FILTERS_H_
#define UBTRFS_TXN_BALANCE_FILTERS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "alloc/chunk_map.h"
#include "ubtrfs/resize.h"

namespace ubtrfs::txn {

// The kernel's chunk_usage_filter and chunk_usage_range_filter: a group is
// taken when min% of its length <= used < max% of it (max 0: used < 1 byte).
bool TakesUsage(const UsageFilter& f, uint64_t used, uint64_t length);
// Whether chunk `c` passes the filters other than usage and limit (devid,
// drange, vrange).
bool PassesGroups(const GroupFilter& f, const alloc::ChunkInfo& c);
// Both: the usage filter where it is on, and the others. `used`: the bytes
// the chunk's group holds (superblock stripes left out).
bool TakesChunk(const UsageFilter& usage, const GroupFilter& groups, uint64_t used, const alloc::ChunkInfo& c);

// A block group or chunk the filters took.
struct Candidate {
  uint64_t start, used, kind;
};
// Orders `take` by use, the least used first (then by address), and
// applies each kind's limit=MIN..MAX: at most MAX of a kind, none of it
// unless at least MIN qualify. `groups_of` gives a kind's filter.
void ApplyLimits(std::vector<Candidate>* take, const std::function<const GroupFilter&(uint64_t kind)>& groups_of);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_BALANCE_FILTERS_H_
