#include "io/undo_device.h"

#include <algorithm>

namespace ubtrfs::io {

Status UndoDevice::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  {
    std::lock_guard lock(mu_);
    // Save the parts of [offset, end) no earlier write saved.
    const uint64_t end = offset + buf.size();
    uint64_t at = offset;
    auto it = old_.upper_bound(offset);
    if (it != old_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.size() > at) at = prev->first + prev->second.size();
    }
    while (at < end) {
      const uint64_t gap_end = (it != old_.end() && it->first < end) ? it->first : end;
      if (gap_end > at) {
        std::vector<uint8_t> saved(gap_end - at);
        UB_RETURN_IF_ERROR(inner_->ReadAt(at, saved));
        held_ += saved.size();
        old_.emplace(at, std::move(saved));
      }
      if (it == old_.end() || it->first >= end) break;
      at = std::max(at, it->first + it->second.size());
      ++it;
    }
  }
  return inner_->WriteAt(offset, buf);
}

void UndoDevice::Forget() {
  std::lock_guard lock(mu_);
  old_.clear();
  held_ = 0;
}

Status UndoDevice::Rollback() {
  std::lock_guard lock(mu_);
  for (const auto& [at, bytes] : old_) UB_RETURN_IF_ERROR(inner_->WriteAt(at, bytes));
  old_.clear();
  held_ = 0;
  return inner_->Flush();
}

uint64_t UndoDevice::held_bytes() const {
  std::lock_guard lock(mu_);
  return held_;
}

}  // namespace ubtrfs::io
