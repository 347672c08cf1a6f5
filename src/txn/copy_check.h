// The bytes a chunk move reads (resize, device remove and replace, balance)
// are verified before they are written to their new place, as the kernel's
// replace verifies what it copies: a copy that is silently bad would
// otherwise become the only copy there is (a replaced or removed device's
// good copy gone with it). What failed is taken from another copy of the
// chunk; what no copy gives verified is copied as read, and named.
#ifndef UBTRFS_TXN_COPY_CHECK_H_
#define UBTRFS_TXN_COPY_CHECK_H_

#include <cstdint>
#include <span>

#include "ubtrfs/resize.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {

class Volume;

// What moves copied, and what verifying their reads found.
struct CopyStats {
  uint64_t bytes = 0;
  CopyCheck check;
};

// A result's bytes_copied and copy_check (ResizeResult, DeviceChangeResult,
// ConvertResult).
template <class Result>
void Report(const CopyStats& s, Result* r) {
  r->bytes_copied = s.bytes;
  r->copy_check = s.check;
}

// `buf` holds [logical, logical + buf.size()) of one chunk as a copy of it
// read (sector aligned). Verifies each tree block the extent tree places
// wholly inside it and each data sector the csum tree has a checksum for;
// one that fails is read from every copy of the chunk in turn (mirrors,
// RAID5/6 rebuilds), and the first that verifies replaces it in `buf`
// (check->repaired). With none it stays as read (check->unrecoverable).
// Either way a line in check->errors names it; so does a range left
// unverified because the extent or csum tree could not be read there. Must
// run before the transaction changes the extent tree (the moves are the
// first change of theirs).
void VerifyCopy(Volume& vol, uint64_t logical, std::span<uint8_t> buf, CopyCheck* check);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_COPY_CHECK_H_
