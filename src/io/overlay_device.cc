#include "io/overlay_device.h"

#include <algorithm>
#include <cstring>

namespace ubtrfs::io {

OverlayDevice::OverlayDevice(std::unique_ptr<BlockDevice> inner) : OverlayDevice([&] {
  auto s = std::make_shared<State>();
  s->inner = std::move(inner);
  return s;
}()) {}

OverlayDevice::OverlayDevice(std::shared_ptr<State> s)
    : s_(std::move(s)), size_(s_->inner->Size()), name_(s_->inner->Name()) {}

std::unique_ptr<OverlayDevice> OverlayDevice::Share() const {
  return std::unique_ptr<OverlayDevice>(new OverlayDevice(s_));
}

uint64_t OverlayDevice::held_bytes() const {
  std::lock_guard lock(s_->mu);
  return s_->pages.size() * kPage;
}

Status OverlayDevice::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  UB_RETURN_IF_ERROR(s_->inner->ReadAt(offset, buf));
  std::lock_guard lock(s_->mu);
  if (s_->pages.empty() || buf.empty()) return Status::Ok();
  const uint64_t end = offset + buf.size();
  for (auto it = s_->pages.lower_bound(offset / kPage); it != s_->pages.end() && it->first * kPage < end; ++it) {
    const uint64_t pstart = it->first * kPage;
    const uint64_t from = std::max(pstart, offset), to = std::min(pstart + it->second.size(), end);
    if (from < to) std::memcpy(buf.data() + (from - offset), it->second.data() + (from - pstart), to - from);
  }
  return Status::Ok();
}

Status OverlayDevice::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  const uint64_t end = offset + buf.size();
  if (end < offset || end > size_) {
    return Status::IoError(name_ + ": write of " + std::to_string(buf.size()) + " bytes at " + std::to_string(offset) +
                           " is past the end of the device (" + std::to_string(size_) + " bytes)");
  }
  std::lock_guard lock(s_->mu);
  for (uint64_t p = offset / kPage; p * kPage < end; ++p) {
    const uint64_t pstart = p * kPage;
    auto it = s_->pages.find(p);
    if (it == s_->pages.end()) {
      std::vector<uint8_t> page(std::min(kPage, size_ - pstart));
      if (offset > pstart || end < pstart + page.size()) UB_RETURN_IF_ERROR(s_->inner->ReadAt(pstart, page));
      it = s_->pages.emplace(p, std::move(page)).first;
    }
    const uint64_t from = std::max(pstart, offset), to = std::min(pstart + it->second.size(), end);
    std::memcpy(it->second.data() + (from - pstart), buf.data() + (from - offset), to - from);
  }
  return Status::Ok();
}

}  // namespace ubtrfs::io
