// mkfs --rootdir for image builders: --subvol and --inode-flags parsing,
// the import of a directory with its subvolumes, and the progress line.
#ifndef UBTRFS_CLI_MKFS_ROOTDIR_H_
#define UBTRFS_CLI_MKFS_ROOTDIR_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ubtrfs/filesystem.h"
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

// A --subvol: the directory below --rootdir that becomes a subvolume.
struct SubvolSpec {
  std::string rel;  // canonical, relative to the canonical rootdir
  bool read_only = false;
  bool is_default = false;
};

// --subvol values as mkfs.btrfs: an optional rw:, ro:, default: or
// default-ro: prefix (anything else before a colon is part of the path; a
// leading ./ keeps a path like "ro:x" whole), the directory relative to the
// canonical rootdir `root`; each an existing directory below it, none twice,
// one default. nullopt and *err on a bad value.
std::optional<std::vector<SubvolSpec>> ParseSubvols(const std::vector<std::string>& args, const std::string& root,
                                                    std::string* err);

// --inode-flags values: FLAG[,FLAG...]:PATH with nodatacow and nodatasum,
// PATH relative to the rootdir (the rootdir itself allowed), none twice;
// the result maps canonical relative paths to kImport* bits.
std::optional<std::map<std::string, uint32_t>> ParseInodeFlags(const std::vector<std::string>& args,
                                                               const std::string& root, std::string* err);

// Imports the canonical rootdir `root` into the image's top with its
// --subvol directories as subvolumes, then sets their read-only flags and
// the default subvolume.
Status ImportRootdir(Filesystem& fs, const std::string& root, const std::vector<SubvolSpec>& subvols,
                     const std::map<std::string, uint32_t>& flags,
                     const std::optional<std::pair<uint32_t, uint32_t>>& owner, const std::optional<Time>& max_time,
                     ProgressLine* progress, ImportStats* stats, bool reflink = false);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_MKFS_ROOTDIR_H_
