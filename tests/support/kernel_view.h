// Where a test goes on to compare with the kernel's view of an image, as
// far as the machine allows: loop mounts need root and /dev/loop-control,
// and without them the test keeps what it asserted so far.
#ifndef UBTRFS_TESTS_SUPPORT_KERNEL_VIEW_H_
#define UBTRFS_TESTS_SUPPORT_KERNEL_VIEW_H_

#include <string>

#include "support/test_util.h"

namespace ubtrfs_test {

// Mounts `image` through `m` at `dir` (made here) with `options`. False
// where loop mounts are unavailable (the test's output says the kernel's
// view was not compared) or the mount failed (a failure is added).
bool MountKernelView(LoopMount& m, const std::string& image, const std::string& dir,
                     const std::string& options = "");

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_KERNEL_VIEW_H_
