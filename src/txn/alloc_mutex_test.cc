#include "txn/alloc_mutex.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace ubtrfs::txn {
namespace UBTRFS_UNITY_ID {

// Two threads take the lock, some of the time twice over (as an allocation
// that makes a chunk does); every increment of the unguarded counter is
// kept, and ThreadSanitizer (./test runs this suite under it) sees the lock
// order every access.
TEST(AllocMutex, ExcludesOtherThreadsAndNestsInOne) {
  AllocMutex mu;
  long counter = 0;
  constexpr int kRounds = 20000;
  auto work = [&] {
    for (int i = 0; i < kRounds; ++i) {
      std::lock_guard outer(mu);
      ++counter;
      if (i % 3 == 0) {
        std::lock_guard inner(mu);
        ++counter;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  const long per_thread = kRounds + (kRounds + 2) / 3;
  EXPECT_EQ(counter, 3 * per_thread);
}

}  // namespace
}  // namespace ubtrfs::txn
