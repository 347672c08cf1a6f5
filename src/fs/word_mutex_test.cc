#include "fs/word_mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace ubtrfs::fs {
namespace UBTRFS_UNITY_ID {

TEST(WordMutex, TryLockFailsWhileHeld) {
  WordMutex mu;
  ASSERT_TRUE(mu.try_lock());
  EXPECT_FALSE(mu.try_lock());
  mu.unlock();
  EXPECT_TRUE(mu.try_lock());
  mu.unlock();
}

// Increments that are not atomic, made under the lock by more threads than
// cores, with the lock held long enough now and then that the others sleep
// on it: a lost wake-up hangs the test, a broken exclusion loses counts.
TEST(WordMutex, ExcludesAndWakesSleepers) {
  WordMutex mu;
  uint64_t count = 0;
  constexpr int kThreads = 4, kRounds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard lock(mu);
        const uint64_t seen = count;
        if ((i + t) % 1000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        count = seen + 1;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(count, uint64_t{kThreads} * kRounds);
}

// A table of them, as the inode-lock stripes are: neighbours in one cache
// line are independent locks.
TEST(WordMutex, NeighboursAreIndependent) {
  WordMutex table[16];
  std::lock_guard a(table[3]);
  EXPECT_TRUE(table[4].try_lock());
  EXPECT_FALSE(table[3].try_lock());
  table[4].unlock();
}

}  // namespace
}  // namespace ubtrfs::fs
