#include "io/mounted.h"

#include <cstdlib>
#include <fstream>

namespace ubtrfs::io {

bool MountedByKernel(const std::string& path) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (!real) return false;
  const std::string target = real;
  std::free(real);
  std::ifstream mounts("/proc/self/mounts");
  std::string line;
  while (std::getline(mounts, line)) {
    const std::string source = line.substr(0, line.find(' '));
    if (source == target) return true;
    if (source.rfind("/dev/loop", 0) == 0) {
      std::ifstream backing("/sys/block/" + source.substr(5) + "/loop/backing_file");
      std::string file;
      if (std::getline(backing, file) && file == target) return true;
    }
  }
  return false;
}

}  // namespace ubtrfs::io
