// `btrfs rescue zero-log` (ubtrfs/rescue.h): the superblocks rewritten with
// no tree log, nothing else changed.
#include <memory>
#include <vector>

#include "txn/devices.h"
#include "txn/offline_open.h"
#include "txn/volume.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs {

Result<ZeroLogResult> ZeroLog(const std::string& image, const OpenOptions& where) {
  UB_ASSIGN_OR_RETURN(auto devs, txn::OpenDevices(txn::DeviceSpec::Of(image, where.offset, where.partition,
                                                                      where.scan_dirs, /*writable=*/true)));
  std::vector<std::unique_ptr<txn::ImageLock>> locks;
  for (const auto& d : devs) {
    auto lock = std::make_unique<txn::ImageLock>();
    UB_RETURN_IF_ERROR(lock->Take(d->Name()));
    locks.push_back(std::move(lock));
  }
  txn::VolumeOptions vo;
  vo.writable = true;
  vo.degraded = true;  // refused below, with the devices named
  vo.node_cache_bytes = 1ull << 20;
  auto vol = txn::Volume::Open(std::move(devs), vo);
  if (!vol.ok()) return vol.status().WithContext(image);
  ZeroLogResult r;
  r.warnings = (*vol)->warnings();
  if (!(*vol)->missing_devices().empty()) {
    std::string ids;
    for (uint64_t id : (*vol)->missing_devices()) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    return Status::Invalid(image + ": devid " + ids +
                           " missing: every device's superblock names the log, so all are needed to drop it");
  }
  r.log_root = (*vol)->super().log_root.get();
  r.log_level = (*vol)->super().log_root_level;
  if (r.log_root == 0) return r;
  UB_RETURN_IF_ERROR((*vol)->WriteLogSuperblock(0, 0).WithContext(image));
  UB_RETURN_IF_ERROR((*vol)->devices().Flush().WithContext(image));
  return r;
}

}  // namespace ubtrfs
