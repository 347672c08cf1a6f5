// The repairs of ubtrfs/rescue.h that go through a commit, on a volume and
// transaction manager the caller opened writable (and then commits): the
// public calls open an image for them, the write fuzzer runs them on what
// it made of its input.
#ifndef UBTRFS_RESCUE_REPAIRS_H_
#define UBTRFS_RESCUE_REPAIRS_H_

#include "txn/transaction.h"
#include "txn/volume.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs::rescue {

// Nothing to commit when !had_tree.
Result<ClearUuidTreeResult> ClearUuidTreeIn(txn::Volume& vol, txn::TxnManager& txn);
// Nothing to commit when !changed().
Result<FixDeviceSizeResult> FixDeviceSizeIn(txn::Volume& vol, txn::TxnManager& txn);

}  // namespace ubtrfs::rescue

#endif  // UBTRFS_RESCUE_REPAIRS_H_
