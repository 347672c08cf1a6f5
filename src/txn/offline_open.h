// The open of the offline tools (resize, device add/remove/replace,
// balance): the image or every device of the filesystem locked against a
// ubtrfs mount and the kernel, writable, with a volume and a transaction
// manager over them. Used by resize.cc, device_admin.cc and balance.cc.
#ifndef UBTRFS_TXN_OFFLINE_OPEN_H_
#define UBTRFS_TXN_OFFLINE_OPEN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "txn/transaction.h"
#include "txn/volume.h"
#include "ubtrfs/resize.h"
#include "ubtrfs/status.h"

namespace ubtrfs::txn {

// The smallest device a filesystem takes (added, or resized to).
inline constexpr uint64_t kMinDeviceBytes = 16ull << 20;

// Held while an offline tool changes the image: ubtrfs mount holds the same
// lock, and a kernel mount goes through a loop device backed by the file.
class ImageLock {
 public:
  ImageLock() = default;
  ImageLock(const ImageLock&) = delete;
  ImageLock& operator=(const ImageLock&) = delete;
  ~ImageLock();
  // EBUSY when a ubtrfs mount holds it or the kernel has it mounted.
  Status Take(const std::string& path);

 private:
  int fd_ = -1;
};

// An ImageLock on every device, in order; the first that is taken already
// is the error.
Result<std::vector<std::unique_ptr<ImageLock>>> LockDevices(
    const std::vector<std::unique_ptr<io::BlockDevice>>& devs);

// One writable open of a one-device image; commits what the open itself
// changed. The transaction manager is closed before the volume.
struct Opened {
  std::unique_ptr<Volume> vol;
  std::unique_ptr<TxnManager> txn;
};
Result<Opened> OpenImageWritable(const std::string& path);

// True for an image file, false for a block device, EINVAL for anything
// else; `*size` is the file's size.
Result<bool> IsRegular(const std::string& path, uint64_t* size);
Status SetFileSize(const std::string& path, uint64_t bytes);
// `p` with links resolved, or as given when it does not resolve.
std::string RealPath(const std::string& p);

// Every device of the filesystem, writable and locked.
struct OpenedSet {
  std::vector<std::unique_ptr<ImageLock>> locks;
  std::map<uint64_t, std::string> names;  // devid -> the path it was opened by
  Opened o;

  // "1 PATH, 2 PATH": for messages that name the devices there are.
  std::string Listing() const;
};

// Whether a filesystem with devices missing may be changed: with
// options.degraded, or when the change takes out the one device that is
// missing (`removing`: what RemoveDevice or ReplaceDevice was named).
Status CheckDegraded(const Volume& vol, const DeviceChangeOptions& options, const std::string& removing);

// Opens `devices` (each may list several, comma-separated; the others are
// found in options.scan_dirs). Refuses a sprouted filesystem and, through
// CheckDegraded, one with devices missing.
Result<OpenedSet> OpenSet(const std::vector<std::string>& devices, const DeviceChangeOptions& options,
                          const std::string& removing = "");

// Closes the set: the transaction manager before the volume it uses, the
// locks last.
void Close(OpenedSet* set);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_OFFLINE_OPEN_H_
