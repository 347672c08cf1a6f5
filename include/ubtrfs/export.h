// Copying a file or tree out of an image into the host's file system, safe
// against hostile images.
//
//   ubtrfs::ExportOptions opts;
//   ubtrfs::ExportReport report;
//   auto st = ubtrfs::ExportTree(*fs, *fs->Lookup("/etc"), "/tmp/out/etc", opts, &report);
//
// Everything is created relative to the destination directory's descriptor,
// one component at a time: a name from the image is never resolved as a
// path, no symlink in the destination is ever followed (an existing symlink
// where a directory would go stops that subtree with an error), and a hard
// link is only made to a file this run extracted. Entries the image holds
// with invalid or duplicate names are never handed on (Filesystem::ReadDir);
// they are warnings, or errors with `strict`.
//
// Ownership, set-id bits, device nodes and security.*/trusted.* xattrs follow
// GNU tar's defaults for the same user: a root process keeps them all; any
// other user's copy belongs to that user, has set-user-ID and set-group-ID
// bits cleared, has no device nodes (they are skipped with a warning) and
// only the xattrs an unprivileged process may set (user.* and POSIX ACLs).
#ifndef UBTRFS_EXPORT_H_
#define UBTRFS_EXPORT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

struct ExportOptions {
  // A skipped image entry (invalid or duplicate name, a directory seen twice)
  // is an error instead of a warning. The copy still goes on with the rest.
  bool strict = false;
  // Make device nodes (only a privileged process can).
  bool devices = true;
  // Copy extended attributes.
  bool xattrs = true;
  // Keep owners, set-id bits and privileged xattr namespaces. Unset: decided
  // by the effective user (root keeps them).
  std::optional<bool> privileged;
  // Every warning and error as it happens, one line each without the
  // "ubtrfs:" prefix (e.g. "img:/a/b: name contains '/', skipped"). Unset:
  // they only count in the report.
  std::function<void(bool error, std::string_view message)> on_message;
};

struct ExportReport {
  uint64_t dirs = 0, files = 0, symlinks = 0, hardlinks = 0, specials = 0;
  uint64_t bytes = 0;
  uint64_t warnings = 0;
  uint64_t errors = 0;
};

// Copies the image inode `src` (a directory recursively) to the host path
// `dest`: the last component of `dest` is created (a directory that already
// exists is merged into; an existing non-directory is replaced, as tar
// does); the components before it are the caller's and resolve as usual.
// `src_name` names the source in messages ("img:/etc"). Returns an error
// status when anything failed (the report counts what), Ok otherwise.
UBTRFS_API Status ExportTree(Filesystem& fs, InodeId src, std::string_view src_name, const std::string& dest,
                  const ExportOptions& options = {}, ExportReport* report = nullptr);

}  // namespace ubtrfs

#endif  // UBTRFS_EXPORT_H_
