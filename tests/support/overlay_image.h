// A copy-on-write view of an image file for many short test runs: reads fall
// through to the file, writes land in 4 KiB pages in memory, so a run starts
// from a template image without copying it. Devices made from one overlay
// share its pages (close the file system, open another device, see the same
// bytes); WriteTo() makes a real image file for tools such as btrfs check.
#ifndef UBTRFS_TESTS_SUPPORT_OVERLAY_IMAGE_H_
#define UBTRFS_TESTS_SUPPORT_OVERLAY_IMAGE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "io/block_device.h"
#include "ubtrfs/status.h"

namespace ubtrfs_test {

class OverlayImage : public std::enable_shared_from_this<OverlayImage> {
 public:
  static constexpr uint64_t kPage = 4096;

  static ubtrfs::Result<std::shared_ptr<OverlayImage>> Open(const std::string& base);
  ~OverlayImage();

  // A device over this overlay (the overlay lives as long as its devices).
  std::unique_ptr<ubtrfs::io::BlockDevice> Device();
  // The base file with the written pages on top, as a sparse file at `path`.
  ubtrfs::Status WriteTo(const std::string& path);
  size_t pages() const;
  uint64_t size() const { return size_; }

  ubtrfs::Status Read(uint64_t offset, uint8_t* buf, uint64_t len);
  ubtrfs::Status Write(uint64_t offset, const uint8_t* buf, uint64_t len);

 private:
  OverlayImage(int fd, std::string name, uint64_t size) : fd_(fd), name_(std::move(name)), size_(size) {}
  using Page = std::array<uint8_t, kPage>;

  int fd_;
  std::string name_;
  uint64_t size_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<Page>> pages_;  // by page number
};

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_OVERLAY_IMAGE_H_
