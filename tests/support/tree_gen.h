// Deterministic generator of a host directory tree that exercises the corners
// of a filesystem image: inline/regular/sparse files, holes, symlinks, hard
// links, xattrs (incl. name-hash collisions), deep and wide directories, odd
// names, fifos, device nodes, modes, owners and nanosecond timestamps.
//
// The same seed and options always produce the same names, contents, modes,
// owners, xattrs and mtimes (atime is set too; ctime cannot be set).
#ifndef UBTRFS_TESTS_SUPPORT_TREE_GEN_H_
#define UBTRFS_TESTS_SUPPORT_TREE_GEN_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ubtrfs_test {

struct TreeGenOptions {
  // Approximate number of entries (files, dirs, links, ...) in the tree.
  size_t entries = 3000;
  // Entries in the one wide directory (part of `entries`); 0 = none.
  size_t wide_dir_entries = 1100;
  // Depth of the deep directory chain; 0 = none.
  int deep_depth = 34;
  // Number of large (1-4 MiB) files with holes, and of fully sparse files.
  int large_files = 8;
  int sparse_files = 6;
  uint64_t large_file_max = 4ull << 20;
  uint64_t sparse_file_max = 16ull << 20;  // apparent size; almost no data

  bool odd_names = true;        // spaces, newline, invalid UTF-8, 255-byte names, ...
  bool hard_links = true;       // several names for one inode, across directories
  bool many_links = true;       // one inode with ~40 long names in one dir (INODE_EXTREF)
  bool xattrs = true;           // user.* on files/dirs, trusted.* on symlinks (root)
  bool acls = true;             // system.posix_acl_access/default (skipped if unsupported)
  bool hash_collisions = true;  // two names / two xattr names with the same btrfs crc32c hash
  bool fifos = true;
  bool devices = true;          // char/block device nodes (root only)
  bool owners = true;           // chown to assorted uids/gids (root only)
  bool special_modes = true;    // setuid/setgid/sticky
  bool odd_times = true;        // pre-1970 and post-2038 mtimes
};

// What the generator actually produced (some things depend on privileges and
// on what the host filesystem supports).
struct TreeGenStats {
  size_t dirs = 0, files = 0, symlinks = 0, hard_links = 0, fifos = 0, devices = 0;
  size_t xattrs = 0;
  size_t xattrs_skipped = 0;   // setxattr refused (unsupported or not permitted)
  bool symlink_xattrs = false; // trusted.* on symlinks worked
  bool acls = false;
  uint64_t data_bytes = 0;     // bytes written (not apparent size)
  uint64_t apparent_bytes = 0;
  std::string Summary() const;
};

// Creates the tree inside `dir` (which must exist and be empty). Throws
// std::runtime_error naming the path and errno when something fails.
void GenerateTree(const std::string& dir, uint64_t seed, const TreeGenOptions& options = {});
TreeGenStats GenerateTreeWithStats(const std::string& dir, uint64_t seed, const TreeGenOptions& options = {});

// A smaller tree (about `entries` entries) with the same variety: a scaled
// copy of the defaults.
TreeGenOptions ScaledTreeOptions(size_t entries);

// The hash btrfs uses for directory entry and xattr names: crc32c(~1, name).
uint32_t BtrfsNameHash(const std::string& name);

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_TREE_GEN_H_
