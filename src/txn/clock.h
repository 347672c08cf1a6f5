// The wall clock and the uuid source behind every timestamp and new
// subvolume uuid the library writes. An image builder (mkfs with
// SOURCE_DATE_EPOCH or --deterministic) fixes both, process-wide, so that
// the same input gives the same image bytes; otherwise they are the real
// clock and getrandom.
#ifndef UBTRFS_TXN_CLOCK_H_
#define UBTRFS_TXN_CLOCK_H_

#include <time.h>

#include <array>
#include <cstdint>
#include <string_view>

#include "ubtrfs/status.h"

namespace ubtrfs::txn {

// From now on WallClock() returns `sec` and NewUuid() derives uuids from
// `seed` and a counter (the n-th call gives the same uuid in every run).
void SetDeterministic(int64_t sec, const std::array<uint8_t, 16>& seed);
// Back to the real clock and getrandom (the end of a deterministic mkfs
// in a program that goes on writing).
void ClearDeterministic();
bool Deterministic();

// CLOCK_REALTIME (CLOCK_REALTIME_COARSE with `coarse`), or the fixed time.
timespec WallClock(bool coarse = false);

// A new random (version 4) uuid, or the next one derived from the seed.
Status NewUuid(uint8_t out[16]);

// A seed from any text (blake2b).
std::array<uint8_t, 16> SeedFromText(std::string_view text);

// A version-4-shaped uuid derived from `seed` and `purpose` (blake2b).
std::array<uint8_t, 16> DeriveUuid(const std::array<uint8_t, 16>& seed, uint64_t purpose);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_CLOCK_H_
