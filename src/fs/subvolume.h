// Per-subvolume facts the write side checks on every change: whether a
// subvolume is read-only (its ROOT_ITEM's RDONLY flag), cached per subvolume.
#ifndef UBTRFS_FS_SUBVOLUME_H_
#define UBTRFS_FS_SUBVOLUME_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <unordered_map>

#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

#include "txn/volume.h"

namespace ubtrfs::fsimpl {

// The read-only flags of the subvolumes a view has changed or tried to.
// Lookups run on every change, from several threads at once: a subvolume's
// answer sits in one of 64 slots (looked up without a lock; filled under the
// mutex), with a map for the rare subvolume whose slot is taken.
class SubvolumeFlags {
 public:
  explicit SubvolumeFlags(txn::Volume* vol) : vol_(vol) {}

  // OK when no subvolume among `ids` is read-only; EROFS naming the first
  // that is. Ids whose tree cannot be found pass (the operation itself then
  // reports the bad id).
  Status CheckWritable(std::initializer_list<InodeId> ids);
  Status CheckWritable(uint64_t root);
  // Whether subvolume `root` is read-only, from its root item.
  Result<bool> ReadOnly(uint64_t root);
  // Forgets every cached answer (after a flag changed). Only while no other
  // thread checks (the caller holds the operation lock exclusive).
  void Forget();

 private:
  struct alignas(16) Slot {
    std::atomic<uint64_t> root{0};  // 0: empty
    std::atomic<bool> ro{false};
  };
  static size_t SlotOf(uint64_t root) { return (root * 0x9E3779B97F4A7C15ull) >> 58; }

  txn::Volume* vol_;
  std::array<Slot, 64> slots_;
  std::mutex mu_;                              // guards filling slots_ and overflow_
  std::unordered_map<uint64_t, bool> overflow_;  // subvolumes whose slot another holds
};

// The root item of the subvolume whose top directory is `subvol`; EINVAL
// when it is no such top.
Result<txn::Volume::TreeRoot> SubvolTop(txn::Volume& vol, InodeId subvol);

}  // namespace ubtrfs::fsimpl

#endif  // UBTRFS_FS_SUBVOLUME_H_
