// `btrfs rescue fix-device-size` (ubtrfs/rescue.h): DEV_ITEM sizes a
// sector multiple and within their devices, the superblock's total their
// sum. Older kernels left sizes unaligned (a partition of an odd size); the
// kernel since 4.11 refuses a superblock total below the devices' sum and
// warns about unaligned ones.
#include <algorithm>

#include "rescue/rescue_open.h"
#include "txn/relocate.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs {

Result<FixDeviceSizeResult> FixDeviceSize(const std::string& image, const OpenOptions& where) {
  rescue::OpenHow how;
  how.with_txn = true;
  how.why_all_devices = "every device's size is checked against the device itself, so all are needed";
  UB_ASSIGN_OR_RETURN(rescue::Opened o, rescue::Open(image, where, how));
  if (o.vol->sprouted()) {
    return Status::Unsupported(image + ": a filesystem sprouted from a seed device (its seed's size is not ours to fix)");
  }
  FixDeviceSizeResult r;
  r.warnings = o.vol->warnings();
  const uint64_t ss = o.vol->sectorsize();
  r.old_super_bytes = o.vol->super().total_bytes.get();
  txn::DeviceLayout layout(o.txn.get());
  const auto items = o.vol->dev_items();  // (a copy: SetDeviceSize changes the volume's)
  for (const auto& [devid, item] : items) {
    io::BlockDevice* dev = o.vol->devices().Get(devid);
    if (dev == nullptr) return Status::Invalid(image + ": device " + std::to_string(devid) + " is not there");
    const uint64_t old_bytes = item.total_bytes.get();
    const uint64_t want = std::min(old_bytes, dev->Size()) / ss * ss;
    if (want == old_bytes) continue;
    // (refused, naming the chunk, when one reaches past `want`)
    UB_RETURN_IF_ERROR(layout.SetDeviceSize(devid, want).WithContext(image));
    r.devices.push_back(DeviceSizeChange{devid, old_bytes, want});
  }
  uint64_t sum = 0;
  for (const auto& [devid, item] : o.vol->dev_items()) sum += item.total_bytes.get();
  r.new_super_bytes = sum;
  if (!r.changed()) return r;
  {
    auto lock = o.vol->SuperLock();
    o.vol->mutable_super().total_bytes = sum;
  }
  o.txn->ForceSuperblockWrite();
  UB_RETURN_IF_ERROR(o.txn->Commit().WithContext(image));
  return r;
}

}  // namespace ubtrfs
