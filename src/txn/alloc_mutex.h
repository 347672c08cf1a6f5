// The lock behind TxnManager::AllocLock: recursive (an allocation may make a
// chunk, which allocates again), held for a microsecond or two at a time, and
// taken several times per small file by every writing thread.
//
// std::recursive_mutex sleeps on the futex as soon as it is contended, and
// the sleep and wake-up cost more than the section it waits for (measured on
// a 2-core VM: a third of the system time of a 4 KiB create run went to
// futex wait/wake on this lock). So a waiter spins first, for about the
// length of a section, and only then blocks.
#ifndef UBTRFS_TXN_ALLOC_MUTEX_H_
#define UBTRFS_TXN_ALLOC_MUTEX_H_

#include <atomic>
#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ubtrfs::txn {

class AllocMutex {
 public:
  void lock() {
    const std::thread::id self = std::this_thread::get_id();
    if (owner_.load(std::memory_order_relaxed) == self) {
      ++depth_;
      return;
    }
    if (!mu_.try_lock()) {
      bool got = false;
      for (int i = 0; i < kSpins && !got; ++i) {
        Relax();
        got = mu_.try_lock();
      }
      if (!got) mu_.lock();
    }
    owner_.store(self, std::memory_order_relaxed);
    depth_ = 1;
  }
  void unlock() {
    if (--depth_ > 0) return;
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mu_.unlock();
  }

 private:
  static constexpr int kSpins = 2000;
  static void Relax() {
#if defined(__x86_64__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }

  std::mutex mu_;
  // Only the holder writes it; another thread reading it sees either a
  // different thread's id or none, never its own, so relaxed is enough.
  std::atomic<std::thread::id> owner_{};
  int depth_ = 0;
};

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_ALLOC_MUTEX_H_
