// Printing for people: sizes in binary units, and the progress line of a
// long import.
#ifndef UBTRFS_CLI_PROGRESS_LINE_H_
#define UBTRFS_CLI_PROGRESS_LINE_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "ubtrfs/import.h"

namespace ubtrfs::cli {

// "1.50MiB": bytes in binary units for people.
std::string Human(uint64_t bytes);

// The import's progress on one updating line of a terminal: entries, data
// and its rate, at most five times a second; Done() clears the line.
class ProgressLine {
 public:
  explicit ProgressLine(bool on) : on_(on), start_(Clock::now()), last_(start_) {}
  void Update(const ImportStats& s);
  void Done();

 private:
  using Clock = std::chrono::steady_clock;
  bool on_;
  bool shown_ = false;
  Clock::time_point start_, last_;
};

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_PROGRESS_LINE_H_
