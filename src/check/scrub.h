// scrub: read every copy of every tree block and every checksummed data
// sector, verify it, and rewrite a bad copy from a good one (as the kernel's
// btrfs scrub). RAID5/6: the stored data is verified; a bad element is
// rebuilt from parity and written back in place (the row's parity already
// agrees with the good data); then the P and Q of every row that holds an
// extent are recomputed from the (verified) data and rewritten where they
// differ, unless the row's data is still bad. Copies on missing devices are
// not there to scrub.
#ifndef UBTRFS_CHECK_SCRUB_H_
#define UBTRFS_CHECK_SCRUB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "txn/volume.h"
#include "ubtrfs/status.h"

namespace ubtrfs::check {

struct ScrubOptions {
  bool readonly = false;  // only report (the volume may be read-only then)
  bool data = true;       // data sectors with checksums
  bool metadata = true;   // tree blocks
  bool superblocks = true;  // every copy on every device
  size_t max_errors = 2000;  // error lines kept (all are counted)
  // Lines only for bad copies that have a good one (check: blocks with no
  // good copy are its own errors already).
  bool only_repairable = false;
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
  uint64_t unrepaired = 0;     // bad copies left (--readonly)
  std::vector<uint64_t> missing_devices;
  std::vector<std::string> errors;  // one line per bad copy
  size_t error_lines_dropped = 0;
  double seconds = 0;
  uint64_t errors_found() const { return super_errors + verify_errors + csum_errors + read_errors + parity_errors; }
};

// Repairs write straight to the devices (no transaction): they must have
// been opened writable unless options.readonly.
Result<ScrubResult> ScrubVolume(txn::Volume& vol, const ScrubOptions& options);

// `btrfs scrub status`-like text, and one JSON object.
std::string ScrubSummary(const ScrubResult& r);
std::string ScrubJson(const ScrubResult& r);

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_SCRUB_H_
