// Small writes to an image file, gathered and written in offset order, a run
// of adjacent ones with one pwritev.
//
// Each small file's data was one pwrite of 4 KiB: on the 2-core VM measured
// (issue 24), the system call, the file's lock and the page-cache walk it
// starts each time were a fifth of the CPU of a 4 KiB create run. Gathered,
// the allocator's adjacent extents (two threads take turns at it) go down
// as a few large writes instead.
//
// Not thread-safe: the device that owns it locks around every call.
#ifndef UBTRFS_IO_WRITE_COMBINER_H_
#define UBTRFS_IO_WRITE_COMBINER_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::io {

class WriteCombiner {
 public:
  // Writes bytes back to back from an offset (pieces in order).
  using WriteRun = std::function<Status(uint64_t offset, std::span<const iovec> pieces)>;

  explicit WriteCombiner(size_t capacity = size_t{1} << 20, size_t largest = size_t{64} << 10)
      : capacity_(capacity), largest_(largest) {}

  // Whether a write of n bytes is gathered; larger ones go straight down.
  bool Takes(size_t n) const { return n > 0 && n <= largest_; }
  bool empty() const { return pieces_.empty(); }
  // Whether [offset, offset + n) meets a gathered write: a read of it, or a
  // write over it, must drain first.
  bool Overlaps(uint64_t offset, uint64_t n) const;
  // Copies the bytes in. The caller drains first if they overlap.
  void Add(uint64_t offset, std::span<const uint8_t> data);
  bool Full() const { return bytes_.size() >= capacity_; }
  // Writes everything gathered, in offset order, one call per run of
  // adjacent writes; empty afterwards, whether or not a write failed.
  Status Drain(const WriteRun& write);

 private:
  struct Piece {
    uint64_t offset;
    size_t pos;  // in bytes_
    size_t len;
  };
  size_t capacity_, largest_;
  std::vector<uint8_t> bytes_;
  std::vector<Piece> pieces_;
  uint64_t lo_ = UINT64_MAX, hi_ = 0;  // bounds of all pieces: most reads miss them
};

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_WRITE_COMBINER_H_
