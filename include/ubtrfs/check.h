// Checking an image below its files: `ubtrfs check` (read-only consistency,
// as `btrfs check --readonly`) and `ubtrfs scrub` (every copy of every block
// and checksummed sector verified, bad copies rewritten from good ones, as
// `btrfs scrub start -B`). Neither needs the image to open as a Filesystem:
// damage that stops an open is what they report.
#ifndef UBTRFS_CHECK_H_
#define UBTRFS_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

struct CheckOptions {
  // Read every data sector that has a checksum and verify it (every copy).
  bool check_data_csum = false;
  // Error lines kept in the result (all are counted); 0 = no limit.
  size_t max_errors = 2000;
  // Where the filesystem lies in the image (OpenOptions::offset, partition).
  uint64_t offset = 0;
  int partition = 0;
  // Where to look for the other devices (the path may also be
  // IMG1,IMG2,...).
  std::vector<std::string> scan_dirs;
  // Which commit to check, as btrfs check's --backup (the newest backup
  // root that reads, when the superblock's root tree does not), --tree-root
  // and --super: use_backup_root, tree_root and super_mirror of
  // RescueOptions (the others are not taken: they would hide damage).
  bool use_backup_root = false;
  uint64_t tree_root = 0;
  int super_mirror = -1;
};

struct CheckResult {
  // One line per problem, naming the tree, block or key and what is wrong.
  std::vector<std::string> errors;
  size_t error_count = 0;  // may exceed errors.size() (max_errors)
  // Things worth saying that are not damage (a tree log, stale free space
  // info items btrfs check accepts, a repaired DUP copy, ...).
  std::vector<std::string> warnings;
  // Statistics in a fixed order: tree_blocks, trees, inodes, ...
  std::vector<std::pair<std::string, uint64_t>> counts;
  bool clean() const { return error_count == 0; }
};

// Opens `path` read-only and checks it. A non-OK Status means the check could
// not run at all: the file cannot be opened, it holds no btrfs superblock, or
// it uses features ubtrfs does not read (exit code 8 in the CLI). Damage that
// stops the volume from opening (a bad chunk tree or root tree) is reported
// as an error in the result instead. Never writes.
UBTRFS_API Result<CheckResult> CheckImage(const std::string& path, const CheckOptions& options = {});

// The result as one JSON object: {"errors": [...], "warnings": [...],
// "counts": {...}, "clean": bool}.
UBTRFS_API std::string CheckJson(const CheckResult& result);

struct ScrubOptions {
  bool readonly = false;     // only report: nothing is written, the devices are opened read-only
  bool data = true;          // data sectors with checksums
  bool metadata = true;      // tree blocks
  bool superblocks = true;   // every copy on every device
  size_t max_errors = 2000;  // error lines kept (all are counted)
  // Lines only for bad copies that have a good one (check: blocks with no
  // good copy are its own errors already).
  bool only_repairable = false;
  // Where the filesystem lies in the image and where its other devices are,
  // as for CheckOptions.
  uint64_t offset = 0;
  int partition = 0;
  std::vector<std::string> scan_dirs;
};

struct ScrubResult {
  uint64_t tree_blocks = 0, tree_bytes = 0;  // blocks scrubbed (each counted once), bytes over every copy
  uint64_t data_bytes = 0;                   // checksummed data, over every copy
  uint64_t no_csum_bytes = 0;                // data without checksums: cannot be verified
  uint64_t super_copies = 0;
  uint64_t super_errors = 0;   // superblock copies bad, of another device or generation
  uint64_t verify_errors = 0;  // tree block copies that failed verification
  uint64_t csum_errors = 0;    // data sector copies whose checksum did not match
  uint64_t parity_errors = 0;  // RAID5/6 P or Q elements that did not match their row's data
  uint64_t parity_rows = 0;    // RAID5/6 rows whose parity was checked
  uint64_t read_errors = 0;    // copies that could not be read
  uint64_t corrected = 0;      // bad copies rewritten from a good one
  uint64_t uncorrectable = 0;  // blocks or sectors with no good copy
  uint64_t unrepaired = 0;     // bad copies left (readonly)
  std::vector<uint64_t> missing_devices;
  std::vector<std::string> errors;  // one line per bad copy
  size_t error_lines_dropped = 0;
  double seconds = 0;
  // Messages about the open that are not errors of the scrub (a device
  // missing, a tree log left to replay).
  std::vector<std::string> warnings;
  uint64_t errors_found() const { return super_errors + verify_errors + csum_errors + read_errors + parity_errors; }
};

// Opens the devices `path` names (IMG1,IMG2,... and options.scan_dirs) and
// scrubs them. Repairs go straight to the devices, not through a
// transaction, so a RAID5/6 row is put back in place. A non-OK Status: the
// scrub could not run (the devices cannot be opened, no btrfs on them).
UBTRFS_API Result<ScrubResult> ScrubImage(const std::string& path, const ScrubOptions& options = {});

// `btrfs scrub status`-like text, and one JSON object.
UBTRFS_API std::string ScrubSummary(const ScrubResult& r);
UBTRFS_API std::string ScrubJson(const ScrubResult& r);

}  // namespace ubtrfs

#endif  // UBTRFS_CHECK_H_
