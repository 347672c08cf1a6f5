// Opening a Filesystem: the device, the Volume, the view.
#include <algorithm>

#include "fs/fs_impl.h"
#include "fs/open_device.h"
#include "io/block_device.h"
#include "io/offset_device.h"
#include "io/overlay_device.h"
#include "io/rbd_device.h"
#include "io/undo_device.h"
#include "log/replay.h"
#include "txn/devices.h"

namespace ubtrfs {

using fsimpl::FilesystemImpl;

Result<std::unique_ptr<Filesystem>> Filesystem::Open(const std::string& path, const OpenOptions& options) {
  txn::DeviceSpec spec =
      txn::DeviceSpec::Of(path, options.offset, options.partition, options.scan_dirs, options.writable);
  for (const auto& d : options.devices) spec.paths.push_back(d);
  if (spec.paths.size() > 1 || !spec.scan_dirs.empty()) {
    UB_ASSIGN_OR_RETURN(auto devs, txn::OpenDevices(spec));
    return OpenOnDevices(std::move(devs), options);
  }
  io::Placement where = spec.where;
  UB_ASSIGN_OR_RETURN(auto dev, io::OpenImage(path, io::OpenFlags{options.writable}, where));
  if (options.offset == 0 && options.partition == 0) {
    // A whole-disk image with the filesystem in a partition: say which.
    auto opened = OpenOnDevice(std::move(dev), options);
    if (opened.ok() || opened.status().code() != EUCLEAN) return opened;
    auto raw = io::OpenDevice(path);
    if (!raw.ok()) return opened;
    auto parts = io::ListPartitions(**raw, io::IsRbdPath(path) ? "" : path);
    if (!parts.ok() || parts->empty()) return opened;
    std::string list;
    for (const auto& p : *parts) list += (list.empty() ? "" : ", ") + std::to_string(p.number);
    return Status::Error(EUCLEAN, opened.status().message() + "; " + path +
                                      " holds a partition table (partitions " + list +
                                      "): name the filesystem's partition (--partition N)");
  }
  return OpenOnDevice(std::move(dev), options);
}

namespace {

// An image with a tree log (superblock log_root != 0): replays it as the
// kernel's mount does and returns the Volume to use. Writable: onto the
// image, committed. Read-only: into an in-memory overlay of the device that
// is never written back, and the view reads through it.
Result<std::unique_ptr<txn::Volume>> ReplayTreeLog(std::unique_ptr<txn::Volume> vol, const txn::VolumeOptions& vo,
                                                   const std::vector<io::UndoDevice*>& undo) {
  if (vo.writable) {
    if (Status st = log::ReplayLog(vol.get()); !st.ok()) {
      st = st.WithContext("replaying the tree log");
      return Status::Error(st.code(), st.message() + "; `ubtrfs rescue zero-log` drops the log (what was fsynced "
                                                     "after the last commit is lost), the rescue option nologreplay "
                                                     "reads the last commit read-only");
    }
    for (auto* u : undo) u->Forget();  // committed: a later Discard must not undo it
    return txn::Volume::Open(txn::Volume::TakeDevices(std::move(vol)), vo);
  }
  std::vector<std::unique_ptr<io::BlockDevice>> overlays, views;
  for (auto& d : txn::Volume::TakeDevices(std::move(vol))) {
    auto overlay = std::make_unique<io::OverlayDevice>(std::move(d));
    views.push_back(overlay->Share());
    overlays.push_back(std::move(overlay));
  }
  txn::VolumeOptions wo = vo;
  wo.writable = true;
  wo.degraded = true;  // only memory is written
  Status st = Status::Ok();
  {
    auto rw = txn::Volume::Open(std::move(overlays), wo);
    st = rw.ok() ? log::ReplayLog(rw->get()) : rw.status();
  }
  if (!st.ok() && st.code() != EOPNOTSUPP) {
    st = st.WithContext("replaying the tree log (in memory; the image is not changed)");
    return Status::Error(st.code(), st.message() + "; the rescue option nologreplay reads the last commit");
  }
  // Unsupported for writing (so not replayable): the last commit's state,
  // as before; an uncommitted replay left the superblock as it was.
  UB_ASSIGN_OR_RETURN(auto ro, txn::Volume::Open(std::move(views), vo));
  if (!st.ok()) {
    ro->AddWarning("the tree log cannot be replayed (" + st.message() +
                   "): files fsynced after the last commit are not shown");
  } else {
    ro->AddWarning("the tree log (data fsynced after the last commit) was replayed in memory; the image is not "
                   "changed until a writable open replays it");
  }
  return ro;
}

}  // namespace

Result<std::unique_ptr<Filesystem>> OpenOnDevice(std::unique_ptr<io::BlockDevice> dev, const OpenOptions& options) {
  std::vector<std::unique_ptr<io::BlockDevice>> devs;
  devs.push_back(std::move(dev));
  return OpenOnDevices(std::move(devs), options);
}

Result<std::unique_ptr<Filesystem>> OpenOnDevices(std::vector<std::unique_ptr<io::BlockDevice>> devs,
                                                  const OpenOptions& options) {
  const RescueOptions& rescue = options.rescue;
  if (rescue.any() && options.writable) {
    return Status::Invalid("the rescue options are for reading a damaged image: open it read-only");
  }
  txn::VolumeOptions vo;
  vo.writable = options.writable;
  vo.degraded = options.degraded;
  vo.node_cache_bytes = options.node_cache_bytes;
  vo.verify_data_csums = options.verify_data_csums && !rescue.ignore_data_csums;
  vo.rescue = rescue;
  std::vector<io::UndoDevice*> undo;
  if (options.writable && options.undo_uncommitted) {
    for (auto& dev : devs) {
      auto u = std::make_unique<io::UndoDevice>(std::move(dev));
      undo.push_back(u.get());
      dev = std::move(u);
    }
  }
  UB_ASSIGN_OR_RETURN(auto vol, txn::Volume::Open(std::move(devs), vo));
  if (vol->super().log_root.get() != 0) {
    if (rescue.no_log_replay) {
      vol->AddWarning("the tree log was not replayed (rescue=nologreplay): files fsynced after the last commit "
                      "are not shown");
    } else {
      UB_ASSIGN_OR_RETURN(vol, ReplayTreeLog(std::move(vol), vo, undo));
    }
  }
  auto impl = std::make_unique<FilesystemImpl>(std::move(vol));
  impl->set_undo_devices(std::move(undo));
  impl->set_legacy_dir_index_batching(options.legacy_dir_index_batching);
  impl->set_dir_item_options(options.dir_item_index_after, options.dir_item_batch);
  impl->set_max_dirty_bytes(std::max<uint64_t>(options.max_dirty_bytes, 1ull << 20));
  impl->set_compression(options.compress);
  impl->set_salvage(rescue.salvage);
  UB_RETURN_IF_ERROR(impl->Init(options.subvol, options.subvolid, rescue.ignore_bad_roots));
  if (options.drop_blocks_per_commit) impl->set_drop_step_blocks(options.drop_blocks_per_commit);
  if (options.writable) {
    UB_RETURN_IF_ERROR(impl->InitWrite());
    UB_RETURN_IF_ERROR(impl->FinishDeadTrees());
    UB_RETURN_IF_ERROR(impl->CleanOrphans());
  }
  return std::unique_ptr<Filesystem>(std::move(impl));
}

}  // namespace ubtrfs
