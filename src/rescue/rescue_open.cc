#include "rescue/rescue_open.h"

#include "txn/devices.h"

namespace ubtrfs::rescue {

Result<Opened> Open(const std::string& image, const OpenOptions& where, const OpenHow& how) {
  UB_ASSIGN_OR_RETURN(auto devs, txn::OpenDevices(txn::DeviceSpec::Of(image, where.offset, where.partition,
                                                                      where.scan_dirs, how.writable)));
  Opened o;
  if (how.writable) {
    UB_ASSIGN_OR_RETURN(o.locks, txn::LockDevices(devs));
  }
  txn::VolumeOptions vo;
  vo.writable = how.writable;
  vo.degraded = true;  // missing devices are judged below, with their ids named
  vo.node_cache_bytes = how.with_txn ? 16ull << 20 : 1ull << 20;
  vo.rescue.super_mirror = how.super_mirror;
  auto vol = txn::Volume::Open(std::move(devs), vo);
  if (!vol.ok()) return vol.status().WithContext(image);
  o.vol = std::move(*vol);
  if (!o.vol->missing_devices().empty() && !how.why_all_devices.empty()) {
    std::string ids;
    for (uint64_t id : o.vol->missing_devices()) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    return Status::Invalid(image + ": devid " + ids + " missing: " + how.why_all_devices);
  }
  if (how.with_txn) {
    auto t = txn::TxnManager::Open(o.vol.get());
    if (!t.ok()) return t.status().WithContext(image);
    o.txn = std::move(*t);
    // What the open itself changes (a space cache to drop, a dead tree to
    // finish) goes into a commit of its own, before the repair's.
    if (o.txn->HasChanges()) UB_RETURN_IF_ERROR(o.txn->Commit().WithContext(image));
  }
  return o;
}

}  // namespace ubtrfs::rescue
