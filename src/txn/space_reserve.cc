#include "txn/space_reserve.h"

#include <algorithm>
#include <string>

#include "format/ondisk.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

namespace {

// Device copies a chunk of this type keeps of each byte.
uint64_t Copies(uint64_t flags) {
  if (flags & (kBlockGroupDup | kBlockGroupRaid1 | kBlockGroupRaid10)) return 2;
  return 1;
}

// Metadata that cannot grow: statfs then says nothing is available once
// free metadata is down to the reserve plus this margin (the kernel's
// figure: reservations in flight take a few MiB that are never "used").
constexpr uint64_t kMetadataFullMargin = 4ull << 20;

}  // namespace

uint64_t GlobalReserveBytes(uint64_t metadata_total, uint32_t nodesize) {
  const uint64_t floor = kGlobalReserveMinBlocks * nodesize;
  const uint64_t want = std::max(floor, metadata_total / 16 / nodesize * nodesize);
  return std::min(want, kGlobalReserveMax);
}

Status ReserveData(TxnManager& txn, uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  auto lock = txn.AllocLock();
  alloc::SpaceManager& space = txn.space();
  for (int round = 0;; ++round) {
    const uint64_t free = space.TotalsFor(kBlockGroupData).free_bytes;
    if (free >= bytes) return Status::Ok();
    // Any hole of a stripe's size helps: the data goes in pieces anyway.
    Status s = round < 64 ? txn.chunk_alloc().NewChunk(kBlockGroupData, ChunkAllocator::kStripeLen)
                          : Status::Error(ENOSPC, "64 new data chunks were not enough");
    if (!s.ok()) {
      return Status::Error(s.code(), "no free data space for " + std::to_string(bytes) + " bytes (" +
                                         std::to_string(free) + " free in data chunks): " + s.message());
    }
  }
}

SpaceFigures ComputeSpace(TxnManager& txn, uint64_t device_total) {
  SpaceFigures f;
  f.total_bytes = device_total;
  uint64_t data_total = 0, data_used = 0, meta_total = 0, meta_free = 0;
  txn.space().ForEachGroup([&](const alloc::BlockGroup& g) {
    // Pinned space (freed by the running transaction) is free once it commits.
    f.used_bytes += g.used_bytes() * Copies(g.flags());
    if (g.flags() & kBlockGroupData) {
      data_total += g.length();
      data_used += g.used_bytes();
    } else if (g.flags() & kBlockGroupMetadata) {
      meta_total += g.length();
      meta_free += g.length() - g.used_bytes();
    }
  });
  uint64_t unallocated = 0, largest_hole = 0;
  for (auto [start, len] : txn.chunk_alloc().FreeDeviceRanges()) {
    unallocated += len;
    largest_hole = std::max(largest_hole, len);
  }
  f.global_reserve = GlobalReserveBytes(meta_total, txn.volume()->nodesize());
  f.used_bytes = std::min(f.used_bytes, f.total_bytes);
  const uint64_t left = f.total_bytes - f.used_bytes;
  f.free_bytes = left > f.global_reserve ? left - f.global_reserve : 0;
  f.avail_bytes = (data_total - data_used) + unallocated;
  // No room for another (DUP) metadata chunk and free metadata down to the
  // reserve: new files cannot be made, whatever data space is left.
  const bool metadata_cannot_grow = largest_hole < 2 * ChunkAllocator::kStripeLen;
  if (metadata_cannot_grow && (meta_free < kMetadataFullMargin || meta_free - kMetadataFullMargin < f.global_reserve)) {
    f.avail_bytes = 0;
  }
  return f;
}

}  // namespace ubtrfs::txn
