// Copies a host directory tree (or one file) into an image through the
// public write API: regular files, directories, symlinks, hard links,
// fifos, sockets and device nodes, with modes, owners, times and xattrs.
// Used by `ubtrfs cp HOST IMAGE:PATH` and `ubtrfs mkfs --rootdir`; the
// mirror of ExportTree (ubtrfs/export.h).
#ifndef UBTRFS_IMPORT_H_
#define UBTRFS_IMPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs {

struct ImportStats {
  uint64_t files = 0, dirs = 0, symlinks = 0, hardlinks = 0, specials = 0;
  uint64_t bytes = 0;
  uint64_t xattrs = 0;
  // With ImportOptions::reflink: data bytes shared with the host files
  // (cloned), and copied by the kernel where it could not clone.
  uint64_t reflinked_bytes = 0;
  uint64_t kernel_copied_bytes = 0;
};

struct ImportOptions {
  // Called now and then with the running totals (progress display).
  std::function<void(const ImportStats&)> progress;
  // Commit every this many bytes of data, to bound what a transaction holds.
  uint64_t commit_every_bytes = 1ull << 30;
  // ImportContents into an empty directory builds the new inodes' items in
  // key order and appends them a leaf at a time (much faster for many small
  // files). Commits in the middle may hold a partial import, so this is for
  // a new image (mkfs --rootdir), where only the end state counts.
  bool bulk = false;
  // Entries below `src` (paths relative to it, as "a/b") that are left out
  // with everything below them; mkfs --subvol makes them subvolumes and
  // imports their contents separately. Needs `bulk` and an empty
  // destination directory (EINVAL otherwise).
  std::vector<std::string> skip;
  // Inode flags for paths relative to `src` ("" is `src` itself, put on the
  // destination directory), as mkfs.btrfs --inode-flags: a directory's flags
  // are inherited by everything created below it, and kImportNodatacow on a
  // regular file implies kImportNodatasum. Such files get no data checksums
  // and no compression. Needs `bulk` and an empty destination (EINVAL
  // otherwise).
  std::map<std::string, uint32_t> inode_flags;
  // Every imported inode (the destination directory too) gets this owner
  // (uid, gid) instead of the source's (mkfs --owner).
  std::optional<std::pair<uint32_t, uint32_t>> owner;
  // Times (atime, mtime, ctime) later than this are stored as this, as
  // reproducible builds clamp to SOURCE_DATE_EPOCH (a source tree's ctimes
  // and atimes are those of its checkout and reads).
  std::optional<Time> max_time;
  // File data goes from the host file into the image file without passing
  // through this process's writes: cloned (FICLONERANGE, the image then
  // shares the host file's extents) where the image file lies on the same
  // file system as the sources and it can clone (btrfs, xfs), else copied
  // in the kernel (copy_file_range), else written as usual. The bytes are
  // still read, for the checksums. Not with compression (compressed data
  // is not the host's bytes): such files are written as usual.
  bool reflink = false;
};

// ImportOptions::inode_flags bits.
inline constexpr uint32_t kImportNodatasum = 1;  // BTRFS_INODE_NODATASUM
inline constexpr uint32_t kImportNodatacow = 2;  // BTRFS_INODE_NODATACOW

// Copies host path `src` to `name` inside directory `dest_dir` of the image.
UBTRFS_API Status ImportTree(Filesystem& fs, const std::string& src, InodeId dest_dir, const std::string& name,
                  const ImportOptions& options = {}, ImportStats* stats = nullptr);

// Copies the contents of host directory `src` into image directory `dest_dir`
// (the top directory's own mode, owner, times and xattrs go onto dest_dir).
UBTRFS_API Status ImportContents(Filesystem& fs, const std::string& src, InodeId dest_dir, const ImportOptions& options = {},
                      ImportStats* stats = nullptr);

// Copies the contents of a tar archive (ustar, pax or GNU; plain or
// compressed with gzip, bzip2, xz, zstd, lz4...: detected from the content)
// into image directory `dest_dir`: "-" reads standard input. Owners, modes,
// times, xattrs (security.* and ACLs included, SCHILY.acl.* ACLs stored as
// system.posix_acl_*), hard links, symlinks, device nodes, fifos and sparse
// files as the archive records them; a "./" entry's attributes go onto
// `dest_dir`, directories the archive does not list are made 0755.
// EINVAL for what is not a tar archive or has ".." in a path.
UBTRFS_API Status ImportArchive(Filesystem& fs, const std::string& archive, InodeId dest_dir,
                                const ImportOptions& options = {}, ImportStats* stats = nullptr);

}  // namespace ubtrfs

#endif  // UBTRFS_IMPORT_H_
