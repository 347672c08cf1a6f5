// Which files hold a logical address, on an opened volume (the public
// ResolveLogical of ubtrfs/inspect.h opens the image and calls this; the
// fuzz target calls it on an image in memory).
#ifndef UBTRFS_INSPECT_LOGICAL_RESOLVE_H_
#define UBTRFS_INSPECT_LOGICAL_RESOLVE_H_

#include <cstdint>

#include "txn/volume.h"
#include "ubtrfs/inspect.h"
#include "ubtrfs/status.h"

namespace ubtrfs::inspect {

// Fills `out` (refs, errors); a non-OK Status when the address is in no
// extent (ENOENT), in a tree block (EINVAL), or the extent tree does not
// read there.
Status ResolveLogicalIn(txn::Volume* vol, uint64_t logical, const LogicalResolveOptions& options,
                        LogicalResolution* out);

}  // namespace ubtrfs::inspect

#endif  // UBTRFS_INSPECT_LOGICAL_RESOLVE_H_
