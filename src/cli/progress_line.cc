#include "cli/progress_line.h"

#include <fmt/core.h>

#include <cstdio>

namespace ubtrfs::cli {

std::string Human(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{}B", bytes) : fmt::format("{:.2f}{}", v, kUnits[u]);
}

void ProgressLine::Update(const ImportStats& s) {
  if (!on_) return;
  const auto now = Clock::now();
  // The first line at once (so a short build shows one too), then five a
  // second at most.
  if (shown_ && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  const double secs = std::chrono::duration<double>(now - start_).count();
  const uint64_t entries = s.files + s.dirs + s.symlinks + s.hardlinks + s.specials;
  fmt::print(stderr, "\r\033[K{} files, {} directories, {} entries; {}, {}/s", s.files, s.dirs, entries,
             Human(s.bytes), Human(secs > 0 ? static_cast<uint64_t>(static_cast<double>(s.bytes) / secs) : 0));
  std::fflush(stderr);
  shown_ = true;
}

void ProgressLine::Done() {
  if (shown_) fmt::print(stderr, "\r\033[K");
  shown_ = false;
}

}  // namespace ubtrfs::cli
