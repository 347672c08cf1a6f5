// Where an image's bytes live, for applications that bring their own
// storage (a network block store, an object store, an encrypted container):
// implement BlockDevice and open a Filesystem on it.
//
//   class MyDevice : public ubtrfs::BlockDevice { ... };
//   auto fs = ubtrfs::Filesystem::Open(std::make_unique<MyDevice>(...), {.writable = true});
//
// The library's own devices (image files, block devices, Ceph RBD images)
// are implementations too: OpenBlockDevice gives one of them.
#ifndef UBTRFS_BLOCK_DEVICE_H_
#define UBTRFS_BLOCK_DEVICE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

// Calls may come from several threads at once (reads beside reads and
// writes; a large commit writes from two threads).
class UBTRFS_API BlockDevice {
 public:
  virtual ~BlockDevice();
  // Reads exactly buf.size() bytes at `offset`; past the end is an error.
  virtual Status ReadAt(uint64_t offset, std::span<uint8_t> buf) = 0;
  // Writes all of buf at `offset`. It may return before the bytes are
  // durable (and report a failure of theirs at the next Flush), but a read
  // that follows must see them.
  virtual Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) = 0;
  // Every write that returned before is durable when this returns Ok: the
  // commit's order (tree blocks, flush, superblocks, flush) rests on it.
  virtual Status Flush() = 0;
  // The device's size in bytes (fixed while the filesystem is open).
  virtual uint64_t Size() const = 0;
  // For messages.
  virtual std::string Name() const { return "device"; }
};

// An image file, a block device, or rbd:POOL/IMAGE[@SNAP][:KEY=VALUE...]
// (a Ceph RBD image through librbd, when ubtrfs was built with it; a
// writable open takes the image's exclusive lock), as Filesystem::Open(path)
// opens it.
UBTRFS_API Result<std::unique_ptr<BlockDevice>> OpenBlockDevice(const std::string& path, bool writable = false);

}  // namespace ubtrfs

#endif  // UBTRFS_BLOCK_DEVICE_H_
