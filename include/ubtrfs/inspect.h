// Looking below the files of an image, for tools and researchers: every tree
// block as text (`ubtrfs dump-tree`, as `btrfs inspect-internal dump-tree`),
// the shape of each tree (`ubtrfs stats IMAGE`), and what a member device's
// own superblock says when the filesystem cannot be opened from the devices
// given. These read blocks, not files: a damaged image is what they show.
//
// Each call takes the image as Filesystem::Open does (a file, a block device,
// rbd:..., IMG1,IMG2,...) and, from `where`, only the placement: offset,
// partition and scan_dirs. They never write.
#ifndef UBTRFS_INSPECT_H_
#define UBTRFS_INSPECT_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

struct DumpTreeOptions {
  std::optional<uint64_t> tree;  // only this tree (ParseTreeName gives ids)
  std::vector<uint64_t> blocks;  // only these blocks (logical addresses)
  bool follow = false;           // with blocks: every block below them too
  bool roots_only = false;       // only the root of every tree
};

struct DumpTreeReport {
  int block_errors = 0;         // blocks that could not be read or verified
  int item_errors = 0;          // items too damaged to decode
  bool tree_not_found = false;  // options.tree has no ROOT_ITEM
  std::vector<std::string> warnings;  // about the open (a device missing, ...)
  bool clean() const { return block_errors == 0 && item_errors == 0 && !tree_not_found; }
};

// Prints the blocks to `out` in dump-tree's text form. A block that fails
// to read or verify prints an ERROR line in place of its subtree and the
// walk goes on; a damaged item prints an ERROR line, never reads past
// itself. A non-OK Status: the image could not be opened at all.
UBTRFS_API Result<DumpTreeReport> DumpTree(const std::string& image, const OpenOptions& where,
                                           const DumpTreeOptions& options, std::FILE* out);

// A tree's id from a number or a name (root, extent, chunk, dev, fs, csum,
// quota, uuid, free-space, block-group, raid-stripe, data-reloc, log, with
// or without "-tree"); nullopt for anything else.
UBTRFS_API std::optional<uint64_t> ParseTreeName(const std::string& name);

struct TreeShape {
  uint64_t tree = 0;  // the tree's objectid
  std::string name;   // ROOT_TREE, EXTENT_TREE, FS_TREE, 256, ...
  int levels = 0;
  uint64_t nodes = 0, leaves = 0, items = 0;
  uint64_t leaf_bytes = 0, leaf_bytes_used = 0;  // item space of all leaves, and what items take of it
  std::string error;  // why the walk stopped (a block unreadable); counts are then partial
};

// Every tree of the image (the root and chunk trees and each one a ROOT_ITEM
// names), walked block by block, in objectid order. A damaged tree has its
// error and the walk goes on to the next; a non-OK Status: the image cannot
// be opened or its root tree read.
UBTRFS_API Result<std::vector<TreeShape>> TreeShapes(const std::string& image, const OpenOptions& where);

// What the superblocks of the devices `image` names say, for a filesystem
// that cannot be opened from them (a RAID0 member alone): every field from
// the first device's superblock (devid its own), and as devices_missing
// every devid up to num_devices that none of them has (the superblock does
// not list the devices; at most 64 are named).
UBTRFS_API Result<FsInfo> ReadMemberInfo(const std::string& image, const OpenOptions& where);

// Which files hold a logical address, as the kernel's LOGICAL_INO answers
// `btrfs inspect-internal logical-resolve` on a mounted filesystem: every
// file extent item pointing at it, in every subvolume and snapshot whose
// tree holds the item's leaf (shared leaves included), with the file's
// paths from the top level.
struct LogicalResolveOptions {
  // Every reference to the extent holding the address, not only those
  // covering it (the kernel's LOGICAL_INO_ARGS_IGNORE_OFFSET, `-o`).
  bool ignore_offset = false;
  bool paths = true;  // resolve each inode's paths (LogicalRef::paths)
};
struct LogicalRef {
  uint64_t root = 0;   // the subvolume (tree id)
  uint64_t inode = 0;
  // The file offset of the address; of the file extent item's start with
  // ignore_offset or for a compressed extent (referenced as a whole).
  uint64_t offset = 0;
  std::vector<std::string> paths;  // one per hard link, without a leading '/'
};
struct LogicalResolution {
  uint64_t extent = 0, extent_bytes = 0;  // the data extent holding the address
  std::vector<LogicalRef> refs;           // by root, inode, offset
  // What could not be read or resolved on the way (a leaf, an inode's
  // name); refs holds what was found regardless.
  std::vector<std::string> errors;
  // About the open, and a fallback taken: where the extent tree does not
  // read, every file tree is searched for items holding the address (the
  // same answers, by reading all of their leaves).
  std::vector<std::string> warnings;
};
// ENOENT: no extent holds the address; EINVAL: it is in a tree block.
UBTRFS_API Result<LogicalResolution> ResolveLogical(const std::string& image, const OpenOptions& where,
                                                    uint64_t logical, const LogicalResolveOptions& options);
