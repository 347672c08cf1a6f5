// Building btrfs images with btrfs-progs for the interop suites.
#ifndef UBTRFS_TESTS_SUPPORT_MKFS_UTIL_H_
#define UBTRFS_TESTS_SUPPORT_MKFS_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {

// Runs `btrfs check --readonly --mode=MODE IMAGE`: "" when it exits 0, prints
// "no error found" and no error line; otherwise its whole output.
std::string BtrfsCheck(const std::string& image, const std::string& mode = "original");

// What btrfs-progs says about an image's space: the block group items'
// used bytes by kind (from the extent tree or the block-group tree, as the
// image keeps them), and how many data extents the extent tree holds.
struct ProgsSpace {
  uint64_t data_used = 0, metadata_used = 0, system_used = 0;
  int data_groups = 0;
  uint64_t data_extents = 0;
};
ProgsSpace SpaceFromDumpTree(const std::string& image);

// "" when mkfs.btrfs is installed, otherwise a message saying how to get it.
std::string MkfsMissingReason();

// Creates `image` as a sparse file of `size` bytes and runs
//   mkfs.btrfs -q -f [--rootdir DIR] --nodesize N --csum T [extra...] IMAGE
// (rootdir, nodesize and csum are omitted when empty/0). Returns "" or the
// command line and its output.
std::string RunMkfs(const std::string& image, const std::string& rootdir, uint32_t nodesize,
                    const std::string& csum, uint64_t size = 512ull << 20,
                    const std::vector<std::string>& extra = {});

// Filesystem::Open(image) writable; a test failure (and nullptr) if it fails.
std::unique_ptr<ubtrfs::Filesystem> OpenWritable(const std::string& image);

// What a comparison of the --rootdir source with the image may assert, given
// what mkfs.btrfs (btrfs-progs 6.2) --rootdir actually writes. Measured with
// a kernel loop mount and `btrfs inspect-internal dump-tree`; mkfs 6.2:
//   preserves: file types (regular, dir, symlink, fifo, socket, char/block
//     device *type*), permission bits incl. setuid/setgid/sticky, uid/gid,
//     sizes, file bytes, symlink targets, hard links (one inode, correct
//     nlink; INODE_EXTREF items when a ref item overflows a leaf), all xattrs
//     (user.*, trusted.* incl. on symlinks, system.posix_acl_*; colliding
//     name hashes share one DIR_ITEM/XATTR_ITEM), and the *seconds* of
//     mtime/atime/ctime;
//   does not preserve: the nanoseconds of any time (truncated to 0), otime
//     (written as 0), device numbers (rdev written as 0), holes (sparse files
//     are written out in full, zeros included), and anything about the top
//     directory itself (the root inode gets mode 0755, uid/gid 0, the current
//     time and no xattrs). It also reuses the host inode numbers and writes
//     garbage into the transid field of DIR_ITEM/DIR_INDEX entries.
CompareOptions MkfsRootdirCompareOptions();

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_MKFS_UTIL_H_
