#include "txn/offline_open.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "io/mounted.h"
#include "io/rbd_device.h"
#include "txn/devices.h"

namespace ubtrfs::txn {

ImageLock::~ImageLock() {
  if (fd_ >= 0) ::close(fd_);
}

Status ImageLock::Take(const std::string& path) {
  if (io::IsRbdPath(path)) {
    // (an RBD image has no host file to lock or cut; `rbd resize` sizes it)
    return Status::Unsupported(path + ": resizing a filesystem in an RBD image");
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return Status::Error(errno, path + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    return Status::Error(EBUSY, path + " is in use (mounted by ubtrfs?); unmount it first");
  }
  if (io::MountedByKernel(path)) return Status::Error(EBUSY, path + " is mounted; unmount it first");
  return Status::Ok();
}

Result<Opened> OpenImageWritable(const std::string& path) {
  UB_ASSIGN_OR_RETURN(auto dev, io::OpenImage(path, io::OpenFlags{true}, io::Placement{}));
  VolumeOptions vo;
  vo.writable = true;
  vo.node_cache_bytes = 16ull << 20;
  Opened o;
  UB_ASSIGN_OR_RETURN(o.vol, Volume::Open(std::move(dev), vo));
  UB_ASSIGN_OR_RETURN(o.txn, TxnManager::Open(o.vol.get()));
  if (o.txn->HasChanges()) UB_RETURN_IF_ERROR(o.txn->Commit());  // what the open itself changed
  return o;
}

Result<bool> IsRegular(const std::string& path, uint64_t* size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::Error(errno, path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) return Status::Invalid(path + ": not an image file or block device");
  *size = static_cast<uint64_t>(st.st_size);
  return S_ISREG(st.st_mode);
}

Status SetFileSize(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(errno, path + ": " + std::strerror(errno));
  const int r = ::ftruncate(fd, static_cast<off_t>(bytes));
  const int e = errno;
  ::close(fd);
  if (r != 0) return Status::Error(e, path + ": cannot set the size to " + std::to_string(bytes) + ": " + std::strerror(e));
  return Status::Ok();
}

std::string RealPath(const std::string& p) {
  char* real = ::realpath(p.c_str(), nullptr);
  if (!real) return p;
  std::string out = real;
  std::free(real);
  return out;
}

Status CheckDegraded(const Volume& vol, const DeviceChangeOptions& options, const std::string& removing) {
  const std::vector<uint64_t>& missing = vol.missing_devices();
  if (missing.empty() || options.degraded) return Status::Ok();
  if (missing.size() == 1 && (removing == "missing" || removing == std::to_string(missing.front()))) {
    return Status::Ok();
  }
  std::string list;
  for (uint64_t d : missing) list += (list.empty() ? "" : ", ") + std::to_string(d);
  return Status::Error(ENODEV, "device" + std::string(missing.size() > 1 ? "s " : " ") + list +
                                   (missing.size() > 1 ? " are" : " is") +
                                   " missing: a degraded filesystem is changed only when asked (--degraded)");
}

Result<std::vector<std::unique_ptr<ImageLock>>> LockDevices(
    const std::vector<std::unique_ptr<io::BlockDevice>>& devs) {
  std::vector<std::unique_ptr<ImageLock>> locks;
  for (const auto& d : devs) {
    auto lock = std::make_unique<ImageLock>();
    UB_RETURN_IF_ERROR(lock->Take(d->Name()));
    locks.push_back(std::move(lock));
  }
  return locks;
}

Result<OpenedSet> OpenSet(const std::vector<std::string>& devices, const DeviceChangeOptions& options,
                          const std::string& removing) {
  OpenedSet set;
  DeviceSpec spec;
  for (const std::string& d : devices) {
    for (const std::string& p : SplitDeviceList(d)) spec.paths.push_back(p);
  }
  if (spec.paths.empty()) return Status::Invalid("no device of the filesystem named");
  spec.scan_dirs = options.scan_dirs;
  spec.writable = true;
  UB_ASSIGN_OR_RETURN(auto devs, OpenDevices(spec));
  UB_ASSIGN_OR_RETURN(set.locks, LockDevices(devs));
  VolumeOptions vo;
  vo.writable = true;
  vo.degraded = true;  // CheckDegraded decides, before anything is written
  vo.node_cache_bytes = 16ull << 20;
  UB_ASSIGN_OR_RETURN(set.o.vol, Volume::Open(std::move(devs), vo));
  if (set.o.vol->sprouted()) {
    return Status::Unsupported("changing the devices of a filesystem sprouted from a seed device");
  }
  UB_RETURN_IF_ERROR(CheckDegraded(*set.o.vol, options, removing));
  for (uint64_t id : set.o.vol->devices().Devids()) set.names[id] = set.o.vol->devices().Get(id)->Name();
  UB_ASSIGN_OR_RETURN(set.o.txn, TxnManager::Open(set.o.vol.get()));
  if (set.o.txn->HasChanges()) UB_RETURN_IF_ERROR(set.o.txn->Commit());
  return set;
}

std::string OpenedSet::Listing() const {
  std::string out;
  for (const auto& [id, name] : names) out += (out.empty() ? "" : ", ") + std::to_string(id) + " " + name;
  return out;
}

void Close(OpenedSet* set) {
  set->o.txn.reset();
  set->o.vol.reset();
  set->locks.clear();
}

}  // namespace ubtrfs::txn
