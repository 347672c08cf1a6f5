#include "fs/work_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ubtrfs::fs {
namespace UBTRFS_UNITY_ID {

// Every index runs once, also with two callers at the same time (one of
// them runs its items alone) and with a call from inside an item (which
// must not wait for the pool it is running on). ./test runs this under
// ThreadSanitizer.
TEST(WorkPool, EachIndexOnceFromTwoCallersAndFromInside) {
  auto run = [](size_t n) {
    std::vector<std::atomic<int>> hits(n);
    ParallelFor(n, [&](size_t i) {
      hits[i].fetch_add(1);
      if (i % 16 == 0) {
        std::atomic<int> inner{0};
        ParallelFor(3, [&](size_t) { inner.fetch_add(1); });
        EXPECT_EQ(inner.load(), 3);
      }
    });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << i;
  };
  for (int round = 0; round < 20; ++round) {
    std::thread other([&] { run(97); });
    run(200);
    other.join();
  }
  run(0);
  run(1);
}

}  // namespace
}  // namespace ubtrfs::fs
