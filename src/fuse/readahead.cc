#include "fuse/readahead.h"

#include <fstream>
#include <sstream>
#include <string_view>

namespace ubtrfs::fuse {
namespace {

// mountinfo writes space, tab, newline and backslash in a path as \ooo.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' &&
        s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

std::string SetMountReadahead(const std::string& mountpoint, unsigned kib) {
  std::ifstream info("/proc/self/mountinfo");
  if (!info) return "no /proc/self/mountinfo";
  // Fields: id, parent id, major:minor, root, mount point, ... - fstype ...
  std::string line, dev;
  while (std::getline(info, line)) {
    std::istringstream f(line);
    std::string id, parent, majmin, root, mp;
    if (!(f >> id >> parent >> majmin >> root >> mp)) continue;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 4, "fuse") != 0) continue;
    if (Unescape(mp) == mountpoint) dev = majmin;  // the last one is the newest
  }
  if (dev.empty()) return "the mount is not in /proc/self/mountinfo";
  const std::string knob = "/sys/class/bdi/" + dev + "/read_ahead_kb";
  std::ofstream out(knob);
  if (!out) return "cannot open " + knob;
  out << kib << '\n';
  out.flush();
  if (!out) return "cannot write " + knob;
  return "";
}

}  // namespace ubtrfs::fuse
