// The public device changes of ubtrfs/resize.h (device add, replace,
// remove) over txn::DeviceLayout: relocate.cc moves and rebuilds the
// stripes, device_replace.cc swaps a device in.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "format/superblock.h"
#include "io/offset_device.h"
#include "txn/clock.h"
#include "txn/devices.h"
#include "txn/offline_open.h"
#include "txn/relocate.h"
#include "ubtrfs/resize.h"

namespace ubtrfs {

namespace {

using txn::ImageLock;
using txn::OpenedSet;
using txn::OpenSet;
using txn::RealPath;

void Summarize(const txn::Volume& vol, DeviceChangeResult* r) {
  r->num_devices = vol.super().num_devices.get();
  r->total_bytes = vol.super().total_bytes.get();
}

// A device to join the filesystem over `devices` (add, replace): it
// exists, is large enough, is not a member, holds no other btrfs unless
// forced; locked and open for writing (Claim clears it once nothing can
// refuse it any more).
struct NewDevice {
  std::unique_ptr<ImageLock> lock;
  std::unique_ptr<io::BlockDevice> dev;
};
Result<NewDevice> OpenNewDevice(const std::vector<std::string>& devices, const std::string& new_device,
                                const DeviceChangeOptions& options) {
  uint64_t file_size = 0;
  if (auto kind = txn::IsRegular(new_device, &file_size); !kind.ok()) {
    if (kind.status().code() == ENOENT) {
      return Status::Error(ENOENT, new_device + " does not exist; create it first (an image file: truncate -s SIZE " +
                                       new_device + ")");
    }
    return kind.status();
  }
  for (const std::string& d : devices) {
    for (const std::string& p : txn::SplitDeviceList(d)) {
      if (RealPath(p) == RealPath(new_device)) {
        return Status::Invalid(new_device + " is named as a device of the filesystem already");
      }
    }
  }
  NewDevice nd;
  nd.lock = std::make_unique<ImageLock>();
  UB_RETURN_IF_ERROR(nd.lock->Take(new_device));
  UB_ASSIGN_OR_RETURN(nd.dev, io::OpenImage(new_device, io::OpenFlags{true}, io::Placement{}));
  io::BlockDevice& dev = *nd.dev;
  if (dev.Size() < txn::kMinDeviceBytes) {
    return Status::Invalid(new_device + " is too small: " + std::to_string(dev.Size()) + " bytes; a device needs at least " +
                           std::to_string(txn::kMinDeviceBytes) + " (16 MiB)");
  }
  // A member of this filesystem (left out of `devices`), or another one.
  if (auto sc = txn::ReadSuperblock(dev); sc.ok()) {
    const std::vector<std::string> first = txn::SplitDeviceList(devices.empty() ? std::string() : devices.front());
    if (!first.empty()) {
      if (auto fdev = io::OpenImage(first.front(), io::OpenFlags{}, io::Placement{}); fdev.ok()) {
        if (auto fsc = txn::ReadSuperblock(**fdev);
            fsc.ok() && std::memcmp(fsc->sb.fsid, sc->sb.fsid, format::kFsidSize) == 0) {
          return Status::Invalid(new_device + " carries this filesystem's superblock (device " +
                                 std::to_string(sc->sb.dev_item.devid.get()) +
                                 "): it is a device of the filesystem already");
        }
      }
    }
    if (!options.force) {
      return Status::Invalid(new_device + " already contains a btrfs filesystem (fsid " +
                             format::UuidToString(sc->sb.fsid) + "); use --force to overwrite it");
    }
  }
  return nd;
}

// `new_device` is not one of the opened devices under another name.
Status CheckNotMember(const OpenedSet& set, const std::string& new_device) {
  const std::string real = RealPath(new_device);
  for (const auto& [id, name] : set.names) {
    if (RealPath(name) == real) {
      return Status::Invalid(new_device + " is device " + std::to_string(id) + " of this filesystem already");
    }
  }
  return Status::Ok();
}

// The new device, once nothing can refuse it any more: its first MiB
// cleared (old signatures and the old primary superblock go; the commit
// writes the new superblock copies), and its new device uuid.
Result<std::array<uint8_t, format::kUuidSize>> Claim(io::BlockDevice& dev) {
  std::vector<uint8_t> zeros(1u << 20, 0);
  UB_RETURN_IF_ERROR(dev.WriteAt(0, std::span(zeros).subspan(0, std::min<uint64_t>(zeros.size(), dev.Size()))));
  std::array<uint8_t, format::kUuidSize> uuid{};
  UB_RETURN_IF_ERROR(txn::NewUuid(uuid.data()));
  return uuid;
}

// The set's devid for `which` (a devid, "missing", or a path as named or
// found); EINVAL listing the devices when none.
Result<uint64_t> WhichDevice(const OpenedSet& set, const std::string& which) {
  const std::vector<uint64_t>& missing = set.o.vol->missing_devices();
  if (which == "missing") {
    if (missing.empty()) return Status::Invalid("no device of the filesystem is missing");
    return *std::min_element(missing.begin(), missing.end());
  }
  if (!which.empty() && which.find_first_not_of("0123456789") == std::string::npos && which.size() < 20) {
    return std::stoull(which);
  }
  const std::string real = RealPath(which);
  for (const auto& [id, name] : set.names) {
    if (name == which || RealPath(name) == real) return id;
  }
  return Status::Invalid(which + " is not a device of this filesystem (its devices: " + set.Listing() + ")");
}

}  // namespace

Status AddDevice(const std::vector<std::string>& devices, const std::string& new_device,
                 const DeviceChangeOptions& options, DeviceChangeResult* result) {
  DeviceChangeResult r;
  UB_ASSIGN_OR_RETURN(NewDevice nd, OpenNewDevice(devices, new_device, options));
  UB_ASSIGN_OR_RETURN(OpenedSet set, OpenSet(devices, options));
  UB_RETURN_IF_ERROR(CheckNotMember(set, new_device));
  UB_ASSIGN_OR_RETURN(const auto uuid, Claim(*nd.dev));
  txn::DeviceLayout layout(set.o.txn.get());
  UB_RETURN_IF_ERROR(layout.AddDevice(std::move(nd.dev), uuid, &r.devid));
  UB_RETURN_IF_ERROR(set.o.txn->Commit());
  Summarize(*set.o.vol, &r);
  *result = r;
  return Status::Ok();
}

Status ReplaceDevice(const std::vector<std::string>& devices, const std::string& which, const std::string& new_device,
                     const DeviceChangeOptions& options, DeviceChangeResult* result) {
  DeviceChangeResult r;
  UB_ASSIGN_OR_RETURN(NewDevice nd, OpenNewDevice(devices, new_device, options));
  UB_ASSIGN_OR_RETURN(OpenedSet set, OpenSet(devices, options, which));
  UB_RETURN_IF_ERROR(CheckNotMember(set, new_device));
  UB_ASSIGN_OR_RETURN(r.devid, WhichDevice(set, which));
  UB_ASSIGN_OR_RETURN(const auto uuid, Claim(*nd.dev));
  txn::DeviceLayout layout(set.o.txn.get());
  std::unique_ptr<io::BlockDevice> old;
  txn::CopyStats copied;
  UB_RETURN_IF_ERROR(layout.ReplaceDevice(r.devid, std::move(nd.dev), uuid, &copied, &old));
  txn::Report(copied, &r);
  UB_RETURN_IF_ERROR(set.o.txn->Commit());
  if (old) UB_RETURN_IF_ERROR(txn::ScratchSuperblocks(*old));
  Summarize(*set.o.vol, &r);
  *result = r;
  return Status::Ok();
}

Status RemoveDevice(const std::vector<std::string>& devices, const std::string& which,
                    const DeviceChangeOptions& options, DeviceChangeResult* result) {
  DeviceChangeResult r;
  UB_ASSIGN_OR_RETURN(OpenedSet set, OpenSet(devices, options, which));
  txn::Volume& vol = *set.o.vol;
  UB_ASSIGN_OR_RETURN(const uint64_t devid, WhichDevice(set, which));
  txn::RemoveStats stats;
  UB_RETURN_IF_ERROR(txn::RemoveDeviceCommitted(set.o.txn.get(), devid, &stats));
  r.stripes_moved = stats.stripes_moved;
  r.chunks_restriped = stats.chunks_restriped;
  txn::Report(stats.copied, &r);
  r.devid = devid;
  Summarize(vol, &r);
  *result = r;
  return Status::Ok();
}

}  // namespace ubtrfs
