// The bytes of a chunk stripe whose device is gone, made again from the
// chunk's other stripes: what removing a missing device (`ubtrfs device
// remove missing`) writes to the stripe's new place.
//
// A stripe of a mirrored profile (RAID1*, RAID10) holds elements that other
// stripes hold too: they are read from a copy on a present device. A stripe
// of a RAID5/6 chunk holds, row by row, one data element or the row's P or
// Q: data is rebuilt from the rest of its row (ChunkIo's degraded read), and
// parity computed again from the row's data. SINGLE, DUP and RAID0 stripes
// exist once, so a lost one cannot be made again.
//
// The result is what the lost device held where the rest of the chunk
// agrees with it; bytes the chunk does not use come out as whatever the
// other stripes give, which is as good as anything for them.
#ifndef UBTRFS_ALLOC_STRIPE_REBUILD_H_
#define UBTRFS_ALLOC_STRIPE_REBUILD_H_

#include <cstdint>
#include <span>
#include <string>

#include "alloc/chunk_io.h"
#include "alloc/chunk_map.h"

namespace ubtrfs::alloc {

// "" when every stripe of `c` on a missing device of `devs` can be made
// again from the stripes on present ones; otherwise why not (the profile
// keeps one copy, or more stripes are missing than it tolerates).
std::string WhyNotRebuildable(const ChunkInfo& c, const io::DeviceSet& devs);

// Fills `out` with what stripe `index` of `c` holds at [offset, offset +
// out.size()) (an offset into the stripe, sector-aligned), from the chunk's
// other stripes through `io`. IoError when the other stripes cannot give it.
Status RebuildStripeRange(ChunkIo& io, const ChunkInfo& c, size_t index, uint64_t offset, std::span<uint8_t> out);

// [logical, logical + out.size()) from the first of its mirrors that reads:
// a copy on a missing device fails at the device set and the next is
// tried (RAID5/6 mirror 0 rebuilds from parity itself).
Status ReadFromAnyCopy(ChunkIo& io, uint64_t logical, std::span<uint8_t> out);

}  // namespace ubtrfs::alloc

#endif  // UBTRFS_ALLOC_STRIPE_REBUILD_H_
