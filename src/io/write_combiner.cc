#include "io/write_combiner.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

namespace ubtrfs::io {
namespace {
std::atomic<size_t> live_buffers{0};
}  // namespace

void WriteCombiner::Free::operator()(uint8_t* p) const {
  std::free(p);
  live_buffers.fetch_sub(1, std::memory_order_relaxed);
}

size_t WriteCombiner::LiveBuffers() { return live_buffers.load(std::memory_order_relaxed); }

bool WriteCombiner::Overlaps(uint64_t offset, uint64_t n) const {
  if (pieces_.empty() || n == 0 || offset >= hi_ || offset + n <= lo_) return false;
  for (const Piece& p : pieces_) {
    if (offset < p.offset + p.len && p.offset < offset + n) return true;
  }
  return false;
}

void WriteCombiner::Add(uint64_t offset, std::span<const uint8_t> data) {
  if (!bytes_) {
    const size_t size = (capacity_ + largest_ + 2 * kAlign - 1) / kAlign * kAlign;
    bytes_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, size)));
    if (!bytes_) throw std::bad_alloc();
    live_buffers.fetch_add(1, std::memory_order_relaxed);
  }
  size_t pos = used_;
  if (offset % kAlign == 0 && data.size() % kAlign == 0) pos = (pos + kAlign - 1) / kAlign * kAlign;
  std::memcpy(bytes_.get() + pos, data.data(), data.size());
  pieces_.push_back(Piece{offset, pos, data.size()});
  used_ = pos + data.size();
  lo_ = std::min(lo_, offset);
  hi_ = std::max(hi_, offset + data.size());
}

Status WriteCombiner::Drain(const WriteRun& write) {
  std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  Status result;
  std::vector<iovec> run;
  uint64_t run_start = 0, run_end = 0;
  auto flush_run = [&] {
    if (!run.empty() && result.ok()) result = write(run_start, run);
    run.clear();
  };
  for (const Piece& p : pieces_) {
    if (run.empty() || p.offset != run_end) {
      flush_run();
      run_start = p.offset;
    }
    run.push_back(iovec{bytes_.get() + p.pos, p.len});
    run_end = p.offset + p.len;
  }
  flush_run();
  pieces_.clear();
  used_ = 0;
  lo_ = UINT64_MAX;
  hi_ = 0;
  return result;
}

}  // namespace ubtrfs::io
