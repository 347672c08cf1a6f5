// FUSE node ids <-> ubtrfs::InodeId, with the kernel's lookup counts.
//
// Inodes of the mounted (default) subvolume keep their btrfs inode number as
// the node id, so `stat` through the mount shows what the kernel's btrfs
// shows; the top directory is FUSE_ROOT_ID. Inodes of other subvolumes (whose
// numbers collide with those of the mounted one: every subvolume's top is
// 256) get numbers from kMappedBase up, assigned on first sight and kept for
// the life of the mount, so a node id never changes meaning.
#ifndef UBTRFS_FUSE_INODE_MAP_H_
#define UBTRFS_FUSE_INODE_MAP_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::fuse {

class InodeMap {
 public:
  static constexpr uint64_t kRootNodeId = 1;  // FUSE_ROOT_ID
  static constexpr uint64_t kMappedBase = 1ull << 63;

  explicit InodeMap(InodeId root) : root_(root) {}

  InodeId root() const { return root_; }

  // The node id for an inode, assigning one if it has none yet. Does not
  // count a lookup.
  uint64_t ToNode(InodeId id);
  // The inode behind a node id the kernel sent; nullopt if we never handed
  // it out.
  std::optional<InodeId> ToInode(uint64_t node) const;
  // What stat and readdir report as st_ino / d_ino: the btrfs inode number
  // for the mounted subvolume (256 for its top, as the kernel shows it), the
  // node id elsewhere (unique, unlike the btrfs numbers of other subvolumes).
  uint64_t StIno(uint64_t node, InodeId id) const {
    return node >= kMappedBase ? node : id.ino;
  }

  // The kernel now holds n more references (a reply carrying an entry).
  void AddLookup(uint64_t node, uint64_t n = 1);
  // FORGET: the kernel dropped n references.
  void Forget(uint64_t node, uint64_t n);
  uint64_t LookupCount(uint64_t node) const;
  // Nodes with a non-zero lookup count (for statistics).
  size_t LiveNodes() const;

 private:
  bool Direct(InodeId id) const { return id.root == root_.root && id.ino < kMappedBase && id.ino > kRootNodeId; }

  const InodeId root_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> counts_;                 // node -> lookups
  std::unordered_map<uint64_t, InodeId> mapped_;                  // node -> inode (other subvolumes)
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> mapped_rev_;  // (root, ino) -> node
  uint64_t next_mapped_ = kMappedBase;
};

}  // namespace ubtrfs::fuse

#endif  // UBTRFS_FUSE_INODE_MAP_H_
