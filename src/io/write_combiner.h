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
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::io {

class WriteCombiner {
 public:
  // Writes bytes back to back from an offset (pieces in order).
  using WriteRun = std::function<Status(uint64_t offset, std::span<const iovec> pieces)>;

  // Two of these per image file, filled whole before they are written: at
  // 256 KiB a run of 4 KiB files is still one pwritev per 64 of them, and
  // an image build holds a quarter of the memory of 1 MiB (issue 19 holds
  // it to mkfs.btrfs's peak). 4 KiB creates through the library were 0-3%
  // slower than at 512 KiB, within this VM's noise (session 52).
  explicit WriteCombiner(size_t capacity = size_t{256} << 10, size_t largest = size_t{64} << 10)
      : capacity_(capacity), largest_(largest) {}
  WriteCombiner(const WriteCombiner&) = delete;
  WriteCombiner& operator=(const WriteCombiner&) = delete;

  // Whether a write of n bytes is gathered; larger ones go straight down.
  bool Takes(size_t n) const { return n > 0 && n <= largest_; }
  bool empty() const { return pieces_.empty(); }
  // Whether its buffer was cut (at the first Add; kept from then on).
  bool HasBuffer() const { return bytes_ != nullptr; }
  // Buffers cut and not yet freed, in the whole process: what the image
  // devices hold for gathering (a test asserts a single writer needs one).
  static size_t LiveBuffers();
  // Whether [offset, offset + n) meets a gathered write: a read of it, or a
  // write over it, must drain first.
  bool Overlaps(uint64_t offset, uint64_t n) const;
  // Copies the bytes in. The caller drains first if they overlap. A write
  // whose offset and length are multiples of kAlign is kept at a multiple
  // of kAlign in memory too, so a run of such writes can go to the device
  // around the page cache (O_DIRECT wants its buffers aligned).
  void Add(uint64_t offset, std::span<const uint8_t> data);
  bool Full() const { return used_ >= capacity_; }
  // Bounds of everything gathered: [lo, hi).
  uint64_t lo() const { return lo_; }
  uint64_t hi() const { return hi_; }
  static constexpr size_t kAlign = 4096;
  // Writes everything gathered, in offset order, one call per run of
  // adjacent writes; empty afterwards, whether or not a write failed.
  Status Drain(const WriteRun& write);

 private:
  struct Piece {
    uint64_t offset;
    size_t pos;  // in bytes_
    size_t len;
  };
  struct Free {
    void operator()(uint8_t* p) const;
  };
  size_t capacity_, largest_;
  // capacity_ + largest_ + kAlign bytes from the first Add on, aligned to
  // kAlign; never reallocated, as Full() is checked after each Add.
  std::unique_ptr<uint8_t[], Free> bytes_;
  size_t used_ = 0;
  std::vector<Piece> pieces_;
  uint64_t lo_ = UINT64_MAX, hi_ = 0;  // bounds of all pieces: most reads miss them
};

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_WRITE_COMBINER_H_
