// What a directory entry's name may be when the read path hands it on.
//
// Images are untrusted: a stored name is whatever bytes the image holds. A
// name that a POSIX program would take apart ('/' inside, NUL inside, "." or
// ".."), or a second entry with an earlier entry's name, lets a copy out of
// the image write outside its destination (issue 23), so the read path never
// yields one: ReadDir leaves such entries out and says why (SkippedEntry).
#ifndef UBTRFS_FS_DIR_NAMES_H_
#define UBTRFS_FS_DIR_NAMES_H_

#include <string_view>
#include <vector>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::fsimpl {

inline constexpr size_t kNameMax = 255;  // bytes, as Linux's NAME_MAX

// Why `name` cannot be a directory entry's name, or nullptr when it can.
const char* InvalidNameReason(std::string_view name);

// Removes from `entries` (in index order) every entry with an invalid name
// and every entry whose name an earlier entry already has, appending each
// to `skipped` when it is not null. Linear time: one pass with a hash table
// of the names (a readdir of a million entries pays a few milliseconds).
void FilterDirEntries(std::vector<DirEntry>* entries, std::vector<SkippedEntry>* skipped);

// Escapes a stored name for a message: printable ASCII as it is, every other
// byte as \xNN, so '/', NUL and terminal control bytes are visible.
std::string PrintableName(std::string_view name);

}  // namespace ubtrfs::fsimpl

#endif  // UBTRFS_FS_DIR_NAMES_H_
