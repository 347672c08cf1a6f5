// The shard of a directory in inode/'s per-directory tables (delayed
// DIR_INDEX and DIR_ITEM queues): directories spread over kDirShards parts,
// each with its own lock, by a multiplicative hash of (root, dir).
#ifndef UBTRFS_INODE_DIR_SHARD_H_
#define UBTRFS_INODE_DIR_SHARD_H_

#include <cstddef>
#include <cstdint>

namespace ubtrfs::inode {

inline constexpr size_t kDirShards = 16;
inline size_t DirShard(uint64_t root, uint64_t dir) {
  static_assert(kDirShards == 16, "the top 4 bits of the hash pick the shard");
  return static_cast<size_t>((dir * 0x9E3779B97F4A7C15ull + root) >> 60);
}

}  // namespace ubtrfs::inode

#endif  // UBTRFS_INODE_DIR_SHARD_H_
