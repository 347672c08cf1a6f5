// Recording side of ubtrfs statistics (the snapshot side is the public
// include/ubtrfs/stats.h). Counters and histograms are registered once by
// name, live for the whole process, and are updated with relaxed atomics, so
// recording is safe from any thread and costs a few nanoseconds. Each keeps
// one slot per thread group (kSlots, a cache line or more each; a thread
// takes a slot on first use, round robin) and reads sum them: threads that
// record at once do not bounce one cache line between cores.
//
//   static stats::Histogram& h = stats::GetHistogram("commit.time", "ns");
//   stats::ScopedTimer t(h);
#ifndef UBTRFS_STATS_STATS_H_
#define UBTRFS_STATS_STATS_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "ubtrfs/stats.h"

namespace ubtrfs::stats {

constexpr int kSlots = 8;
// This thread's slot.
int ThreadSlot();

class Counter {
 public:
  void Add(uint64_t n = 1) { v_[ThreadSlot()].v.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Get() const {
    uint64_t sum = 0;
    for (const auto& s : v_) sum += s.v.load(std::memory_order_relaxed);
    return sum;
  }
  void Reset() {
    for (auto& s : v_) s.v.store(0, std::memory_order_relaxed);
  }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> v{0};
  };
  std::array<Slot, kSlots> v_{};
};

class Histogram {
 public:
  static constexpr int kBuckets = 65;
  void Record(uint64_t v);
  void Reset();
  HistogramSnapshot Snapshot(const std::string& name, const std::string& unit) const;

 private:
  struct alignas(64) Slot {
    std::array<std::atomic<uint64_t>, kBuckets> buckets{};
    std::atomic<uint64_t> sum{0}, max{0};
  };
  std::array<Slot, kSlots> slots_{};
};

// Registered objects are never destroyed; references stay valid.
Counter& GetCounter(const std::string& name);
Histogram& GetHistogram(const std::string& name, const std::string& unit);

inline uint64_t NowNs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

// Records the time from construction to destruction (ns).
class ScopedTimer {
 public:
  explicit ScopedTimer(Histogram& h) : h_(h), start_(NowNs()) {}
  ~ScopedTimer() { h_.Record(NowNs() - start_); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  Histogram& h_;
  uint64_t start_;
};

}  // namespace ubtrfs::stats

#endif  // UBTRFS_STATS_STATS_H_
