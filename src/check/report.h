// Internal to check/: where problems go, how trees and names are printed,
// and the coverage map of the csum tree.
#ifndef UBTRFS_CHECK_REPORT_H_
#define UBTRFS_CHECK_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "check/checker.h"

namespace ubtrfs::check {

class Report {
 public:
  Report(CheckResult* result, size_t max_errors) : r_(result), max_(max_errors) {}
  void Error(std::string line) {
    ++r_->error_count;
    if (max_ == 0 || r_->errors.size() < max_) r_->errors.push_back(std::move(line));
  }
  void Warning(std::string line) { r_->warnings.push_back(std::move(line)); }
  size_t errors() const { return r_->error_count; }

 private:
  CheckResult* r_;
  size_t max_;
};

// "fs tree 5", "extent tree 2", "subvolume 257", "data reloc tree": how a
// tree is named in every message.
std::string TreeLabel(uint64_t id);

// A name from an image, printable on one line: control bytes, DEL, bytes
// >= 0x80 and the backslash as \xNN (so the report is ASCII and valid JSON
// after the usual escaping).
std::string Esc(std::string_view name);

// The byte ranges the csum tree covers, merged.
class CsumIndex {
 public:
  void Add(uint64_t start, uint64_t len);
  // Bytes of [start, start + len) that have checksums.
  uint64_t Covered(uint64_t start, uint64_t len) const;
  uint64_t total() const { return total_; }
  const std::map<uint64_t, uint64_t>& runs() const { return runs_; }  // start -> end

 private:
  std::map<uint64_t, uint64_t> runs_;
  uint64_t total_ = 0;
};

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_REPORT_H_
