#include "txn/space_reserve.h"

#include <algorithm>
#include <string>

#include "format/ondisk.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

uint64_t GlobalReserveBytes(uint64_t metadata_total, uint32_t nodesize) {
  const uint64_t floor = kGlobalReserveMinBlocks * nodesize;
  const uint64_t want = std::max(floor, metadata_total / 16 / nodesize * nodesize);
  return std::min(want, kGlobalReserveMax);
}

Status ReserveData(TxnManager& txn, uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  auto lock = txn.AllocLock();
  alloc::SpaceManager& space = txn.space();
  // With mixed groups every data extent the operation takes grows the
  // commit reserve data must leave free (a reference to apply): room for
  // one per sector, else its last allocation fails after the trees changed.
  const ChunkAllocator& ca = txn.chunk_alloc();
  const uint64_t refs_room =
      ca.mixed() ? (bytes / txn.volume()->sectorsize() + 1) * ChunkAllocator::kCommitBytesPerRef : 0;
  for (int round = 0;; ++round) {
    const uint64_t free = space.TotalsFor(kBlockGroupData).free_bytes;
    if (free >= bytes + refs_room + ca.MixedKeepBackForCaller()) {
      // Held, not only found: with mixed groups another change's data (or
      // a commit reserve grown by it) would otherwise take it before this
      // change allocates, half way through its edits (an abort).
      txn.chunk_alloc().HoldData(ca.mixed() ? bytes + refs_room : 0);
      return Status::Ok();
    }
    // Any hole of a stripe's size helps: the data goes in pieces anyway.
    Status s = round < 64 ? txn.chunk_alloc().NewChunk(kBlockGroupData, ChunkAllocator::kStripeLen)
                          : Status::Error(ENOSPC, "64 new data chunks were not enough");
    if (!s.ok()) {
      return Status::Error(s.code(), "no free data space for " + std::to_string(bytes) + " bytes (" +
                                         std::to_string(free) + " free in data chunks): " + s.message());
    }
  }
}

}  // namespace ubtrfs::txn
