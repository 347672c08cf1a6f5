// mkfs --rootdir of a directory with its subvolumes and inode flags
// (rootdir_import.cc); Mkfs (fs/mkfs.cc) calls it.
#ifndef UBTRFS_FS_ROOTDIR_IMPORT_H_
#define UBTRFS_FS_ROOTDIR_IMPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ubtrfs/filesystem.h"
#include "ubtrfs/import.h"

namespace ubtrfs::fs {

// A --subvol: the directory below --rootdir that becomes a subvolume.
struct SubvolSpec {
  std::string rel;  // canonical, relative to the canonical rootdir
  bool read_only = false;
  bool is_default = false;
};

// --subvol values as mkfs.btrfs: an optional rw:, ro:, default: or
// default-ro: prefix (anything else before a colon is part of the path; a
// leading ./ keeps a path like "ro:x" whole), the directory relative to the
// canonical rootdir `root`; each an existing directory below it, none twice,
// one default. nullopt and *err on a bad value.
std::optional<std::vector<SubvolSpec>> ParseSubvols(const std::vector<std::string>& args, const std::string& root,
                                                    std::string* err);

// --inode-flags values: FLAG[,FLAG...]:PATH with nodatacow and nodatasum,
// PATH relative to the rootdir (the rootdir itself allowed), none twice;
// the result maps canonical relative paths to kImport* bits.
std::optional<std::map<std::string, uint32_t>> ParseInodeFlags(const std::vector<std::string>& args,
                                                               const std::string& root, std::string* err);

// Imports the canonical rootdir `root` into the image's top with its
// --subvol directories as subvolumes, then sets their read-only flags and
// the default subvolume.
Status ImportRootdir(Filesystem& fs, const std::string& root, const std::vector<SubvolSpec>& subvols,
                     const std::map<std::string, uint32_t>& flags,
                     const std::optional<std::pair<uint32_t, uint32_t>>& owner, const std::optional<Time>& max_time,
                     const std::function<void(const ImportStats&)>& progress, ImportStats* stats,
                     bool reflink = false);

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_ROOTDIR_IMPORT_H_
