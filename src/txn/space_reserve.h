// Space reservation for a full device, in the spirit of the kernel's block
// reserves (fs/btrfs/block-rsv.c, space-info.c; no code taken from there):
//
//  - The global metadata reserve: metadata that ordinary changes leave
//    alone, so that deletions (unlink, rmdir, truncate) and the commit can
//    always run on a device whose metadata is full. Changes reserve
//    CommitReserve + GlobalReserve + their items; deletions only
//    CommitReserve + theirs (ChunkAllocator::ReserveMetadata with
//    ReserveFor::kDelete). Size: a sixteenth of the metadata chunks, at
//    least kGlobalReserveMinBlocks tree blocks (more than a deletion asks
//    for), at most 512 MiB.
//  - Data up front: an exclusive operation that allocates data after it has
//    changed the trees (fallocate, truncate) first makes sure the data block
//    groups hold what it may need, adding data chunks as needed, so that a
//    full device is an ENOSPC before anything changed. Nothing else
//    allocates data while an exclusive operation runs, so free space found
//    here is still there when the operation takes it.
//
// statfs (fs/statfs.h) counts the kernel's global reserve size, not this
// one: that is what a kernel mount of the image reports.
#ifndef UBTRFS_TXN_SPACE_RESERVE_H_
#define UBTRFS_TXN_SPACE_RESERVE_H_

#include <cstdint>

#include "ubtrfs/status.h"

namespace ubtrfs::txn {

class TxnManager;

// Who asks for metadata: an ordinary change, or a deletion that may dip
// into the global reserve.
enum class ReserveFor : uint8_t { kChange, kDelete };

constexpr uint64_t kGlobalReserveMinBlocks = 128;
constexpr uint64_t kGlobalReserveMax = 512ull << 20;

// The global reserve for metadata chunks of `metadata_total` bytes.
uint64_t GlobalReserveBytes(uint64_t metadata_total, uint32_t nodesize);

// Makes the data block groups hold `bytes` allocatable now (new data chunks
// when needed); ENOSPC, with the figures, when the device has no room.
Status ReserveData(TxnManager& txn, uint64_t bytes);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_SPACE_RESERVE_H_
