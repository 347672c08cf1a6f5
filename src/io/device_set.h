// The devices of one filesystem, by devid. A devid the filesystem lists but
// nobody opened is missing: reads and writes to it fail (EIO) naming it, so
// the layers above fall back to another copy or to parity.
#ifndef UBTRFS_IO_DEVICE_SET_H_
#define UBTRFS_IO_DEVICE_SET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "io/block_device.h"

namespace ubtrfs::io {

class DeviceSet {
 public:
  DeviceSet() = default;
  DeviceSet(DeviceSet&&) = default;
  DeviceSet& operator=(DeviceSet&&) = default;

  // False when `devid` is taken already.
  bool Add(uint64_t devid, std::unique_ptr<BlockDevice> dev);
  // Null when the device is missing.
  BlockDevice* Get(uint64_t devid) const;
  bool Has(uint64_t devid) const { return Get(devid) != nullptr; }
  // Present devices, by devid.
  std::vector<uint64_t> Devids() const;
  size_t size() const { return devs_.size(); }
  std::map<uint64_t, uint64_t> Sizes() const;

  Status ReadAt(uint64_t devid, uint64_t offset, std::span<uint8_t> buf);
  Status WriteAt(uint64_t devid, uint64_t offset, std::span<const uint8_t> buf);
  Status WriteGather(uint64_t devid, uint64_t offset, std::span<const std::span<const uint8_t>> pieces);
  // Flushes every present device; the first error wins, all are tried.
  Status Flush();
  void StartWriteback();

  // Takes one device out of the set (device remove); null if absent.
  std::unique_ptr<BlockDevice> Remove(uint64_t devid);
  // Hands every device back (to wrap or reopen them), leaving the set empty.
  std::vector<std::pair<uint64_t, std::unique_ptr<BlockDevice>>> Release();

 private:
  Status Missing(uint64_t devid) const;
  std::map<uint64_t, std::unique_ptr<BlockDevice>> devs_;
};

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_DEVICE_SET_H_
