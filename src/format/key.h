// In-memory keys and their ordering: (objectid, type, offset), compared in
// that order as unsigned integers, exactly as btrfs orders items in a tree.
#ifndef UBTRFS_FORMAT_KEY_H_
#define UBTRFS_FORMAT_KEY_H_

#include <compare>
#include <cstdint>
#include <string>

#include "format/ondisk.h"

namespace ubtrfs::format {

struct Key {
  uint64_t objectid = 0;
  uint8_t type = 0;
  uint64_t offset = 0;

  static Key From(const DiskKey& d) { return Key{d.objectid.get(), d.type, d.offset.get()}; }
  void To(DiskKey* d) const {
    d->objectid.set(objectid);
    d->type = type;
    d->offset.set(offset);
  }
  static constexpr Key Min() { return Key{0, 0, 0}; }
  static constexpr Key Max() { return Key{UINT64_MAX, UINT8_MAX, UINT64_MAX}; }

  friend constexpr auto operator<=>(const Key&, const Key&) = default;
  friend constexpr bool operator==(const Key&, const Key&) = default;
};

// The ORPHAN_ITEM of `id`: an inode with no names left (in its subvolume's
// tree) or a dead subvolume (in the root tree), to be deleted.
constexpr Key OrphanKey(uint64_t id) { return Key{kOrphanObjectid, kOrphanItemKey, id}; }

// "(256 INODE_ITEM 0)" in the style of btrfs inspect-internal dump-tree.
std::string KeyTypeName(uint8_t type);
std::string ObjectidName(uint64_t objectid);
std::string KeyToString(const Key& key);

}  // namespace ubtrfs::format

#endif  // UBTRFS_FORMAT_KEY_H_
