// ubtrfs/resize.h over txn::DeviceLayout (relocate.cc).
#include "ubtrfs/resize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/file.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "alloc/chunk_map.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "io/mounted.h"
#include "io/offset_device.h"
#include "io/rbd_device.h"
#include "txn/clock.h"
#include "txn/devices.h"
#include "txn/mkfs.h"
#include "txn/relocate.h"
#include "txn/transaction.h"
#include "txn/volume.h"

namespace ubtrfs {

namespace {

std::string Mib(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

std::string KindText(uint64_t type) {
  if (type & format::kBlockGroupData) return "data";
  if (type & format::kBlockGroupSystem) return "system";
  return "metadata";
}

// One writable open of the image: device, volume, transaction manager.
struct Opened {
  std::unique_ptr<txn::Volume> vol;
  std::unique_ptr<txn::TxnManager> txn;
};

Result<Opened> OpenForResize(const std::string& path) {
  UB_ASSIGN_OR_RETURN(auto dev, io::OpenImage(path, io::OpenFlags{true}, io::Placement{}));
  txn::VolumeOptions vo;
  vo.writable = true;
  vo.node_cache_bytes = 16ull << 20;
  Opened o;
  UB_ASSIGN_OR_RETURN(o.vol, txn::Volume::Open(std::move(dev), vo));
  UB_ASSIGN_OR_RETURN(o.txn, txn::TxnManager::Open(o.vol.get()));
  if (o.txn->HasChanges()) UB_RETURN_IF_ERROR(o.txn->Commit());  // what the open itself changed
  return o;
}

// Held while the image is resized: ubtrfs mount holds the same lock, and a
// kernel mount goes through a loop device backed by the file.
class ImageLock {
 public:
  ~ImageLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Take(const std::string& path) {
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

 private:
  int fd_ = -1;
};

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

// One resize of the image at `path`, from Begin (the lock, what the path
// is, the writable open) to Finish (the open closed, an image file cut to
// the new size, the result reported).
struct Resizing {
  ImageLock lock;
  bool regular = false;
  uint64_t file_size = 0;
  Opened o;

  Status Begin(const std::string& path) {
    UB_RETURN_IF_ERROR(lock.Take(path));
    UB_ASSIGN_OR_RETURN(regular, IsRegular(path, &file_size));
    UB_ASSIGN_OR_RETURN(o, OpenForResize(path));
    return Status::Ok();
  }
  Status Finish(const std::string& path, uint64_t want, ResizeResult r, ResizeResult* result) {
    o.txn.reset();
    o.vol.reset();
    if (regular && want < file_size) UB_RETURN_IF_ERROR(SetFileSize(path, want));
    r.new_bytes = want;
    *result = r;
    return Status::Ok();
  }
};

// The size `target` asks for, from the current `old_bytes` and the image
// file's or device's `file_size`; not for kMin, which the caller measures.
Result<uint64_t> WantedSize(const ResizeTarget& target, uint64_t old_bytes, uint64_t file_size, const char* what) {
  switch (target.kind) {
    case ResizeTarget::kBytes: return target.bytes;
    case ResizeTarget::kGrowBy:
      if (target.bytes > UINT64_MAX - old_bytes) return Status::Invalid("the new size would overflow");
      return old_bytes + target.bytes;
    case ResizeTarget::kShrinkBy:
      if (target.bytes >= old_bytes) {
        return Status::Invalid("cannot shrink a " + std::to_string(old_bytes) + "-byte " + what + " by " +
                               std::to_string(target.bytes) + " bytes");
      }
      return old_bytes - target.bytes;
    case ResizeTarget::kMax: return file_size;
    case ResizeTarget::kMin: break;
  }
  return Status::Invalid("no size for `min` here");
}

// Moves the copy that ends last down as far as it goes, as long as one
// does: the smallest end the current chunks can have. Commits each move.
Status CompactDown(txn::TxnManager* txn, ResizeResult* r, uint64_t only_devid = 0) {
  txn::DeviceLayout layout(txn);
  for (int guard = 0; guard < 100000; ++guard) {
    auto stripes = layout.Stripes();
    if (only_devid != 0) std::erase_if(stripes, [&](const auto& s) { return s.devid != only_devid; });
    if (stripes.empty()) return Status::Ok();
    auto last = *std::max_element(stripes.begin(), stripes.end(), [](const auto& a, const auto& b) {
      return a.physical + a.length < b.physical + b.length;
    });
    const uint64_t to = layout.FindPlace(last, last.physical);
    if (to == 0) return Status::Ok();
    UB_RETURN_IF_ERROR(layout.MoveStripe(last.logical, last.index, to, &r->bytes_copied));
    UB_RETURN_IF_ERROR(txn->Commit());
    ++r->stripes_moved;
  }
  return Status::Ok();
}

}  // namespace

Status ParseResizeTarget(std::string_view text, ResizeTarget* out) {
  *out = ResizeTarget{};
  if (text == "max") {
    out->kind = ResizeTarget::kMax;
    return Status::Ok();
  }
  if (text == "min") {
    out->kind = ResizeTarget::kMin;
    return Status::Ok();
  }
  std::string_view s = text;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    out->kind = s[0] == '+' ? ResizeTarget::kGrowBy : ResizeTarget::kShrinkBy;
    s.remove_prefix(1);
  }
  if (s.empty() || s[0] < '0' || s[0] > '9') {
    return Status::Invalid("'" + std::string(text) + "' is not a size, +N, -N, max or min");
  }
  Status st = ParseByteSize(s, &out->bytes);
  if (st.ok() || s.size() == text.size()) return st;
  // The message quotes what was given, sign and all.
  std::string m = st.message();
  const std::string part = "'" + std::string(s) + "'";
  if (const size_t at = m.find(part); at != std::string::npos) m.replace(at, part.size(), "'" + std::string(text) + "'");
  return Status::Error(st.code(), m);
}

Status ParseByteSize(std::string_view text, uint64_t* bytes) {
  size_t i = 0;
  uint64_t v = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return Status::Error(ERANGE, "size '" + std::string(text) + "' is too large");
    v = v * 10 + d;
  }
  if (i == 0) return Status::Invalid("'" + std::string(text) + "' is not a size");
  std::string_view unit = text.substr(i);
  int shift = 0;
  if (!unit.empty()) {
    switch (unit[0]) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      case 'p': case 'P': shift = 50; break;
      case 'e': case 'E': shift = 60; break;
      default: return Status::Invalid("'" + std::string(text) + "': unknown unit (K, M, G, T, P, E)");
    }
    unit.remove_prefix(1);
    if (unit != "" && unit != "B" && unit != "b" && unit != "iB" && unit != "ib") {
      return Status::Invalid("'" + std::string(text) + "': unknown unit");
    }
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return Status::Error(ERANGE, "size '" + std::string(text) + "' is too large");
  *bytes = v << shift;
  return Status::Ok();
}

Status ResizeImage(const std::string& path, const ResizeTarget& target, ResizeResult* result) {
  ResizeResult r;
  Resizing resizing;
  UB_RETURN_IF_ERROR(resizing.Begin(path));
  Opened& o = resizing.o;
  const bool regular = resizing.regular;
  const uint64_t file_size = resizing.file_size;
  const uint32_t ss = o.vol->sectorsize();
  if (o.vol->super().num_devices.get() != 1) {
    return Status::Invalid("the filesystem has " + std::to_string(o.vol->super().num_devices.get()) +
                           " devices: name them all (IMG1,IMG2,...) and the one to resize as DEVID:SIZE");
  }
  r.old_bytes = o.vol->super().total_bytes.get();
  txn::DeviceLayout layout(o.txn.get());

  uint64_t want = 0;
  if (target.kind == ResizeTarget::kMin) {
    UB_RETURN_IF_ERROR(CompactDown(o.txn.get(), &r));
    want = layout.DeviceExtentEnd();
  } else {
    UB_ASSIGN_OR_RETURN(want, WantedSize(target, r.old_bytes, file_size, "filesystem"));
  }
  want = want / ss * ss;
  if (!regular && want > file_size) {
    return Status::Invalid("the device " + path + " has " + std::to_string(file_size) + " bytes; cannot grow to " +
                           std::to_string(want));
  }

  if (want > r.old_bytes || (want > o.vol->devices().Get(o.vol->super().dev_item.devid.get())->Size())) {
    // Growing: the file first, so that the device (and the superblock
    // copies that now fit) is there when the commit writes.
    if (regular && file_size < want) {
      o.txn.reset();
      o.vol.reset();
      UB_RETURN_IF_ERROR(SetFileSize(path, want));
      UB_ASSIGN_OR_RETURN(o, OpenForResize(path));
    }
    txn::DeviceLayout grow(o.txn.get());
    UB_RETURN_IF_ERROR(grow.SetDeviceSize(want));
    UB_RETURN_IF_ERROR(o.txn->Commit());
    r.new_bytes = want;
    *result = r;
    return Status::Ok();
  }

  // Shrinking: every copy that reaches past the new end moves below it,
  // largest first (they are the hardest to place).
  for (;;) {
    auto stripes = layout.Stripes();
    std::vector<txn::DeviceLayout::Stripe> past;
    for (const auto& s : stripes) {
      if (s.physical + s.length > want) past.push_back(s);
    }
    if (past.empty()) break;
    std::sort(past.begin(), past.end(), [](const auto& a, const auto& b) { return a.length > b.length; });
    const auto& s = past.front();
    const uint64_t to = layout.FindPlace(s, want);
    if (to == 0) {
      uint64_t largest = 0;
      for (auto [hs, hl] : o.txn->chunk_alloc().FreeDeviceRanges()) {
        if (hs < want) largest = std::max(largest, std::min(hs + hl, want) - hs);
      }
      return Status::Invalid("cannot shrink to " + std::to_string(want) + " bytes (" + Mib(want) + "): the " +
                             KindText(s.type) + " chunk at logical " + std::to_string(s.logical) + " (copy " +
                             std::to_string(s.index) + ", " + Mib(s.length) + " at device offset " +
                             std::to_string(s.physical) + ") does not fit in the free device space below it " +
                             "(largest free range " + Mib(largest) + "); `resize IMAGE min` gives the smallest size");
    }
    UB_RETURN_IF_ERROR(layout.MoveStripe(s.logical, s.index, to, &r.bytes_copied));
    UB_RETURN_IF_ERROR(o.txn->Commit());
    ++r.stripes_moved;
  }
  if (want < r.old_bytes || target.kind == ResizeTarget::kMin) {
    UB_RETURN_IF_ERROR(layout.SetDeviceSize(want));
    UB_RETURN_IF_ERROR(o.txn->Commit());
  }
  return resizing.Finish(path, want, r, result);
}

Status ShrinkImageToFit(const std::string& path, ResizeResult* result) {
  ResizeResult r;
  Resizing resizing;
  UB_RETURN_IF_ERROR(resizing.Begin(path));
  Opened& o = resizing.o;
  r.old_bytes = o.vol->super().total_bytes.get();
  txn::DeviceLayout layout(o.txn.get());
  UB_RETURN_IF_ERROR(layout.TrimChunks(&r.bytes_trimmed));
  UB_RETURN_IF_ERROR(o.txn->Commit());
  UB_RETURN_IF_ERROR(CompactDown(o.txn.get(), &r));
  const uint64_t want = layout.DeviceExtentEnd();
  UB_RETURN_IF_ERROR(layout.SetDeviceSize(want));
  UB_RETURN_IF_ERROR(o.txn->Commit());
  return resizing.Finish(path, want, r, result);
}

// ---- Devices ----

namespace {

constexpr uint64_t kMinNewDevice = 16ull << 20;

std::string RealPath(const std::string& p) {
  char* real = ::realpath(p.c_str(), nullptr);
  if (!real) return p;
  std::string out = real;
  std::free(real);
  return out;
}

// Every device of the filesystem, writable and locked, with a volume and a
// transaction manager over them.
struct OpenedSet {
  std::vector<std::unique_ptr<ImageLock>> locks;
  std::vector<std::string> paths;  // of the opened devices, by devid
  std::map<uint64_t, std::string> names;
  Opened o;
};

// Whether a filesystem with devices missing may be changed: with
// options.degraded, or when the change takes out the one device that is
// missing (`removing`: what RemoveDevice or ReplaceDevice was named).
Status CheckDegraded(const txn::Volume& vol, const DeviceChangeOptions& options, const std::string& removing) {
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

Result<OpenedSet> OpenSet(const std::vector<std::string>& devices, const DeviceChangeOptions& options,
                          const std::string& removing = "") {
  OpenedSet set;
  txn::DeviceSpec spec;
  for (const std::string& d : devices) {
    for (const std::string& p : txn::SplitDeviceList(d)) spec.paths.push_back(p);
  }
  if (spec.paths.empty()) return Status::Invalid("no device of the filesystem named");
  spec.scan_dirs = options.scan_dirs;
  spec.writable = true;
  UB_ASSIGN_OR_RETURN(auto devs, txn::OpenDevices(spec));
  for (const auto& d : devs) {
    auto lock = std::make_unique<ImageLock>();
    UB_RETURN_IF_ERROR(lock->Take(d->Name()));
    set.locks.push_back(std::move(lock));
  }
  txn::VolumeOptions vo;
  vo.writable = true;
  vo.degraded = true;  // CheckDegraded decides, before anything is written
  vo.node_cache_bytes = 16ull << 20;
  UB_ASSIGN_OR_RETURN(set.o.vol, txn::Volume::Open(std::move(devs), vo));
  if (set.o.vol->sprouted()) {
    return Status::Unsupported("changing the devices of a filesystem sprouted from a seed device");
  }
  UB_RETURN_IF_ERROR(CheckDegraded(*set.o.vol, options, removing));
  for (uint64_t id : set.o.vol->devices().Devids()) set.names[id] = set.o.vol->devices().Get(id)->Name();
  UB_ASSIGN_OR_RETURN(set.o.txn, txn::TxnManager::Open(set.o.vol.get()));
  if (set.o.txn->HasChanges()) UB_RETURN_IF_ERROR(set.o.txn->Commit());
  return set;
}

// Closes the set: the transaction manager before the volume it uses, the
// locks last.
void Close(OpenedSet* set) {
  set->o.txn.reset();
  set->o.vol.reset();
  set->locks.clear();
}

void Summarize(const txn::Volume& vol, DeviceChangeResult* r) {
  r->num_devices = vol.super().num_devices.get();
  r->total_bytes = vol.super().total_bytes.get();
}

}  // namespace

namespace {

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
  struct stat st;
  if (::stat(new_device.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) {
      return Status::Error(ENOENT, new_device + " does not exist; create it first (an image file: truncate -s SIZE " +
                                       new_device + ")");
    }
    return Status::Error(e, new_device + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
    return Status::Invalid(new_device + ": not an image file or block device");
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
  if (dev.Size() < kMinNewDevice) {
    return Status::Invalid(new_device + " is too small: " + std::to_string(dev.Size()) + " bytes; a device needs at least " +
                           std::to_string(kMinNewDevice) + " (16 MiB)");
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
  std::string names;
  for (const auto& [id, name] : set.names) names += (names.empty() ? "" : ", ") + std::to_string(id) + " " + name;
  return Status::Invalid(which + " is not a device of this filesystem (its devices: " + names + ")");
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
  UB_RETURN_IF_ERROR(layout.ReplaceDevice(r.devid, std::move(nd.dev), uuid, &r.bytes_copied, &old));
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
  r.bytes_copied = stats.bytes_copied;
  r.devid = devid;
  Summarize(vol, &r);
  *result = r;
  return Status::Ok();
}

Status ResizeDevice(const std::vector<std::string>& devices, uint64_t devid, const ResizeTarget& target,
                    const DeviceChangeOptions& options, ResizeResult* result) {
  ResizeResult r;
  UB_ASSIGN_OR_RETURN(OpenedSet set, OpenSet(devices, options));
  auto name = set.names.find(devid);
  if (name == set.names.end()) {
    std::string names;
    for (const auto& [id, n] : set.names) names += (names.empty() ? "" : ", ") + std::to_string(id) + " " + n;
    return Status::Invalid("no device " + std::to_string(devid) + " in this filesystem (its devices: " + names + ")");
  }
  const std::string path = name->second;
  uint64_t file_size = 0;
  UB_ASSIGN_OR_RETURN(const bool regular, IsRegular(path, &file_size));
  const format::DevItem* item = set.o.vol->mutable_dev_item(devid);
  if (item == nullptr) return Status::Corrupt("no DEV_ITEM for device " + std::to_string(devid));
  r.old_bytes = item->total_bytes.get();
  const uint32_t ss = set.o.vol->sectorsize();
  uint64_t want = 0;
  if (target.kind == ResizeTarget::kMin) {
    UB_RETURN_IF_ERROR(CompactDown(set.o.txn.get(), &r, devid));
    want = txn::DeviceLayout(set.o.txn.get()).DeviceExtentEnd(devid);
  } else {
    UB_ASSIGN_OR_RETURN(want, WantedSize(target, r.old_bytes, file_size, "device"));
  }
  want = want / ss * ss;
  if (want < kMinNewDevice) {
    return Status::Invalid("a device needs at least " + std::to_string(kMinNewDevice) + " bytes (16 MiB)");
  }
  if (want > file_size) {
    if (!regular) {
      return Status::Invalid("the device " + path + " has " + std::to_string(file_size) + " bytes; cannot grow to " +
                             std::to_string(want));
    }
    // The file first, opened again, so that the device is there when the
    // commit writes.
    Close(&set);
    UB_RETURN_IF_ERROR(SetFileSize(path, want));
    UB_ASSIGN_OR_RETURN(set, OpenSet(devices, options));
  }
  txn::DeviceLayout layout(set.o.txn.get());
  // Shrinking: every stripe of the device past the new end moves, largest
  // first, below it on the same device, else to another device.
  for (int guard = 0; guard < 100000; ++guard) {
    std::vector<txn::DeviceLayout::Stripe> past;
    for (const auto& s : layout.Stripes()) {
      if (s.devid == devid && s.physical + s.length > want) past.push_back(s);
    }
    if (past.empty()) break;
    std::sort(past.begin(), past.end(), [](const auto& a, const auto& b) { return a.length > b.length; });
    const auto& s = past.front();
    if (const uint64_t to = layout.FindPlace(s, want); to != 0) {
      UB_RETURN_IF_ERROR(layout.MoveStripe(s.logical, s.index, to, &r.bytes_copied));
    } else {
      uint64_t other = 0, to_other = 0;
      if (Status st = layout.FindNewHome(s, devid, &other, &to_other); !st.ok()) {
        return Status::Invalid("cannot shrink device " + std::to_string(devid) + " to " + std::to_string(want) +
                               " bytes (" + Mib(want) + "): the " + KindText(s.type) + " chunk at logical " +
                               std::to_string(s.logical) + " fits neither below that on the device nor elsewhere (" +
                               st.message() + ")");
      }
      UB_RETURN_IF_ERROR(layout.MoveStripe(s.logical, s.index, other, to_other, &r.bytes_copied));
    }
    UB_RETURN_IF_ERROR(set.o.txn->Commit());
    ++r.stripes_moved;
  }
  UB_RETURN_IF_ERROR(layout.SetDeviceSize(devid, want));
  UB_RETURN_IF_ERROR(set.o.txn->Commit());
  Close(&set);
  if (regular && want < file_size) UB_RETURN_IF_ERROR(SetFileSize(path, want));
  r.new_bytes = want;
  *result = r;
  return Status::Ok();
}

}  // namespace ubtrfs

namespace ubtrfs {

namespace {

// Profiles that keep more than one copy or parity: metadata leaves them
// only with force (the kernel's rule in btrfs_balance).
bool Redundant(uint64_t profile) {
  const alloc::ProfileRule r = alloc::RuleFor(profile);
  return r.copies >= 2 || r.parity >= 1;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Status ConvertProfiles(const std::vector<std::string>& devices, const ConvertOptions& options, ConvertResult* result) {
  using namespace ubtrfs::format;
  struct Target {
    uint64_t kind;
    const char* name;
    std::string text;
    uint64_t profile = 0;
  };
  std::vector<Target> targets;
  const std::string system = options.system.empty() ? options.metadata : options.system;
  for (Target t : {Target{kBlockGroupData, "data", options.data}, Target{kBlockGroupMetadata, "metadata", options.metadata},
                   Target{kBlockGroupSystem, "system", system}}) {
    if (t.text.empty()) continue;
    const std::optional<uint64_t> p = txn::ParseProfile(t.text);
    if (!p) {
      return Status::Invalid("unknown " + std::string(t.name) + " profile '" + t.text +
                             "' (single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5, raid6)");
    }
    t.profile = *p;
    targets.push_back(t);
  }
  if (targets.empty()) return Status::Invalid("nothing to convert: name a data, metadata or system profile");
  DeviceChangeOptions dco;
  dco.scan_dirs = options.scan_dirs;
  dco.degraded = options.degraded;
  UB_ASSIGN_OR_RETURN(OpenedSet set, OpenSet(devices, dco));
  txn::Volume& vol = *set.o.vol;
  const size_t ndevs = vol.devices().Devids().size();
  std::map<uint64_t, uint64_t> now;  // kind -> profiles in use (bits)
  for (const auto& [logical, c] : vol.chunks().chunks()) {
    for (const Target& t : targets) {
      if (c.type & t.kind) now[t.kind] |= c.profile() == 0 ? txn::DeviceLayout::kSingle : c.profile();
    }
  }
  for (const Target& t : targets) {
    const alloc::ProfileRule rule = alloc::RuleFor(t.profile);
    if (ndevs < rule.devs_min) {
      return Status::Invalid("unable to convert " + std::string(t.name) + " to " + Lower(t.text) + ": it needs " +
                             std::to_string(rule.devs_min) + " devices, the filesystem has " + std::to_string(ndevs) +
                             (vol.missing_devices().empty() ? "" : " present"));
    }
    if (t.kind != kBlockGroupData && !options.force && !Redundant(t.profile)) {
      bool had = false;
      for (uint64_t p = 1; p <= kBlockGroupRaid1c4; p <<= 1) had = had || ((now[t.kind] & p) && Redundant(p));
      if (had) {
        return Status::Invalid("converting " + std::string(t.name) + " to " + Lower(t.text) +
                               " reduces its redundancy; use --force if you want this");
      }
    }
  }
  for (const auto& [logical, c] : vol.chunks().chunks()) {
    if ((c.type & kBlockGroupData) && (c.type & kBlockGroupMetadata) && options.data != options.metadata) {
      return Status::Invalid("mixed data and metadata block groups: give the same profile for both");
    }
  }
  txn::DeviceLayout layout(set.o.txn.get());
  for (const Target& t : targets) layout.AllocateAs(t.kind, t.profile);
  ConvertResult r;
  auto target_of = [&](const alloc::ChunkInfo& c) -> const Target* {
    for (const Target& t : targets) {
      if ((c.type & t.kind) && c.profile() != t.profile) return &t;
    }
    return nullptr;
  };
  for (;;) {
    uint64_t logical = 0, profile = 0;
    bool found = false;
    for (const auto& [l, c] : vol.chunks().chunks()) {
      if (const Target* t = target_of(c)) {
        logical = l;
        profile = t->profile == 0 ? txn::DeviceLayout::kSingle : t->profile;
        found = true;
        break;
      }
    }
    if (!found) break;
    Status st = layout.ConvertChunk(logical, profile, &r.bytes_copied);
    if (!st.ok()) {
      *result = r;
      return st.WithContext(std::to_string(r.chunks_converted) + " chunks converted before");
    }
    UB_RETURN_IF_ERROR(set.o.txn->Commit());
    ++r.chunks_converted;
  }
  *result = r;
  return Status::Ok();
}

}  // namespace ubtrfs
