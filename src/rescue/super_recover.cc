// `btrfs rescue super-recover` (ubtrfs/rescue.h): bad superblock copies
// written again from the newest good one.
#include "rescue/rescue_open.h"
#include "txn/devices.h"
#include "txn/super_copies.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs {

namespace {

void Close(rescue::Opened* o) {
  o->txn.reset();
  o->vol.reset();
  o->locks.clear();
}

}  // namespace

Result<SuperRecoverResult> SuperRecover(const std::string& image, const OpenOptions& where, bool rewrite) {
  rescue::OpenHow how;
  how.writable = rewrite;
  UB_ASSIGN_OR_RETURN(rescue::Opened o, rescue::Open(image, where, how));
  std::vector<txn::SuperCopyState> copies = txn::CheckSuperCopies(*o.vol);
  // A valid primary is the one the volume follows, as in the kernel; a
  // newer valid copy behind it (a commit that reached only some copies)
  // wins here, as in btrfs-progs, so that nothing newer is overwritten.
  uint64_t newest = o.vol->super().generation.get();
  const txn::SuperCopyState* newer = nullptr;
  for (const auto& c : copies) {
    if (c.valid && c.generation > newest) {
      newest = c.generation;
      newer = &c;
    }
  }
  if (newer != nullptr) {
    // Each device's newest valid copy, wherever it is on that device: the
    // copy that is newest on one may be damaged on another.
    const std::string which = "copy " + std::to_string(newer->mirror) + " of " + newer->device;
    Close(&o);
    how.super_mirror = txn::kNewestValidSuper;
    auto again = rescue::Open(image, where, how);
    if (!again.ok()) {
      return again.status().WithContext("the newest superblock (" + which + ", generation " +
                                        std::to_string(newest) + ") does not open");
    }
    o = std::move(*again);
    copies = txn::CheckSuperCopies(*o.vol);
  }
  SuperRecoverResult r;
  r.warnings = o.vol->warnings();
  for (uint64_t id : o.vol->missing_devices()) {
    r.warnings.push_back("device " + std::to_string(id) + " is missing: its superblocks are left as they are");
  }
  r.generation = o.vol->super().generation.get();
  for (const auto& c : copies) {
    r.copies.push_back(SuperCopy{c.devid, c.device, c.mirror, c.bytenr, c.valid ? c.generation : 0, c.problem});
    if (!c.problem.empty()) ++r.bad;
  }
  if (r.bad == 0 || !rewrite) return r;
  UB_RETURN_IF_ERROR(o.vol->WriteSuperblocks().WithContext(image + ": rewriting the superblocks"));
  UB_RETURN_IF_ERROR(o.vol->devices().Flush().WithContext(image));
  r.rewritten = true;
  return r;
}

}  // namespace ubtrfs
