#include "fs/work_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ubtrfs::fs {
namespace {

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

// The cores counted are the ones the process may use, not the machine's.
TEST(WorkPool, UsableCoresFollowTheAffinity) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(UsableCores(), static_cast<unsigned>(CPU_COUNT(&all)));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(UsableCores(), 1u);
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
}

}  // namespace
}  // namespace ubtrfs::fs
