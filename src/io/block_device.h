// Block devices: where the bytes of an image live. Reads and writes are
// positional and either complete or fail with a Status naming the range.
#ifndef UBTRFS_IO_BLOCK_DEVICE_H_
#define UBTRFS_IO_BLOCK_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "io/mapped_read.h"
#include "ubtrfs/status.h"

namespace ubtrfs::io {

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;
  // Reads exactly buf.size() bytes at `offset`. Reading past the end is an
  // error (EIO) naming the offset and the device size.
  virtual Status ReadAt(uint64_t offset, std::span<uint8_t> buf) = 0;
  virtual Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) = 0;
  // Writes the pieces back to back from `offset`, as one write where the
  // device can (an image file: pwritev); by default one WriteAt per piece,
  // which is what devices that count or fail single writes see.
  virtual Status WriteGather(uint64_t offset, std::span<const std::span<const uint8_t>> pieces) {
    for (const auto& p : pieces) {
      UB_RETURN_IF_ERROR(WriteAt(offset, p));
      offset += p.size();
    }
    return Status::Ok();
  }
  // Puts `len` bytes of host file `src_fd` at `src_off` onto the device at
  // `offset` without passing them through memory: a clone that shares the
  // host file's extents (FICLONERANGE) where the host file system can, else
  // an in-kernel copy (copy_file_range). False when the device can do
  // neither for this range (the caller writes the bytes itself).
  virtual Result<bool> CloneFrom(int src_fd, uint64_t src_off, uint64_t offset, uint64_t len) {
    (void)src_fd, (void)src_off, (void)offset, (void)len;
    return false;
  }
  // [offset, offset + len) in place, read-only (an image file mapped into
  // memory: io/mapped_read.h), or empty where the device cannot or a page
  // did not read; the caller then reads with ReadAt.
  virtual MappedBytes MapForRead(uint64_t offset, size_t len) {
    (void)offset, (void)len;
    return {};
  }
  virtual Status Flush() = 0;
  // A hint that the writes so far may go to the device now, so the next
  // Flush() waits for less; it neither waits nor makes anything durable.
  virtual void StartWriteback() {}
  virtual uint64_t Size() const = 0;
  virtual std::string Name() const = 0;
};

// Bytes CloneFrom has put on devices in this process, by how.
struct CloneCounts {
  std::atomic<uint64_t> cloned{0};  // shared with the source (FICLONERANGE)
  std::atomic<uint64_t> copied{0};  // copied by the kernel (copy_file_range)
};
CloneCounts& GlobalCloneCounts();

struct OpenFlags {
  bool writable = false;
  // Data writes of an image file around the host's page cache (O_DIRECT,
  // file_device.cc). Unset: only with UBTRFS_DIRECT_IO=1 in the
  // environment, as one direct write at a time is slower than the page
  // cache's writeback on a quiet machine (docs/BENCHMARKS.md, session 21).
  std::optional<bool> direct_writes;
};

// An image file or a block device, through pread/pwrite.
Result<std::unique_ptr<BlockDevice>> OpenFileDevice(const std::string& path, OpenFlags flags = {});

// What an IMAGE argument names: an image in a Ceph cluster for
// "rbd:POOL/IMAGE..." (io/rbd_device.h), else an image file or block device.
// Every open of a user's image goes through here.
Result<std::unique_ptr<BlockDevice>> OpenDevice(const std::string& path, OpenFlags flags = {});

// A device over a byte buffer (tests and fuzzing).
std::unique_ptr<BlockDevice> NewMemoryDevice(std::string name, std::span<const uint8_t> bytes);

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_BLOCK_DEVICE_H_
