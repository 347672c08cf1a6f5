#include "support/kernel_view.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ubtrfs_test {

bool MountKernelView(LoopMount& m, const std::string& image, const std::string& dir, const std::string& options) {
  std::string why;
  if (!LoopMountsAvailable(&why)) {
    std::printf("kernel view not compared: loop mounts unavailable: %s\n", why.c_str());
    return false;
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    ADD_FAILURE() << "mkdir " << dir << ": " << std::strerror(errno);
    return false;
  }
  const std::string err = m.Mount(image, dir, options);
  EXPECT_EQ(err, "") << "loop mount of " << image;
  return err.empty();
}

}  // namespace ubtrfs_test
