// Reading an image file in place, through a read-only memory map, instead of
// copying it into a buffer with pread: a read through the FUSE mount then
// costs one copy of the data fewer (the reply is written from the map;
// docs/BENCHMARKS.md, session 50).
//
// A map turns errors into signals: a page that cannot be read (an I/O error
// once the kernel dropped the page, the file cut short by another process)
// arrives as SIGBUS where pread returns an errno. MapForRead faults every
// page in first (MADV_POPULATE_READ, which reports errors); what user space
// reads afterwards goes through TouchMapped, which turns a SIGBUS into an
// error. The kernel's own copies from the map (a writev to /dev/fuse) fail
// with EFAULT instead.
#ifndef UBTRFS_IO_MAPPED_READ_H_
#define UBTRFS_IO_MAPPED_READ_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "ubtrfs/status.h"

namespace ubtrfs::io {

// A range of a file mapped read-only, unmapped when this goes. Empty where
// nothing was mapped (the device cannot, or the pages did not read): the
// caller reads with BlockDevice::ReadAt, which reports the error.
class MappedBytes {
 public:
  MappedBytes() = default;
  MappedBytes(void* base, size_t base_len, size_t offset, size_t len)
      : base_(base), base_len_(base_len), data_(static_cast<const uint8_t*>(base) + offset), size_(len) {}
  MappedBytes(MappedBytes&& o) noexcept { *this = std::move(o); }
  MappedBytes& operator=(MappedBytes&& o) noexcept;
  MappedBytes(const MappedBytes&) = delete;
  MappedBytes& operator=(const MappedBytes&) = delete;
  ~MappedBytes() { Unmap(); }

  bool empty() const { return data_ == nullptr; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  void Unmap();
  void* base_ = nullptr;
  size_t base_len_ = 0;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Maps [offset, offset + len) of the open file `fd` (which holds at least
// that much) and faults its pages in. Empty when the kernel cannot
// (MADV_POPULATE_READ needs Linux 5.14) or a page does not read.
MappedBytes MapFileRange(int fd, uint64_t offset, size_t len);

// Runs fn(ctx), which reads mapped memory only (no allocation, no locks, no
// objects with destructors: a SIGBUS leaves it by siglongjmp). Returns what
// fn returns, or an I/O error when a page could not be read.
Result<bool> TouchMapped(bool (*fn)(const void* ctx), const void* ctx);

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_MAPPED_READ_H_
