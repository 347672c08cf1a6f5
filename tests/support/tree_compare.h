// Attribute-by-attribute, byte-by-byte comparison of a host directory tree with
// a directory inside a btrfs image (read through ubtrfs::Filesystem), or with
// another host directory.
//
// The functions return human-readable mismatch descriptions (path, what
// differs, both values), at most max_mismatches of them plus a final
// "... N more" line; an empty vector means the trees agree.
#ifndef UBTRFS_TESTS_SUPPORT_TREE_COMPARE_H_
#define UBTRFS_TESTS_SUPPORT_TREE_COMPARE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {

struct CompareOptions {
  size_t max_mismatches = 50;

  bool compare_type = true;    // S_IFMT (always meaningful; off only for experiments)
  bool compare_mode = true;    // permission bits incl. setuid/setgid/sticky
  bool compare_owner = true;   // uid, gid
  bool compare_size = true;    // st_size of non-directories
  bool compare_rdev = true;    // device numbers of char/block devices
  bool compare_data = true;    // file bytes
  bool compare_symlinks = true;  // link targets
  bool compare_xattrs = true;  // names and values
  bool compare_mtime = true;   // sec + nsec
  bool compare_symlink_mtime = true;
  bool compare_dir_mtime = true;
  bool compare_nlink = true;             // non-directories
  bool compare_hardlink_identity = true;  // same inode <=> same inode, both ways
  // Attributes of the top directory itself (mode, owner, times, xattrs).
  bool compare_top_attrs = true;
  // Compare the nanoseconds of times too (mkfs.btrfs 6.2 --rootdir drops them).
  bool compare_time_nsec = true;

  // Meaningful only between a kernel mount of an image and the same image:
  bool compare_dir_nlink = false;      // btrfs reports 1, ext4 2+subdirs
  bool compare_dir_size = false;       // btrfs: 2 * sum of name lengths
  bool compare_ctime = false;
  bool compare_atime = false;
  bool compare_otime = false;          // statx btime vs Stat.otime (image side)
  bool compare_inode_numbers = false;  // st_ino vs InodeId.ino (image side)
  bool compare_nbytes = false;         // st_blocks*512 vs nbytes rounded to sectors
  bool compare_readdir_order = false;  // host readdir order vs DIR_INDEX order

  // Image side only: Lookup(".", ".."), LookupChild and ReadDir ids/types/
  // indexes must agree with Lookup of the full path.
  bool check_lookup_consistency = true;

  // xattrs present only on the source side under these names are ignored.
  std::vector<std::string> source_only_xattrs = {"security.selinux"};
  // xattrs with these name prefixes are ignored on both sides.
  std::vector<std::string> ignore_xattr_prefixes;

  // Paths (relative, no leading slash) for which a predicate says to skip
  // comparing times; e.g. directories whose mtime a tool cannot preserve.
  std::function<bool(const std::string& rel)> skip_times;

  uint64_t read_seed = 1;  // varies the chunk sizes and offsets of reads
};

// Preset for "kernel mount of image X" vs "ubtrfs reading image X": everything
// is compared, including directory nlink/size, ctime/atime/otime, inode
// numbers, allocated bytes and readdir order.
CompareOptions KernelMountCompareOptions();

struct CompareStats {
  size_t entries = 0;      // entries compared
  size_t files_read = 0;   // regular files whose bytes were compared
  uint64_t bytes_read = 0;
};

// Compares source_dir (a host directory, walked with lstat) with image_dir in
// fs (an absolute path in the image, "/" for the top of the filesystem).
std::vector<std::string> CompareTreeToImage(const std::string& source_dir, ubtrfs::Filesystem& fs,
                                            const CompareOptions& options = {},
                                            const std::string& image_dir = "/",
                                            CompareStats* stats = nullptr);

// Compares two host directories the same way (ctime and atime are never
// compared here, whatever the options say).
std::vector<std::string> CompareHostTrees(const std::string& a, const std::string& b,
                                          const CompareOptions& options = {}, CompareStats* stats = nullptr);

// "mismatches:\n  - ...\n  - ..." for test failure output.
std::string FormatMismatches(const std::vector<std::string>& mismatches);

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_TREE_COMPARE_H_
