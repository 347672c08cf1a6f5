// Images in a Ceph cluster, through librbd (no kernel rbd map, no root):
// rbd:POOL/[NAMESPACE/]IMAGE[@SNAP][:KEY=VALUE...], QEMU's syntax. The keys
// conf (a ceph.conf), id (the client name without "client.") and keyring
// are librados' connection settings; every other key is a Ceph option set
// on the connection (rados_osd_op_timeout=10, rbd_cache=true, ...). A ':'
// or '@' inside a name or value is written "\:" / "\@".
//
// Writes are asynchronous: WriteAt copies the bytes and returns once librbd
// has them; many are in flight at once and Flush waits for all of them, then
// rbd_flush, and reports the first write error (the device stays failed
// after one). A writable open takes the image's exclusive lock (or, on an
// image without the exclusive-lock feature, an advisory lock), so a second
// writer anywhere is refused. Snapshots open read-only.
#ifndef UBTRFS_IO_RBD_DEVICE_H_
#define UBTRFS_IO_RBD_DEVICE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/block_device.h"

namespace ubtrfs::io {

inline constexpr std::string_view kRbdPrefix = "rbd:";

// True for a path the RBD device opens ("rbd:..."): such a name is never
// taken as a host file.
inline bool IsRbdPath(std::string_view path) { return path.starts_with(kRbdPrefix); }

struct RbdSpec {
  std::string pool, ns, image, snap;
  std::string conf, id, keyring;
  std::vector<std::pair<std::string, std::string>> options;  // the other KEY=VALUEs, in order
  // rbd:POOL/[NS/]IMAGE[@SNAP], for messages (no options, no secrets).
  std::string Name() const;
};

// Parses an rbd: path; EINVAL names what is wrong.
Result<RbdSpec> ParseRbdSpec(std::string_view text);

// Whether rbd: paths work here: built with librbd's headers, and the Ceph
// client libraries load (this loads them; see io/ceph_library.h).
bool RbdSupported();

Result<std::unique_ptr<BlockDevice>> OpenRbdDevice(const std::string& spec, OpenFlags flags);

// The image's size, or nullopt when the pool has no such image (mkfs).
Result<std::optional<uint64_t>> RbdImageSize(const std::string& spec);
// Creates the image (format 2, the cluster's default features, which
// include exclusive-lock) of `bytes`; EEXIST if it is there.
Status CreateRbdImage(const std::string& spec, uint64_t bytes);
// Grows an image (mkfs --size over a smaller image), as ftruncate does a file.
Status ResizeRbdImage(const std::string& spec, uint64_t bytes);
Status RemoveRbdImage(const std::string& spec);

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_RBD_DEVICE_H_
