// `ubtrfs check` of the UUID tree against the subvolumes, where the
// superblock says it is current (uuid_tree_generation equal to the
// generation). Then the kernel trusts it and never rescans: a subvolume
// whose uuid or received uuid has no entry stays unfindable by uuid (send
// -p, receive's parent lookup), so a missing entry is an error. Entries for
// subvolumes that are gone are only stale (the kernel's rescan drops them;
// lookups check what they find): a warning. A stale tree (mkfs.btrfs leaves
// 0; a kernel interrupted in its scan) is the kernel's to rebuild: not
// checked.
#ifndef UBTRFS_CHECK_UUID_TREE_H_
#define UBTRFS_CHECK_UUID_TREE_H_

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <tuple>

#include "check/report.h"
#include "format/key.h"

namespace ubtrfs::check {

class UuidTreeCheck {
 public:
  // A ROOT_ITEM of a subvolume tree with refs > 0 (deleted ones lose their
  // entries when they are unlinked, before they are dropped).
  void Subvolume(uint64_t id, std::span<const uint8_t> root_item);
  // An item of the UUID tree.
  void Item(const format::Key& k, std::span<const uint8_t> d, Report* report);
  void Finish(bool current, bool have_tree, Report* report) const;

 private:
  using Uuid = std::array<uint8_t, 16>;
  using Entry = std::tuple<Uuid, uint8_t, uint64_t>;  // uuid, key type, subvolume
  std::set<Entry> expected_, found_;
};

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_UUID_TREE_H_
