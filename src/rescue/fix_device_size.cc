// `btrfs rescue fix-device-size` (ubtrfs/rescue.h): DEV_ITEM sizes a
// sector multiple and within their devices, the superblock's total their
// sum. Older kernels left sizes unaligned (a partition of an odd size); the
// kernel since 4.11 refuses a superblock total below the devices' sum and
// warns about unaligned ones.
#include <algorithm>

#include "rescue/repairs.h"
#include "rescue/rescue_open.h"
#include "txn/relocate.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs {

namespace rescue {

Result<FixDeviceSizeResult> FixDeviceSizeIn(txn::Volume& vol, txn::TxnManager& txn) {
  if (vol.sprouted()) {
    return Status::Unsupported("a filesystem sprouted from a seed device (its seed's size is not ours to fix)");
  }
  FixDeviceSizeResult r;
  const uint64_t ss = vol.sectorsize();
  r.old_super_bytes = vol.super().total_bytes.get();
  txn::DeviceLayout layout(&txn);
  const auto items = vol.dev_items();  // (a copy: SetDeviceSize changes the volume's)
  for (const auto& [devid, item] : items) {
    io::BlockDevice* dev = vol.devices().Get(devid);
    if (dev == nullptr) return Status::Invalid("device " + std::to_string(devid) + " is not there");
    const uint64_t old_bytes = item.total_bytes.get();
    const uint64_t want = std::min(old_bytes, dev->Size()) / ss * ss;
    if (want == old_bytes) continue;
    // (refused, naming the chunk, when one reaches past `want`)
    UB_RETURN_IF_ERROR(layout.SetDeviceSize(devid, want));
    r.devices.push_back(DeviceSizeChange{devid, old_bytes, want});
  }
  uint64_t sum = 0;
  for (const auto& [devid, item] : vol.dev_items()) sum += item.total_bytes.get();
  r.new_super_bytes = sum;
  if (!r.changed()) return r;
  {
    auto lock = vol.SuperLock();
    vol.mutable_super().total_bytes = sum;
  }
  txn.ForceSuperblockWrite();
  return r;
}

}  // namespace rescue

Result<FixDeviceSizeResult> FixDeviceSize(const std::string& image, const OpenOptions& where) {
  return rescue::RepairAndCommit<FixDeviceSizeResult>(
      image, where, "every device's size is checked against the device itself, so all are needed",
      rescue::FixDeviceSizeIn, [](const FixDeviceSizeResult& r) { return r.changed(); });
}

}  // namespace ubtrfs
