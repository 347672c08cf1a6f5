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
#include "ubtrfs/check.h"
#include "ubtrfs/status.h"

namespace ubtrfs::check {

// The options and the result are the public API's (ubtrfs/check.h); a
// scrub of an opened volume ignores where the image's devices are.
using ::ubtrfs::ScrubOptions;
using ::ubtrfs::ScrubResult;
using ::ubtrfs::ScrubSummary;
using ::ubtrfs::ScrubJson;

// Repairs write straight to the devices (no transaction): they must have
// been opened writable unless options.readonly.
Result<ScrubResult> ScrubVolume(txn::Volume& vol, const ScrubOptions& options);

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_SCRUB_H_
