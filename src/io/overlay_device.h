// A device whose writes stay in memory: reads see them over the bytes of the
// device below, which is never written. The tree-log replay of a read-only
// open (src/log/) commits into one, so the replayed state can be read
// without changing the image. Several handles may share one overlay (the
// replay writes through one Volume, the read-only view reads through
// another); it lives as long as the last handle.
#ifndef UBTRFS_IO_OVERLAY_DEVICE_H_
#define UBTRFS_IO_OVERLAY_DEVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "io/block_device.h"

namespace ubtrfs::io {

class OverlayDevice final : public BlockDevice {
 public:
  explicit OverlayDevice(std::unique_ptr<BlockDevice> inner);

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override { return Status::Ok(); }
  uint64_t Size() const override { return size_; }
  std::string Name() const override { return name_; }

  // Another handle on the same overlay (same written bytes, same device).
  std::unique_ptr<OverlayDevice> Share() const;
  // Bytes held in memory.
  uint64_t held_bytes() const;

 private:
  static constexpr uint64_t kPage = 4096;
  struct State {
    std::unique_ptr<BlockDevice> inner;
    std::mutex mu;
    std::map<uint64_t, std::vector<uint8_t>> pages;  // page index -> kPage bytes (the last may be short)
  };
  explicit OverlayDevice(std::shared_ptr<State> s);
  std::shared_ptr<State> s_;
  uint64_t size_;
  std::string name_;
};

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_OVERLAY_DEVICE_H_
