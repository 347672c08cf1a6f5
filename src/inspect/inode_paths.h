// Paths of inodes and subvolumes from the top level, read from the items
// that name them (INODE_REF / INODE_EXTREF up to the subvolume's top
// directory, ROOT_BACKREF from a subvolume to the directory that holds its
// entry), as the kernel's ino_paths and ino_lookup answer them for
// `btrfs inspect-internal inode-resolve` and `subvolid-resolve`.
//
// Read-only and uncached in the volume: the resolver keeps what it found
// (roots, directory paths) for the next question. Items come from an
// untrusted image: names are taken within their item, and a chain of
// parents longer than any real tree is an error, not a loop.
#ifndef UBTRFS_INSPECT_INODE_PATHS_H_
#define UBTRFS_INSPECT_INODE_PATHS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tree/cursor.h"
#include "txn/volume.h"
#include "ubtrfs/status.h"

namespace ubtrfs::inspect {

class PathResolver {
 public:
  explicit PathResolver(txn::Volume* vol) : vol_(vol) {}

  // Every name of inode `ino` of tree `root`, one per hard link, each from
  // the top level without a leading slash ("sub/dir/file"). The subvolume's
  // top directory has one path: the subvolume's own. NotFound when the
  // inode has no name (an orphan, or no such inode).
  Result<std::vector<std::string>> InodePaths(uint64_t root, uint64_t ino);
  // Where subvolume `root` sits from the top level ("" for the top level
  // itself). NotFound for a subvolume no directory holds (deleted).
  Result<std::string> SubvolPath(uint64_t root);
  // The tree's root block from its ROOT_ITEM (the newest one).
  Result<tree::RootPtr> Root(uint64_t id);

 private:
  // The path of directory `dir` below its subvolume's top ("" for the top).
  Result<std::string> DirPath(uint64_t root, uint64_t dir, int depth);
  Result<std::string> SubvolPathAt(uint64_t root, int depth);
  // (parent directory, name) of every link of `ino` in tree `root`.
  Result<std::vector<std::pair<uint64_t, std::string>>> Links(uint64_t root, uint64_t ino);

  txn::Volume* vol_;
  std::map<uint64_t, tree::RootPtr> roots_;
  std::map<std::pair<uint64_t, uint64_t>, std::string> dirs_;  // (root, dir) -> path
  std::map<uint64_t, std::string> subvols_;
};

// Joins path parts with '/', leaving out empty ones.
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace ubtrfs::inspect

#endif  // UBTRFS_INSPECT_INODE_PATHS_H_
