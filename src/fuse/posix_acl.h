// POSIX ACLs in their xattr encoding (system.posix_acl_access / _default),
// and the rules the kernel's VFS applies to them for native file systems,
// which a FUSE server without FUSE_POSIX_ACL must apply itself:
//   - setting an access ACL updates the mode, and an ACL the mode can say on
//     its own is not stored at all (posix_acl_update_mode);
//   - chmod rewrites the access ACL's owner / mask (or group) / other
//     entries (posix_acl_chmod);
//   - a new inode in a directory with a default ACL gets an access ACL made
//     from it, masked by the create mode, and a new directory inherits the
//     default ACL (posix_acl_create).
#ifndef UBTRFS_FUSE_POSIX_ACL_H_
#define UBTRFS_FUSE_POSIX_ACL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ubtrfs::fuse::acl {

inline constexpr std::string_view kAccessName = "system.posix_acl_access";
inline constexpr std::string_view kDefaultName = "system.posix_acl_default";

enum Tag : uint16_t { kUserObj = 1, kUser = 2, kGroupObj = 4, kGroup = 8, kMask = 0x10, kOther = 0x20 };

struct Entry {
  uint16_t tag = 0;
  uint16_t perm = 0;
  uint32_t id = 0xffffffff;
};

using Acl = std::vector<Entry>;

// Parses and validates (version 2; entries in tag order, named ones by id,
// no duplicates; exactly one owner, group and other entry; a mask when there
// are named entries). nullopt when malformed.
std::optional<Acl> Parse(std::string_view xattr);
std::string Serialize(const Acl& acl);

// The permission bits the ACL implies and whether the mode alone can express
// it (only owner, group and other entries).
uint32_t ModeBits(const Acl& acl, bool* equivalent);

// chmod: the ACL after the permission bits became `mode`.
Acl Chmod(Acl acl, uint32_t mode);

// A new inode of `*mode` under a directory whose default ACL is `def`:
// masks `*mode` by the ACL and returns the new inode's access ACL, or
// nullopt when the mode says it all.
std::optional<Acl> CreateMasq(Acl def, uint32_t* mode);

}  // namespace ubtrfs::fuse::acl

#endif  // UBTRFS_FUSE_POSIX_ACL_H_