// Every path of inode `ino` of subvolume `subvolid` (5: the top level), one
// per hard link, from the top level without a leading '/' (`inode-resolve`).
UBTRFS_API Result<std::vector<std::string>> ResolveInode(const std::string& image, const OpenOptions& where,
                                                         uint64_t subvolid, uint64_t ino);
// Where subvolume `subvolid` sits, from the top level ("" for the top level
// itself; `subvolid-resolve`). ENOENT for no such subvolume, or one that no
// directory holds.
UBTRFS_API Result<std::string> ResolveSubvolume(const std::string& image, const OpenOptions& where,
                                                uint64_t subvolid);
// Roots of older commits, for an image whose root tree is lost with its
// backup roots (`ubtrfs inspect find-root`, as btrfs-find-root): every
// metadata and system chunk read block by block for verified tree blocks
// of `tree`; the highest-level one of each generation is that commit's root.
// Read one with RescueOptions::tree_root (`--tree-root`). Needs the
// superblock and the chunk tree only.
struct FindRootOptions {
  uint64_t tree = 1;  // the root tree; any tree's id (2 extent, 5 fs, 3 chunk, ...)
};
struct RootCandidate {
  uint64_t bytenr = 0, generation = 0;
  int level = 0;
  friend bool operator==(const RootCandidate&, const RootCandidate&) = default;
};
struct FindRootResult {
  uint64_t generation = 0;   // the superblock's
  RootCandidate super_root;  // what the superblock names (root and chunk tree only)
  std::vector<RootCandidate> roots;  // one per generation, newest first
  uint64_t chunks_scanned = 0, bytes_scanned = 0, blocks_found = 0;
  uint64_t windows_unread = 0;  // 1 MiB windows that did not read whole (tried block by block)
  std::vector<std::string> warnings;  // about the open
};
UBTRFS_API Result<FindRootResult> FindRoots(const std::string& image, const OpenOptions& where,
                                            const FindRootOptions& options);
// Every field of superblock copies, as `btrfs inspect-internal dump-super`
// prints them (`ubtrfs inspect dump-super`): from the copies' bytes alone,
// so a device whose trees do not read still shows what it says. Each
// device `image` names (IMG1,IMG2,...), placed as `where` says.
struct DumpSuperOptions {
  int mirror = 0;      // the copy: 0 at 64 KiB, 1 at 64 MiB, 2 at 256 GiB
  bool all = false;    // every copy the device is large enough to have
  bool full = false;   // also the system chunk array and the backup roots
  bool force = false;  // also a copy without the btrfs magic
};
struct DumpSuperReport {
  int copies = 0;                   // copies printed
  std::vector<std::string> errors;  // a damaged system chunk array, said after what was printed
  std::vector<std::string> missing;  // the copy asked for is past a device's end (a blank line printed)
};
// EUCLEAN for a copy without the magic (unless force), EINVAL for a copy
// number past 2; a copy the device is too small to have is left out.
UBTRFS_API Result<DumpSuperReport> DumpSuper(const std::string& image, const OpenOptions& where,
                                             const DumpSuperOptions& options, std::FILE* out);
// Feature flag words as `ubtrfs info` prints them: "mixed-backref,
// extended-iref, skinny-metadata, ..." (an unknown bit as "bit N"; "none").
UBTRFS_API std::string IncompatFeatureNames(uint64_t flags);
UBTRFS_API std::string CompatRoFeatureNames(uint64_t flags);

}  // namespace ubtrfs

#endif  // UBTRFS_INSPECT_H_
