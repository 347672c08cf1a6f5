// The open every `ubtrfs rescue` repair starts from: the devices the user
// named (and found in the scan directories), each locked against a mount,
// a volume over them, and a transaction manager where the repair goes
// through a commit.
#ifndef UBTRFS_RESCUE_RESCUE_OPEN_H_
#define UBTRFS_RESCUE_RESCUE_OPEN_H_

#include <memory>
#include <string>
#include <vector>

#include "txn/offline_open.h"
#include "txn/transaction.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

namespace ubtrfs::rescue {

struct Opened {
  std::vector<std::unique_ptr<txn::ImageLock>> locks;
  std::unique_ptr<txn::Volume> vol;
  std::unique_ptr<txn::TxnManager> txn;  // (declared last: closed before the volume)
};

struct OpenHow {
  bool writable = true;
  bool with_txn = false;
  int super_mirror = -1;  // RescueOptions::super_mirror
  // Refuse when devices are missing, saying why every one is needed; empty:
  // go on with the ones there are (a warning names the others).
  std::string why_all_devices;
};

Result<Opened> Open(const std::string& image, const OpenOptions& where, const OpenHow& how);

}  // namespace ubtrfs::rescue

#endif  // UBTRFS_RESCUE_RESCUE_OPEN_H_
