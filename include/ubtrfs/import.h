// Copies a host directory tree (or one file) into an image through the
// public write API: regular files, directories, symlinks, hard links,
// fifos, sockets and device nodes, with modes, owners, times and xattrs.
// Used by `ubtrfs cp HOST IMAGE:PATH` and `ubtrfs mkfs --rootdir`; the
// mirror of ExportTree (ubtrfs/export.h).
#ifndef UBTRFS_IMPORT_H_
#define UBTRFS_IMPORT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs {

struct ImportStats {
  uint64_t files = 0, dirs = 0, symlinks = 0, hardlinks = 0, specials = 0;
  uint64_t bytes = 0;
  uint64_t xattrs = 0;
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
};

// Copies host path `src` to `name` inside directory `dest_dir` of the image.
UBTRFS_API Status ImportTree(Filesystem& fs, const std::string& src, InodeId dest_dir, const std::string& name,
                  const ImportOptions& options = {}, ImportStats* stats = nullptr);

// Copies the contents of host directory `src` into image directory `dest_dir`
// (the top directory's own mode, owner, times and xattrs go onto dest_dir).
UBTRFS_API Status ImportContents(Filesystem& fs, const std::string& src, InodeId dest_dir, const ImportOptions& options = {},
                      ImportStats* stats = nullptr);

}  // namespace ubtrfs

#endif  // UBTRFS_IMPORT_H_
