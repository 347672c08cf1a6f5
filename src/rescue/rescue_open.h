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

// A repair that goes through a commit: `image` opened with every device
// there (`why_all_devices` says why, when one is missing), `repair` run on
// it, the commit made when `changed` says so; the open's warnings go into
// the result, errors name the image.
template <typename R, typename Repair, typename Changed>
Result<R> RepairAndCommit(const std::string& image, const OpenOptions& where, std::string why_all_devices,
                          Repair&& repair, Changed&& changed) {
  OpenHow how;
  how.with_txn = true;
  how.why_all_devices = std::move(why_all_devices);
  UB_ASSIGN_OR_RETURN(Opened o, Open(image, where, how));
  Result<R> r = repair(*o.vol, *o.txn);
  if (!r.ok()) return r.status().WithContext(image);
  r->warnings = o.vol->warnings();
  if (changed(*r)) UB_RETURN_IF_ERROR(o.txn->Commit().WithContext(image));
  return r;
}

}  // namespace ubtrfs::rescue

#endif  // UBTRFS_RESCUE_RESCUE_OPEN_H_
