#include "io/cores.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

// The cores counted are the ones the process may use, not the machine's.
TEST(UsableCores, FollowTheAffinity) {
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
}  // namespace ubtrfs::io
