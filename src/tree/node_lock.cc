#include "tree/node_lock.h"

#include <thread>

#include "stats/stats.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define UBTRFS_CPU_RELAX() _mm_pause()
#else
#define UBTRFS_CPU_RELAX() std::this_thread::yield()
#endif

namespace ubtrfs::tree {
namespace {

constexpr int kSpins = 128;

struct LockStats {
  stats::Histogram& wait_shared = stats::GetHistogram("lock.wait.shared", "ns");
  stats::Histogram& wait_intent = stats::GetHistogram("lock.wait.intent", "ns");
  stats::Histogram& wait_write = stats::GetHistogram("lock.wait.write", "ns");
  stats::Counter& contended = stats::GetCounter("lock.contended");
  stats::Counter& slept = stats::GetCounter("lock.slept");
  stats::Counter& conversions = stats::GetCounter("lock.conversions");  // no code path converts; stays 0
};
LockStats& S() {
  static LockStats s;
  (void)s.conversions;
  return s;
}

}  // namespace

bool NodeLock::TryLockShared() {
  uint64_t s = state_.load(std::memory_order_relaxed);
  while (!(s & kWriteBit)) {
    if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) return true;
  }
  return false;
}

bool NodeLock::TryLockIntent() {
  uint64_t s = state_.load(std::memory_order_relaxed);
  while (!(s & kIntentBit)) {
    if (state_.compare_exchange_weak(s, s | kIntentBit, std::memory_order_acquire)) return true;
  }
  return false;
}

// Shared and intent: take the lock when its blocking bit is clear. Spin only
// while no one else waits, then sleep as a registered waiter.
void NodeLock::SlowLock(LockMode mode) {
  const uint64_t block = mode == LockMode::kShared ? kWriteBit : kIntentBit;
  const uint64_t t0 = stats::NowNs();
  S().contended.Add();
  auto try_take = [&](uint64_t& s) {
    while (!(s & block)) {
      const uint64_t next = mode == LockMode::kShared ? s + 1 : (s | kIntentBit);
      if (state_.compare_exchange_weak(s, next, std::memory_order_acquire)) return true;
    }
    return false;
  };
  uint64_t s = state_.load(std::memory_order_relaxed);
  for (int i = 0; i < kSpins && !(s & kWaiterMask); ++i) {
    if (try_take(s)) {
      (mode == LockMode::kShared ? S().wait_shared : S().wait_intent).Record(stats::NowNs() - t0);
      return;
    }
    UBTRFS_CPU_RELAX();
    s = state_.load(std::memory_order_relaxed);
  }
  S().slept.Add();
  state_.fetch_add(kWaiterOne, std::memory_order_relaxed);
  s = state_.load(std::memory_order_relaxed);
  for (;;) {
    while (!(s & block)) {
      // Take the lock and drop the waiter registration in one step.
      const uint64_t next = (mode == LockMode::kShared ? s + 1 : (s | kIntentBit)) - kWaiterOne;
      if (state_.compare_exchange_weak(s, next, std::memory_order_acquire)) {
        (mode == LockMode::kShared ? S().wait_shared : S().wait_intent).Record(stats::NowNs() - t0);
        return;
      }
    }
    state_.wait(s, std::memory_order_relaxed);
    s = state_.load(std::memory_order_relaxed);
  }
}

// Write: set the write bit (new readers now wait), then wait for the readers
// inside to drain. Only the intent holder calls this, so the bit is free.
void NodeLock::LockWrite() {
  uint64_t s = state_.fetch_or(kWriteBit, std::memory_order_acquire) | kWriteBit;
  if ((s & kReaderMask) == 0) return;
  const uint64_t t0 = stats::NowNs();
  S().contended.Add();
  for (int i = 0; i < kSpins && !(s & kWaiterMask); ++i) {
    UBTRFS_CPU_RELAX();
    s = state_.load(std::memory_order_acquire);
    if ((s & kReaderMask) == 0) {
      S().wait_write.Record(stats::NowNs() - t0);
      return;
    }
  }
  S().slept.Add();
  state_.fetch_add(kWaiterOne, std::memory_order_relaxed);
  for (;;) {
    s = state_.load(std::memory_order_acquire);
    if ((s & kReaderMask) == 0) break;
    state_.wait(s, std::memory_order_relaxed);
  }
  state_.fetch_sub(kWaiterOne, std::memory_order_relaxed);
  S().wait_write.Record(stats::NowNs() - t0);
}

}  // namespace ubtrfs::tree
