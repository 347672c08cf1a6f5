// libarchive, loaded on the first archive import rather than linked:
// with what it pulls in (ICU, libxml2, nettle, liblzma, lz4, bzip2, libacl)
// it maps about 1.5 MB into every process that loads libubtrfs, which every
// command and every program embedding the library would pay for nothing
// (docs/BENCHMARKS.md, session 24). The headers still come from libarchive-dev.
#ifndef UBTRFS_FS_ARCHIVE_LIBRARY_H_
#define UBTRFS_FS_ARCHIVE_LIBRARY_H_

#include <archive.h>
#include <archive_entry.h>

#include "ubtrfs/status.h"

namespace ubtrfs::fs {

// Every libarchive call the archive importer (import_archive.cc) makes.
#define UBTRFS_ARCHIVE_FUNCTIONS(X)                                                                        \
  X(archive_read_new) X(archive_read_free) X(archive_read_support_filter_all)                             \
  X(archive_read_support_format_tar) X(archive_read_support_format_gnutar) X(archive_read_open_fd)        \
  X(archive_read_open_filename) X(archive_read_next_header) X(archive_read_data_block) X(archive_errno)   \
  X(archive_error_string) X(archive_entry_pathname) X(archive_entry_mode) X(archive_entry_uid)            \
  X(archive_entry_gid) X(archive_entry_mtime) X(archive_entry_mtime_nsec) X(archive_entry_atime_is_set)   \
  X(archive_entry_atime) X(archive_entry_atime_nsec) X(archive_entry_ctime_is_set) X(archive_entry_ctime) \
  X(archive_entry_ctime_nsec) X(archive_entry_hardlink) X(archive_entry_symlink)                          \
  X(archive_entry_rdevmajor) X(archive_entry_rdevminor) X(archive_entry_size_is_set) X(archive_entry_size) \
  X(archive_entry_xattr_reset) X(archive_entry_xattr_next) X(archive_entry_acl_reset)                     \
  X(archive_entry_acl_next)

struct ArchiveLibrary {
#define UBTRFS_ARCHIVE_POINTER(f) decltype(&::f) f = nullptr;
  UBTRFS_ARCHIVE_FUNCTIONS(UBTRFS_ARCHIVE_POINTER)
#undef UBTRFS_ARCHIVE_POINTER
};

// Loads libarchive once per process (thread-safe); later calls return the
// same table, or the same error (EOPNOTSUPP, naming the library and the
// Debian package that has it).
Result<const ArchiveLibrary*> LoadArchiveLibrary();

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_ARCHIVE_LIBRARY_H_
